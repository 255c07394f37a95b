-- A placeholder: migration numbers 20 and 21 belong to other parts of issue 16, merged
-- separately; this branch needs them present (versions run 1..n without gaps). On merge the
-- real file of that number replaces this one.
SELECT 1;
