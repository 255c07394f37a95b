"""Messages between employees (SPEC §10, I8): the inbox records of messages, tasks and task
results (`ipc`), and the storm guards that check every wake between employees for hops, cycles
and rate (`storm`)."""
