-- Takes the user's row lock, which every change to the user's work holds first.
SELECT username FROM users WHERE username = $1 FOR NO KEY UPDATE;
