-- Whether the tokens table exists yet: a database the migrations have not reached has none,
-- and so holds no token.
SELECT to_regclass('tokens') IS NOT NULL AS exists;
