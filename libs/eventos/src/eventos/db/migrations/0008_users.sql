-- Users and audiences (issue 11).
SELECT 1;
