"""A conversation's durable state (SPEC §8 step 5, I7): its context and the consuming save
that settles a turn's inputs and writes its outbox rows (`turns`), and its transcript as rows out of
Temporal's payloads (`transcripts`)."""
