"""The outbox (SPEC §11): a send delivered once or said `unknown` (`egress`), held sends and
the owner's decisions on them (`approvals`), and the keys that seal recipients at rest (`keys`)."""
