-- name: user_insert
-- A new user (nothing when the name is taken).
INSERT INTO users (name, thread, token_sha256)
VALUES (%(name)s, %(thread)s, %(token_sha256)s)
ON CONFLICT (name) DO NOTHING
RETURNING name, created_at;

-- name: user_list
-- Every user, by name.
SELECT name, created_at FROM users ORDER BY name;

-- name: user_delete
-- Remove a user: its token stops working; its history stays (adding the name again reaches it).
DELETE FROM users WHERE name = %(name)s RETURNING name;

-- name: user_by_token
-- The user holding a token, looked up by the token's sha256.
SELECT name, token_sha256 FROM users WHERE token_sha256 = %(token_sha256)s;
