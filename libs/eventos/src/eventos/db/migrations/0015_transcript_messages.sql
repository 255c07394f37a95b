-- A conversation's transcript as rows, one per message, appended by the consuming save (issue
-- 12 point 4): a turn no longer reads and rewrites the whole transcript, and its LLM steps
-- read the stored part from here by (conversation, message count) instead of carrying it in
-- Temporal payloads. `start_bytes` is the JSON size of every message before this one since
-- the conversation began (monotonic), so "the newest messages within B bytes" is one index
-- range; the stored transcript keeps within 1 MB by deleting its oldest rows (I7).
CREATE TABLE transcript_messages (
    employee     text NOT NULL,
    generation   integer NOT NULL,
    agent        text NOT NULL,
    thread       text NOT NULL,
    n            bigint NOT NULL CHECK (n > 0),
    start_bytes  bigint NOT NULL,
    bytes        integer NOT NULL,
    message      jsonb NOT NULL,
    turn_id      text,
    PRIMARY KEY (employee, generation, agent, thread, n),
    FOREIGN KEY (employee, generation, agent, thread)
        REFERENCES conversations (employee, generation, agent, thread) ON DELETE CASCADE
);
CREATE INDEX transcript_messages_bytes
    ON transcript_messages (employee, generation, agent, thread, start_bytes);
-- `transcript_n`: messages appended so far (the transcript's version); `transcript_total`:
-- their bytes (the next message's start_bytes).
ALTER TABLE conversations ADD COLUMN transcript_n bigint NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN transcript_total bigint NOT NULL DEFAULT 0;
INSERT INTO transcript_messages (employee, generation, agent, thread, n, start_bytes, bytes,
    message)
SELECT c.employee, c.generation, c.agent, c.thread, m.n,
    coalesce(sum(length(m.doc::text)) OVER (PARTITION BY c.employee, c.generation, c.agent,
        c.thread ORDER BY m.n ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0),
    length(m.doc::text), m.doc
FROM conversations c, jsonb_array_elements(c.transcript) WITH ORDINALITY AS m (doc, n);
UPDATE conversations c
SET transcript_n = t.n, transcript_total = t.start_bytes + t.bytes
FROM (SELECT DISTINCT ON (employee, generation, agent, thread) *
      FROM transcript_messages ORDER BY employee, generation, agent, thread, n DESC) t
WHERE (c.employee, c.generation, c.agent, c.thread) = (t.employee, t.generation, t.agent, t.thread);
ALTER TABLE conversations DROP COLUMN transcript;
ALTER TABLE conversations DROP COLUMN transcript_bytes;
