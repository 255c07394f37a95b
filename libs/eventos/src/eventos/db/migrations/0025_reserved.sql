-- A placeholder: migration numbers 25 and 26 belong to other branches, merged separately;
-- this branch needs them present (versions run 1..n without gaps). On merge the real file of
-- that number replaces this one.
SELECT 1;
