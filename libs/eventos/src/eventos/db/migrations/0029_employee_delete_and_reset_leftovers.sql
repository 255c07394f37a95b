-- Delete an employee (issue 26 point 6; docs/operations.md "Deleting an employee"). The row
-- stays as a tombstone: every history table (chat messages, turns, transcripts, timeline,
-- budgets, intents, generations) names the employee and keeps its rows for their retention;
-- lists, lookups and lifecycle actions skip a deleted row; applying the name again revives it
-- as a fresh employee whose first Start takes the number after the old generations.
ALTER TABLE employees ADD COLUMN deleted_at timestamptz;

-- Reset settles everything it retires (issue 26 point 5): a Reset now turns the retired
-- generation's deliveries that were already signalled to a conversation `dead(reset)` too.
-- Those earlier Resets left `delivered` for ever are settled here once, the same way, with the
-- owner's messages among them (their conversations were cancelled long ago: no turn will
-- consume them; a replay still can).
WITH leftover AS (
    UPDATE bus_deliveries d SET status = 'dead', reason = 'reset', updated_at = now()
    FROM bus_streams s
    JOIN generations g ON g.employee = s.employee AND g.generation = s.generation
    WHERE d.stream_key = s.stream_key AND g.state = 'retired'
      AND d.status IN ('pending', 'held', 'delivered')
    RETURNING d.ingress_id, s.employee
)
UPDATE chat_messages m SET status = 'dead'
FROM leftover l
WHERE m.employee = l.employee AND m.ingress_id = l.ingress_id
  AND m.status IN ('queued', 'delivered');
