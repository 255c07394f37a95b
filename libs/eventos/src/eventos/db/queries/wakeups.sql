-- name: chat_events_listen
-- Hear every committed chat event (the trigger of migration 0016 names its employee).
LISTEN eventos_chat_events;
