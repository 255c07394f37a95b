"""The bus and what writes to it (SPEC §5, §6.1, §6.3): the inbox append (`inbox`), the
CloudEvents envelope, webhook verification, bodies by reference (`blobs`), JSON PostgreSQL can
store, the driver-side client with its durable outbox, and the retention of settled rows."""
