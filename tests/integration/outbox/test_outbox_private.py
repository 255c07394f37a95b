"""The outbox recipient is sealed at rest (SPEC §11): the row holds no plaintext, egress opens it
only to send (and the send reaches that recipient), a moved, tampered or unknown-key ciphertext
fails its row clearly, and migration 0009 leaves no plaintext behind."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool
from test_router import query
from test_turns import Instance, instance  # noqa: F401 (`instance` is a fixture)

from eventos import names
from eventos.db import Conn, connect
from eventos.db.migrate import migrate, shipped_migrations
from eventos.db.sql import Q
from eventos.outbox import egress
from eventos.outbox.keys import OutboxKeys, Sealed, new_key_entry
from eventos.settings import DatabaseSettings
from eventos.testing import wait_for
from eventos.testing.plugin import PostgresForTests

SESSION = "mobile-7731-zebra"


async def test_a_reply_row_holds_no_plaintext_recipient_and_reaches_its_session(
    instance: Instance,  # noqa: F811 (the fixture imported above)
    outbox_keys: OutboxKeys,
) -> None:
    r = await instance.api.post(f"/v1/employees/{instance.name}/chat", json={
        "client_message_id": uuid.uuid4().hex, "text": "hello", "session": SESSION})  # fmt: skip
    assert r.status_code == 202, r.text

    async def replied() -> list[dict[str, Any]]:
        q = "SELECT session, text FROM chat_events WHERE employee = %s AND kind = 'reply'"
        return await query(instance.pool, q, instance.name)

    [reply] = await wait_for(replied, timeout=30, what="the reply")
    assert reply == {"session": SESSION, "text": "[local] you said: hello"}
    q = ("SELECT recipient, recipient_key_id, status FROM outbound_messages "
         "WHERE employee = %s")  # fmt: skip
    [row] = await query(instance.pool, q, instance.name)
    raw = bytes(row["recipient"])
    assert SESSION.encode() not in raw and b"7731" not in raw
    assert (row["recipient_key_id"], row["status"]) == ("test-1", "sent")
    assert outbox_keys.key_ids == ("test-1",)


async def queue_row(conn: Conn, sealed: Sealed | None, *, key: str | None = None) -> int:
    """An owner-chat reply in the outbox, with `sealed` stored as its recipient."""
    key = key or uuid.uuid4().hex
    cur = await conn.execute(Q["outbound_insert"], {
        "key": key, "employee": "support", "thread": "main", "turn_id": f"turn-{key}",
        "account": None, "recipient": sealed.blob if sealed else None,
        "recipient_key_id": sealed.key_id if sealed else None, "kind": "chat", "class": 1,
        "body": f"reply {key}", "audience": None,
    })  # fmt: skip
    return int((await cur.fetchone() or {})["id"])


async def reply_sessions(conn: Conn) -> dict[int, str]:
    cur = await conn.execute("SELECT outbound_id, session FROM chat_events WHERE kind = 'reply'")
    return {int(r["outbound_id"]): str(r["session"]) for r in await cur.fetchall()}


async def test_egress_opens_the_recipient_only_on_its_own_row_with_a_listed_key(
    pool: AsyncConnectionPool[Conn], outbox_keys: OutboxKeys
) -> None:
    async with pool.connection() as conn:
        good = await queue_row(conn, outbox_keys.seal(SESSION, employee="support",
                                                      idempotency_key="k-good"), key="k-good")  # fmt: skip
        owner = await queue_row(conn, None)
        cur = await conn.execute("SELECT recipient, recipient_key_id FROM outbound_messages "
                                 "WHERE id = %s", (good,))  # fmt: skip
        stored = await cur.fetchone() or {}
        moved = await queue_row(
            conn, Sealed(stored["recipient_key_id"], bytes(stored["recipient"]))
        )
        flipped = bytearray(stored["recipient"])
        flipped[20] ^= 0x40
        tampered = await queue_row(conn, Sealed("test-1", bytes(flipped)))
        other_key = OutboxKeys.parse(new_key_entry("retired"))
        retired = await queue_row(conn, other_key.seal(SESSION, employee="support",
                                                       idempotency_key="k-ret"), key="k-ret")  # fmt: skip

        outcomes = {i: await egress.send_chat(conn, i, outbox_keys)
                    for i in (good, owner, moved, tampered, retired)}  # fmt: skip
        assert outcomes == {good: "sent", owner: "sent", moved: "failed", tampered: "failed",
                            retired: "failed"}  # fmt: skip
        assert await reply_sessions(conn) == {good: SESSION, owner: "owner"}
        # A failed row is settled: a retried send changes nothing and sends nothing.
        assert await egress.send_chat(conn, moved, outbox_keys) == "failed"
        cur = await conn.execute("SELECT ref, detail FROM attention_items WHERE kind = %s "
                                 "ORDER BY ref", (names.ATTENTION_RECIPIENT_UNREADABLE,))  # fmt: skip
        items = {r["ref"]: r["detail"] for r in await cur.fetchall()}
    assert set(items) == {f"outbox#{i}" for i in (moved, tampered, retired)}
    assert "altered or belongs to another row" in items[f"outbox#{moved}"]
    assert "altered or belongs to another row" in items[f"outbox#{tampered}"]
    assert "key 'retired', which EVENTOS_OUTBOX_KEYS does not list" in items[f"outbox#{retired}"]
    assert all(SESSION not in d for d in items.values())


@pytest.fixture
async def before_0009(postgres_server: PostgresForTests) -> Any:
    """A database migrated up to 0008 (as an instance was before this change)."""
    name = f"pre0009_{uuid.uuid4().hex[:8]}"
    postgres_server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    settings = DatabaseSettings(url=postgres_server.url(name))
    conn = await connect(settings, autocommit=True)
    async with conn:
        await conn.execute(Q["migration_table_create"])
        for m in shipped_migrations():
            if m.version < 9:
                await conn.execute(m.text.encode())
                await conn.execute(Q["migration_record"], {"version": m.version, "name": m.name,
                                                           "checksum": m.checksum})  # fmt: skip
    yield settings
    postgres_server.execute(
        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


async def test_migration_0009_leaves_no_plaintext_recipient(before_0009: DatabaseSettings) -> None:
    conn = await connect(before_0009, autocommit=True)
    async with conn:
        rows = [("sent", "user-a"), ("queued", "owner"), ("queued", "user-b"), ("unknown", "user-c"),
                ("queued", None)]  # fmt: skip
        for i, (status, recipient) in enumerate(rows):
            await conn.execute(
                "INSERT INTO outbound_messages (idempotency_key, employee, thread, turn_id, "
                "recipient, kind, class, body, status) VALUES (%s, 'support', 'main', %s, %s, "
                "'chat', 1, 'hi', %s)", (f"k{i}", f"turn-{i}", recipient, status),
            )  # fmt: skip
        applied = await migrate(conn)
        assert applied[0].version == 9  # and those after it
        cur = await conn.execute("SELECT idempotency_key, recipient, recipient_key_id, status "
                                 "FROM outbound_messages ORDER BY idempotency_key")  # fmt: skip
        after = await cur.fetchall()
    assert [(r["recipient"], r["recipient_key_id"]) for r in after] == [(None, None)] * 5
    # A reply still to be shown to another session than `owner` is expired, never misdelivered.
    assert [r["status"] for r in after] == ["sent", "queued", "expired", "expired", "queued"]
