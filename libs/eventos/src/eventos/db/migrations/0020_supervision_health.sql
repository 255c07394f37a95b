-- A placeholder for the supervision branch's migration of this name (issue 16 point 8), so
-- this branch's migrations run 1..n without a gap. On merge, the supervision branch's file
-- replaces this one whole (take theirs).
SELECT 1;
