-- A placeholder: migration numbers 20 to 23 belong to the parts of issue 16, merged
-- separately; this branch needs them present (versions run 1..n without gaps). On merge the
-- real file of that number replaces this one.
SELECT 1;
