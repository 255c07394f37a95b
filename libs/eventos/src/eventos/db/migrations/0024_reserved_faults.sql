-- A placeholder: migration numbers 23 and 24 belong to the console and faults helpers of issue
-- 16, merged separately; this branch needs them present (versions run 1..n without gaps). On
-- merge the real file of that number replaces this one.
SELECT 1;
