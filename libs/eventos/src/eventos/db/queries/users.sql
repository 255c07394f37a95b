-- name: user_insert
-- A new user (nothing when the name is taken).
INSERT INTO users (id, name, thread, token_sha256, class, daily_usd)
VALUES (%(id)s, %(name)s, %(thread)s, %(token_sha256)s, %(class)s, %(daily_usd)s)
ON CONFLICT (name) DO NOTHING
RETURNING name, created_at;

-- name: user_list
-- Every user, by name.
SELECT id, name, class, daily_usd, created_at FROM users ORDER BY name;

-- name: user_delete
-- Remove a user: its token stops working; its history stays (a new user of the same name
-- starts a new conversation).
DELETE FROM users WHERE name = %(name)s RETURNING name;

-- name: user_by_token
-- The user holding a token, looked up by the token's sha256.
SELECT id, name, thread, class, daily_usd, created_at, token_sha256 FROM users
WHERE token_sha256 = %(token_sha256)s;
