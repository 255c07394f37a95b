-- name: events_listen
-- Hear committed chat and operator events (the triggers of migrations 0016 and 0024; a chat
-- event names its employee), to place them, and placed ones, to wake the streams reading
-- them (`operator` or `chat:<employee>`).
LISTEN eventos_chat_events; LISTEN eventos_operator_events; LISTEN eventos_events_placed;
