"""The transcript as rows (eventos.conversations.transcripts): appended by the consuming save, read by an
LLM step by version within I7's bound, pruned past 1 MB, and migrated from the jsonb column."""

from __future__ import annotations

import json
from dataclasses import asdict

from psycopg import sql

from eventos import names
from eventos.contracts import ChatMessage, LlmStepInput, ModelRef, TranscriptRef, message_size
from eventos.conversations import transcripts
from eventos.db import Conn, connect
from eventos.db.migrate import migrate, shipped_migrations
from eventos.db.sql import Q
from eventos.settings import DatabaseSettings
from eventos.testing.plugin import PostgresForTests

EMPLOYEE = "scribe"
REF = TranscriptRef(1, "front", "main", 0, 0)
CONVERSATION = """
INSERT INTO employees (name, spec, spec_sha256) VALUES ('scribe', '{}', 'x');
INSERT INTO generations (employee, generation, state, spec, spec_sha256)
VALUES ('scribe', 1, 'running', '{}', 'x');
INSERT INTO bus_streams (stream_key, employee, generation, lane, thread, entity_id)
VALUES ('scribe/1/talk/main', 'scribe', 1, 'talk', 'main', 'conv-scribe');
INSERT INTO conversations (employee, generation, agent, thread, stream_key)
VALUES ('scribe', 1, 'front', 'main', 'scribe/1/talk/main');
"""


def msg(role: str, n: int, size: int = 100) -> ChatMessage:
    return ChatMessage(role, f"{n}:" + "x" * size)


async def conversation(conn: Conn) -> None:
    async with conn.transaction():
        await conn.execute(CONVERSATION)


async def append(conn: Conn, ref: TranscriptRef, messages: list[ChatMessage]) -> TranscriptRef:
    async with conn.transaction():
        return await transcripts.append(conn, EMPLOYEE, ref, "turn-x", messages)


async def test_a_version_reads_the_newest_messages_within_the_limit(conn: Conn) -> None:
    await conversation(conn)
    messages = [msg("user", n) for n in range(100)]
    ref = await append(conn, REF, messages)
    assert (ref.through, ref.through_bytes) == (100, sum(map(message_size, messages)))
    read = transcripts.RecentMessages().read
    kept = await read(conn, EMPLOYEE, ref, 2000)
    assert kept == messages[-len(kept) :] and 0 < len(kept) < 100
    assert sum(map(message_size, kept)) <= 2000
    assert sum(map(message_size, messages[-len(kept) - 1 :])) > 2000  # the newest that fit
    assert await read(conn, EMPLOYEE, ref) == messages


async def test_a_worker_reads_only_new_rows_and_every_version_reads_the_same(conn: Conn) -> None:
    await conversation(conn)
    cache = transcripts.RecentMessages(size=1)
    first = await append(conn, REF, [msg("user", n, 60_000) for n in range(5)])
    assert len(await cache.read(conn, EMPLOYEE, first)) == 5
    second = await append(conn, first, [msg("assistant", n, 60_000) for n in range(5)])
    newest = await cache.read(conn, EMPLOYEE, second)  # extends its window by the new rows
    fresh = await transcripts.RecentMessages().read(conn, EMPLOYEE, second)
    assert newest == fresh and newest[-1] == msg("assistant", 4, 60_000)
    assert sum(map(message_size, newest)) <= names.TRANSCRIPT_MAX_BYTES
    assert len(newest) == 6  # six of 60 KB fit in 384 KiB, seven do not
    # A retried step of the earlier version reads what it read before, and leaves the window.
    assert len(await cache.read(conn, EMPLOYEE, first)) == 5
    assert await cache.read(conn, EMPLOYEE, second) == fresh
    # Rows are never rewritten, so a window is not read again (a change behind its back shows
    # it); a worker that has not seen the conversation reads the rows.
    async with conn.transaction():
        await conn.execute("UPDATE transcript_messages SET message = message || '{\"content\": "
                           "\"changed\"}' WHERE n = 10")  # fmt: skip
    assert (await cache.read(conn, EMPLOYEE, second))[-1] == msg("assistant", 4, 60_000)
    other = TranscriptRef(1, "front", "main", 10, second.through_bytes)
    assert (await transcripts.RecentMessages().read(conn, EMPLOYEE, other))[-1].content == "changed"


async def test_a_read_never_starts_with_an_orphaned_tool_result(conn: Conn) -> None:
    await conversation(conn)
    messages = [msg("user", 0), msg("assistant", 1), msg("tool", 2), msg("tool", 3),
                msg("assistant", 4)]  # fmt: skip
    ref = await append(conn, REF, messages)
    per = message_size(messages[-1])
    # The newest three would start at a tool result.
    kept = await transcripts.RecentMessages().read(conn, EMPLOYEE, ref, per * 3)
    assert [m.role for m in kept] == ["assistant"]


async def test_the_stored_transcript_keeps_within_1_mb(conn: Conn) -> None:
    await conversation(conn)
    ref = REF
    for turn in range(14):  # 14 turns of about 100 KB each
        ref = await append(conn, ref, [msg("user", turn, 50_000), msg("assistant", turn, 50_000)])
    cur = await conn.execute("SELECT n, bytes, start_bytes FROM transcript_messages ORDER BY n")
    rows = await cur.fetchall()
    assert rows[-1]["n"] == 28 and rows[0]["n"] > 1  # the oldest went
    assert sum(r["bytes"] for r in rows) <= transcripts.STORED_MAX_BYTES
    assert sum(r["bytes"] for r in rows) + 100_100 > transcripts.STORED_MAX_BYTES  # no more
    assert [r["n"] for r in rows] == list(range(rows[0]["n"], 29))  # a suffix, no gaps


async def test_a_step_reads_its_stored_transcript_after_the_system_prompt(conn: Conn) -> None:
    await conversation(conn)
    ref = await append(conn, REF, [msg("user", 0), msg("assistant", 1)])
    system, new = ChatMessage("system", "You help."), msg("user", 2)
    step = LlmStepInput(EMPLOYEE, "turn-y", 0, 2, ModelRef("local", "scripted"), [system, new],
                        transcript=ref)  # fmt: skip
    resolve = transcripts.RecentMessages().resolve
    resolved = await resolve(conn, step)
    assert resolved.messages == [system, msg("user", 0), msg("assistant", 1), new]
    assert resolved.transcript is None
    # A step of a run that loaded its transcript inline (before the rows) is left alone.
    inline = LlmStepInput(EMPLOYEE, "turn-z", 0, 2, ModelRef("local", "scripted"), [system, new])
    assert await resolve(conn, inline) == inline
    # Over I7's bound the oldest stored messages give way, never the prompt or the turn's own.
    big = [msg("user", n, 100_000) for n in range(5)]
    ref = await append(conn, ref, big)
    resolved = await resolve(conn, LlmStepInput(
        EMPLOYEE, "turn-w", 0, 2, ModelRef("local", "scripted"), [system, new], transcript=ref))  # fmt: skip
    assert resolved.messages[0] == system and resolved.messages[-1] == new
    assert sum(len(json.dumps(asdict(m))) for m in resolved.messages) <= names.TRANSCRIPT_MAX_BYTES
    assert resolved.messages[-2] == big[-1]


async def test_the_migration_moves_a_jsonb_transcript_into_rows(
    postgres_server: PostgresForTests,
) -> None:
    name = "t_transcript_migration"
    ident = sql.Identifier(name)
    postgres_server.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
    postgres_server.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    conn = await connect(DatabaseSettings(url=postgres_server.url(name)))
    try:
        async with conn:
            shipped = shipped_migrations()
            (rows_at,) = [m.version for m in shipped if m.name == "transcript_messages"]
            before = [m for m in shipped if m.version < rows_at]
            for m in before:
                await conn.execute(m.text.encode())
            await conn.execute(CONVERSATION)
            old = [asdict(msg("user", 0)), asdict(msg("assistant", 1)), {"role": "user",
                   "content": "ünïcode"}]  # fmt: skip
            await conn.execute("UPDATE conversations SET transcript = %s",
                               [json.dumps(old)])  # fmt: skip
            await conn.execute(Q["migration_table_create"])
            for m in before:  # as a release before the rows left them
                record = {"version": m.version, "name": m.name, "checksum": m.checksum}
                await conn.execute(Q["migration_record"], record)
            await conn.commit()
            applied = await migrate(conn)
            assert [m.version for m in applied] == list(range(rows_at, len(shipped) + 1))
            cur = await conn.execute("SELECT transcript_n, transcript_total FROM conversations")
            head = await cur.fetchone()
            cur = await conn.execute("SELECT n, start_bytes, bytes, message "
                                     "FROM transcript_messages ORDER BY n")  # fmt: skip
            rows = await cur.fetchall()
            assert [r["message"] for r in rows] == old and [r["n"] for r in rows] == [1, 2, 3]
            assert [r["start_bytes"] for r in rows] == [0, rows[0]["bytes"],
                                                        rows[0]["bytes"] + rows[1]["bytes"]]  # fmt: skip
            assert head == {"transcript_n": 3,
                            "transcript_total": sum(r["bytes"] for r in rows)}  # fmt: skip
            ref = TranscriptRef(1, "front", "main", head["transcript_n"], head["transcript_total"])
            read = await transcripts.RecentMessages().read(conn, EMPLOYEE, ref)
            assert [asdict(m) for m in read][-1]["content"] == "ünïcode"
    finally:
        postgres_server.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
