-- The web console's reads (issue 16), each a bounded page: an employee's turns newest first, a
-- turn's tool calls, a chat session's messages newest first and a turn's reply.
CREATE INDEX turns_employee_started ON turns (employee, started_at DESC, id DESC);
CREATE INDEX tool_calls_turn ON tool_calls (turn_id);
CREATE INDEX chat_messages_session ON chat_messages (employee, audience, session, id);
CREATE INDEX chat_events_turn ON chat_events (turn_id);
