-- name: drain_generation_flags
-- A generation's frozen flags (its snapshot's `spec.flags`) and its control state.
SELECT state, pause_reason, spec -> 'spec' -> 'flags' AS flags
FROM generations WHERE employee = %(employee)s AND generation = %(generation)s;

-- name: drain_streams_of
-- The drained generation's streams, to be created again in the new one.
SELECT stream_key, lane, thread FROM bus_streams
WHERE employee = %(employee)s AND generation = %(generation)s ORDER BY stream_key;

-- name: drain_stream_create
-- The new generation's stream of one drained stream, held until the generation runs.
INSERT INTO bus_streams (stream_key, employee, generation, lane, thread, hold_reason, entity_id)
VALUES (%(stream_key)s, %(employee)s, %(generation)s, %(lane)s, %(thread)s, 'starting',
        %(entity_id)s)
ON CONFLICT (stream_key) DO NOTHING;

-- name: drain_deliveries_move
-- Every input of the drained stream that no turn consumed (pending, held, or signalled to the
-- stopped entity) moves to the new stream, pending again, in its order, numbered 1..n (the new
-- stream is empty: the router reaches it only after this transaction); each keeps its row, so
-- it is consumed once. Its subscription becomes the new generation's of the same trigger.
UPDATE bus_deliveries d
SET stream_key = %(to_key)s, seq = m.k, status = 'pending', updated_at = now(),
    subscription_id = coalesce(m.sub, d.subscription_id)
FROM (
    SELECT o.id, row_number() OVER (ORDER BY o.seq) AS k,
           (SELECT n.id FROM bus_subscriptions s JOIN bus_subscriptions n
                ON n.employee = s.employee AND n.trigger_name = s.trigger_name
            WHERE s.id = o.subscription_id AND n.generation = %(generation)s) AS sub
    FROM bus_deliveries o
    WHERE o.stream_key = %(from_key)s AND o.status IN ('pending', 'held', 'delivered')
) m
WHERE d.id = m.id
RETURNING d.seq;

-- name: drain_stream_settle
-- The new stream numbers its next input after the moved ones and is ordered for the relay.
UPDATE bus_streams s
SET next_seq = %(moved)s + 1, top_pending_class = p.top_class, oldest_pending_at = p.oldest,
    updated_at = now()
FROM (
    SELECT min(class) AS top_class, min(created_at) AS oldest
    FROM bus_deliveries WHERE stream_key = %(stream_key)s AND status = 'pending'
) p
WHERE s.stream_key = %(stream_key)s;

-- name: drain_conversations_copy
-- The conversation store carries over: each conversation of the drained generation, with its
-- counters, under the new generation's stream of the same lane and thread.
INSERT INTO conversations (employee, generation, agent, thread, stream_key, next_turn,
                           transcript_n, transcript_total)
SELECT c.employee, %(to)s, c.agent, c.thread, n.stream_key, c.next_turn, c.transcript_n,
       c.transcript_total
FROM conversations c
JOIN bus_streams o ON o.stream_key = c.stream_key
JOIN bus_streams n ON n.employee = o.employee AND n.generation = %(to)s AND n.lane = o.lane
                  AND n.thread = o.thread
WHERE c.employee = %(employee)s AND c.generation = %(from)s;

-- name: drain_transcripts_copy
-- And each transcript, message by message.
INSERT INTO transcript_messages (employee, generation, agent, thread, n, start_bytes, bytes,
                                 message, turn_id)
SELECT employee, %(to)s, agent, thread, n, start_bytes, bytes, message, turn_id
FROM transcript_messages WHERE employee = %(employee)s AND generation = %(from)s;

-- name: drain_alarms_move
-- The drained generation's scheduled alarms fire in the new one.
UPDATE alarms SET generation = %(to)s
WHERE employee = %(employee)s AND generation = %(from)s AND status = 'scheduled';

-- name: intent_wait
-- An intent that cannot apply yet, by design (a drain waiting for its turns to stop): try again
-- soon without counting an attempt.
UPDATE intents SET outcome = %(outcome)s,
    next_attempt_at = now() + make_interval(secs => %(delay_s)s)
WHERE id = %(id)s;
