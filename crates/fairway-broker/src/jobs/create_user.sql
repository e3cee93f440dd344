-- Registers a user on first submission.
INSERT INTO users (username) VALUES ($1) ON CONFLICT (username) DO NOTHING;
