-- The console's navigation counts the outbox rows whose fate is `unknown` (issue 26 point 4;
-- docs/console.md): they are few among many sent, so a partial index finds them.
CREATE INDEX outbound_messages_unknown ON outbound_messages (id) WHERE status = 'unknown';
