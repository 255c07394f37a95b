"""Employees and generations, database side (SPEC §3, I2): apply, start, stop, resume and
reset (`lifecycle`), the owner intents those actions commit for Temporal (`intents`), and
deleting an employee (`deletion`). The Temporal side of the same actions is `eventos.control`."""
