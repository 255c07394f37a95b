-- Hostile input (issue 11): bodies in the database, dedupe keys, driver credentials.
SELECT 1;
