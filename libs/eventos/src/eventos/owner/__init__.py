"""The owner and the users (SPEC §6.2, §17): who may read and do what (`users`, audiences),
owner chat committed with its inbox row (`chat`), and the chat and operator event streams: their
sequencer (`event_positions`) and their wake-ups from PostgreSQL (`wakeups`)."""
