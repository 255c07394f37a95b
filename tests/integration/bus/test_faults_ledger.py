"""The fault run's ledger (bench/faults_ledger.py) names what does not add up: an acknowledged
event missing from the inbox or in it twice, an effect that reached its server twice or without
a record, a 2xx while PostgreSQL was down, a non-2xx while Temporal was down. The fault run
itself (tests/e2e/test_faults.py) is green only if these lines stay empty."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from eventos.bus.inbox import IngressRecord, append
from eventos.db import Conn

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from faults_book import CHAT, TELEGRAM, WEBHOOK, Acked, Attempt, Book
from faults_instance import POSTGRES, TEMPORAL
from faults_ledger import Receivers, account, owner_behind
from faults_schedule import LOSE, Done, Fault

from eventos.settings import DatabaseSettings


def record(source: str, key: str) -> IngressRecord:
    envelope = {"id": key, "data": {"tag": key}}
    return IngressRecord(source, key, "fx", key, envelope, 40)


async def test_lost_and_doubled_events_are_named(conn: Conn, db_settings: DatabaseSettings) -> None:
    await append(conn, [record("webhook:a", "fx-webhook-1"), record("webhook:a", "fx-webhook-2")])
    # A second row of the same event, as a broken dedupe would leave it.
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO bus_ingress (source_key, dedupe_key, type, envelope, size, "
            "chain_id, status) SELECT source_key, dedupe_key, type, envelope, size, "
            "chain_id, 'no_consumer' FROM bus_ingress WHERE dedupe_key = 'fx-webhook-2'"
        )
    await conn.execute("UPDATE bus_ingress SET status = 'no_consumer'")
    book, now = Book(), time.time()
    for n in (1, 2, 3):
        tag = f"fx-webhook-{n}"
        book.ack(Acked(WEBHOOK, tag, "webhook:a", tag, now, now))
    ledger = account(1, db_settings.url, book, Receivers([], {}), [])
    assert ledger.line("acknowledged, not in the inbox (lost)").wrong == [
        f"fx-webhook-3 (webhook:a fx-webhook-3) acknowledged at "
        f"{time.strftime('%H:%M:%S', time.localtime(now))}, not in the inbox"
    ]
    assert ledger.line("in the inbox more than once (doubled)").wrong == [
        "fx-webhook-2 (webhook:a fx-webhook-2) in the inbox 2 times"
    ]
    assert ledger.line("inbox rows never routed").wrong == [  # no router ran in this test
        "fx-webhook-1 (webhook:a fx-webhook-1) still accepted",
        "fx-webhook-2 (webhook:a fx-webhook-2) still accepted",
    ]
    assert not ledger.ok


async def test_an_effect_twice_or_unrecorded_is_named(db_settings: DatabaseSettings) -> None:
    book = Book()
    book.tools.update({"fx-chat-1", "fx-chat-2", "fx-chat-3"})
    effects = {"fx-chat-1": 0, "fx-chat-2": 2, "fx-chat-3": 1}
    ledger = account(1, db_settings.url, book, Receivers([], effects), [])
    assert ledger.line("tool effects at the server").wrong == [
        "fx-chat-2: reached the server 2 times, 0 calls []",
        "fx-chat-3: reached the server 1 times with no call recorded",
    ]
    sent = [{"text": "[local] you said: fx-telegram-1 hi"}]
    ledger = account(1, db_settings.url, book, Receivers(sent, {}), [])
    assert ledger.line("telegram replies at the customer").wrong == [
        "fx-telegram-1 reached the customer 1 times with no outbox row"
    ]


async def test_answers_during_the_outages_are_checked(db_settings: DatabaseSettings) -> None:
    t = time.time()
    pg = Done(Fault(0, LOSE, POSTGRES, 30), began=t, down=t + 1, up=t + 31, back=t + 40)
    tp = Done(Fault(0, LOSE, TEMPORAL, 120), began=t + 50, down=t + 51, up=t + 171, back=t + 180)
    book = Book()
    book.attempt(Attempt(CHAT, "fx-chat-1", t + 0.5, t + 2, "202", True))  # began before: fine
    book.attempt(Attempt(CHAT, "fx-chat-2", t + 5, t + 6, "503", False))
    book.attempt(Attempt(TELEGRAM, "fx-telegram-1", t + 5, t + 8, "confirmed", True))
    book.attempt(Attempt(WEBHOOK, "fx-webhook-1", t + 60, t + 61, "200 accepted", True))
    book.attempt(Attempt(WEBHOOK, "fx-webhook-2", t + 70, t + 71, "503", False))
    ledger = account(1, db_settings.url, book, Receivers([], {}), [pg, tp])
    (yes,) = ledger.line("2xx while PostgreSQL was down").wrong
    assert yes.startswith("telegram fx-telegram-1 answered confirmed")
    (no,) = ledger.line("not 2xx while Temporal was down").wrong
    assert no.startswith("webhook fx-webhook-2 answered 503")


async def test_an_owner_turn_behind_the_lower_classes_after_temporal_is_named(
    conn: Conn, db_settings: DatabaseSettings
) -> None:
    """fx-ops's first owner turn after Temporal came back started behind six lower-class ones;
    fx-front's owner conversation was still finishing the turn Temporal's loss caught (its
    lost step waits for a timeout), so its wave counts from that turn's end; fx-late's owner
    wrote only after the lower-class wave had started, so its wave counts from the message;
    fx-took's turn under way took the whole backlog, and its owner's next message came after
    the lower-class wave had started: counted from that message too (the fault run's ledger
    flagged it once, counting from the turn's end); fx-probe's owner wrote while Temporal was
    gone and the relay delivered it at its next probe, after the lower classes' turns already
    in Temporal had started: counted from that delivery (flagged once, counting from
    Temporal's return), while fx-ops's message, delivered before that wave, stays behind it."""
    t = time.time() - 600
    tp = Done(Fault(0, LOSE, TEMPORAL, 10), began=t + 9, down=t + 10, up=t + 20, back=t + 21)
    # In flight when Temporal went: fx-front's ends after the wave, fx-took's before it.
    turns = [("fx-front", 1, t + 5, t + 60), ("fx-took", 1, t + 5, t + 22)]
    owners = {"fx-front": t + 61, "fx-ops": t + 40, "fx-late": t + 40, "fx-took": t + 40,
              "fx-probe": t + 30}  # fmt: skip
    messages = {  # each owner's messages (made, settled, delivered after Temporal's return)
        "fx-front": [(t + 15, t + 45, None)], "fx-ops": [(t + 15, t + 45, t + 21)],
        "fx-late": [(t + 38, t + 68, None)],
        "fx-took": [(t + 8, t + 22, None), (t + 38, t + 41, None)],
        "fx-probe": [(t + 15, t + 31, t + 29)],
    }  # fmt: skip
    for employee, owner_at in owners.items():
        turns += [(employee, 2, t + 23 + k, t + 30 + k) for k in range(6)]
        turns.append((employee, 1, owner_at, owner_at + 1))
    async with conn.transaction():
        for employee, made in messages.items():
            await owner_messages(conn, employee, made)
        for n, (employee, klass, started, ended) in enumerate(turns):
            await conn.execute(
                "INSERT INTO turns (id, employee, generation, agent, thread, n, class, stream_key,"
                " status, started_at, ended_at) VALUES (%s, %s, 1, 'main', %s, %s, %s, %s, 'done',"
                " to_timestamp(%s), to_timestamp(%s))",
                (f"turn-{n}", employee, f"t{n}", n, klass, owner_stream(employee), started, ended),
            )
    with psycopg.connect(db_settings.url, row_factory=dict_row) as sync:
        (late,) = owner_behind(sync, tp)
    assert "fx-ops's first owner turn came after 6 others (counted from " in late
    assert late.endswith(": [2, 2, 2, 2, 2, 2, 1]")


def owner_stream(employee: str) -> str:
    return f"{employee}/talk/main"


async def owner_messages(
    conn: Conn, employee: str, made: list[tuple[float, float, float | None]]
) -> None:
    """Owner chat deliveries of `employee` (C1 inputs), each made and done at its times, and
    delivered by the relay (its timeline entry) at the third when given."""
    spec = "{}"
    await conn.execute("INSERT INTO employees (name, spec, spec_sha256) VALUES (%s, %s, 'x')",
                       (employee, spec))  # fmt: skip
    await conn.execute(
        "INSERT INTO generations (employee, generation, state, spec, spec_sha256) "
        "VALUES (%s, 1, 'running', %s, 'x')", (employee, spec))  # fmt: skip
    sub = await conn.execute(
        "INSERT INTO bus_subscriptions (employee, generation, trigger_name, trigger_kind, "
        "event_types, source_key, class, lane, agent, reply_capable) VALUES (%s, 1, 'chat', "
        "'chat', '{}', %s, 1, 'talk', 'main', true) RETURNING id",
        (employee, f"chat:{employee}"))  # fmt: skip
    row = await sub.fetchone()
    assert row is not None
    sub_id = row["id"]
    key = owner_stream(employee)
    await conn.execute(
        "INSERT INTO bus_streams (stream_key, employee, generation, lane, thread, entity_id) "
        "VALUES (%s, %s, 1, 'talk', 'main', %s)", (key, employee, key))  # fmt: skip
    for seq, (at, settled, delivered) in enumerate(made, start=1):
        cur = await conn.execute(
            "INSERT INTO bus_deliveries (stream_key, seq, ingress_id, ingress_received_at, "
            "subscription_id, route, class, thread, type, size, chain_id, hop, status, "
            "created_at, updated_at) VALUES (%s, %s, %s, to_timestamp(%s), %s, '{}', 1, 'main', "
            "'chat', 2, 'c', 0, 'done', to_timestamp(%s), to_timestamp(%s)) RETURNING id",
            (key, seq, seq, at, sub_id, at, settled))  # fmt: skip
        added = await cur.fetchone()
        if delivered is not None and added is not None:
            await conn.execute(
                "INSERT INTO employee_timeline (employee, at, kind, thread, ref) "
                "VALUES (%s, to_timestamp(%s), 'input.delivered', 'main', %s)",
                (employee, delivered, str(added["id"])))  # fmt: skip
