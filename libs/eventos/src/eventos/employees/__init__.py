"""Employees and generations, database side (SPEC §3, I2): apply, start, stop, resume and
reset (`lifecycle`), and the owner intents those actions commit for Temporal (`intents`). The
Temporal side of the same actions is `eventos.control`."""
