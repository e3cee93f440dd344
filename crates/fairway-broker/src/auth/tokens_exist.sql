-- Whether auth is on for every broker of the database: any token, revoked or not.
SELECT EXISTS (SELECT 1 FROM tokens);
