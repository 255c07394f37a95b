-- Delete an employee (issue 26 point 6; docs/operations.md "Deleting an employee"). The row
-- stays as a tombstone: every history table (chat messages, turns, transcripts, timeline,
-- budgets, intents, generations) names the employee and keeps its rows for their retention;
-- lists, lookups and lifecycle actions skip a deleted row; applying the name again revives it
-- as a fresh employee whose first Start takes the number after the old generations.
ALTER TABLE employees ADD COLUMN deleted_at timestamptz;
