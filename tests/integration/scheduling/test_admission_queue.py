"""Admission with thousands of waiters (issue 27 point 1): a pass reads the next waiters by
index (eventos.scheduling.admission `waiters_next`), not every waiter, and still offers what
the policy offers when it reads them all: floors, employees in turn, caps, ceilings and the
reserved owner slot hold however long the queue."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool
from test_admission import ask, employees, granted, release

from eventos import names
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.delivery.routing import entity_id
from eventos.scheduling import admission, policy
from eventos.scheduling.policy import Load, SchedConfig, Waiter

T0 = datetime(2026, 12, 1, tzinfo=UTC)
QUEUE = 3000  # more waiters than the console reads (2,000), as in a reply wave
ROOMY = {k: 10 for k in names.CLASSES}

INSERT_WAITERS = """
INSERT INTO sched_waiters (stream_key, employee, generation, agent, thread, class, workflow_id,
    requested_at, offered_at)
SELECT k, e, 1, 'front', k, c, 'wf-' || k, r, o
FROM unnest(%(keys)s::text[], %(employees)s::text[], %(classes)s::smallint[],
            %(requested)s::timestamptz[], %(offered)s::timestamptz[]) AS w(k, e, c, r, o)
"""
INSERT_TURN = """
INSERT INTO turns (id, employee, generation, agent, thread, n, class, stream_key)
VALUES (%(id)s, %(employee)s, 1, 'front', %(id)s, 1, %(class)s, %(id)s)
"""
INSERT_LEASE = """
INSERT INTO sched_leases (turn_id, employee, class, stream_key)
VALUES (%(id)s, %(employee)s, %(class)s, %(id)s)
"""
SERVED = """
INSERT INTO sched_rounds (class, employee, served_at) VALUES (%(class)s, %(employee)s, %(at)s)
ON CONFLICT (class, employee) DO UPDATE SET served_at = EXCLUDED.served_at
"""


async def add_waiters(conn: Conn, rows: list[tuple[str, str, int, datetime, datetime | None]]
                      ) -> None:  # fmt: skip
    keys, emps, classes, requested, offered = (list(col) for col in zip(*rows, strict=True))
    await conn.execute(INSERT_WAITERS, {"keys": keys, "employees": emps, "classes": classes,
                                        "requested": requested, "offered": offered})  # fmt: skip


async def started(conn: Conn, tid: str, employee: str, klass: int, *, running: bool) -> None:
    """A turn admitted now; a running one holds a slot."""
    await conn.execute(INSERT_TURN, {"id": tid, "employee": employee, "class": klass})
    if running:
        await conn.execute(INSERT_LEASE, {"id": tid, "employee": employee, "class": klass})


async def every_waiter(conn: Conn) -> tuple[list[Waiter], dict[str, str]]:
    """All the waiters as the console reads them (no bound), and their workflow ids."""
    rows = await (await conn.execute(Q["waiters_list"], {"limit": 1_000_000})).fetchall()
    waiters = [Waiter(r["stream_key"], r["employee"], int(r["class"]), r["requested_at"],
                      r["served_at"], r["offered_at"] is not None) for r in rows]  # fmt: skip
    return waiters, {r["stream_key"]: r["workflow_id"] for r in rows}


async def load_now(conn: Conn, cfg: SchedConfig) -> Load:
    by_class: dict[int, int] = defaultdict(int)
    by_employee: dict[str, int] = defaultdict(int)
    for r in await (await conn.execute(Q["sched_load"])).fetchall():
        by_class[int(r["class"])] += int(r["n"])
        by_employee[r["employee"]] += int(r["n"])
    window = {"window_s": cfg.share_window_s}
    rows = await (await conn.execute(Q["sched_admitted"], window)).fetchall()
    return Load(dict(by_class), dict(by_employee), {int(r["class"]): int(r["n"]) for r in rows})


def scenario(rng: random.Random) -> dict[str, Any]:
    """A random queue: a few employees with most of the waiters, requested times that tie,
    some offers kept, rounds served at random, some employees at their cap, a random mix of
    turns admitted in the window and of class ceilings."""
    now = datetime.now(UTC)  # offers kept now (older ones lapse)
    people = [f"e{i:02d}" for i in range(rng.choice([4, 30]))]  # few: served again in a pass
    weights = [40 if i < 3 else 1 for i in range(len(people))]
    waiters = []
    for n in range(QUEUE):
        employee = rng.choices(people, weights)[0]
        offered = now if rng.random() < 0.003 else None
        waiters.append((f"{employee}/w{n}", employee, rng.choice(names.CLASSES),
                        T0 + timedelta(seconds=rng.randrange(900)), offered))  # fmt: skip
    served = [(k, e, T0 + timedelta(seconds=rng.randrange(-600, 900)))
              for k in names.CLASSES for e in rng.sample(people, len(people) // 2)]  # fmt: skip
    holders = [people[1]] * 4 + [rng.choice(people) for _ in range(6)]  # one at its cap, or more
    running = [(f"run{i}", p, rng.choice(names.CLASSES)) for i, p in enumerate(holders)]
    admitted = [(f"old{k}-{i}", "e29", k) for k in names.CLASSES for i in range(rng.randrange(12))]
    return {"waiters": waiters, "served": served, "running": running, "admitted": admitted,
            "class_max": {k: rng.choice([3, 6, 30]) for k in names.CLASSES},
            "free": rng.choice([1, 1, 2, 3, 8, 24])}  # fmt: skip


async def test_a_pass_offers_what_the_policy_offers_reading_every_waiter(
    pool: AsyncConnectionPool[Conn],
) -> None:
    """A release among 3,000 waiters offers the freed (and any other free) slots to exactly
    the waiters, in the order, that `policy.offers` picks from the whole queue."""
    offers = []
    for seed in range(16):
        rng = random.Random(seed)
        s = scenario(rng)
        async with pool.connection() as conn, conn.transaction(force_rollback=True):
            await add_waiters(conn, s["waiters"])
            for k, e, at in s["served"]:
                await conn.execute(SERVED, {"class": k, "employee": e, "at": at})
            for tid, e, k in s["running"]:
                await started(conn, tid, e, k, running=True)
            for tid, e, k in s["admitted"]:
                await started(conn, tid, e, k, running=False)
            cfg0 = SchedConfig(class_max=s["class_max"])
            load = await load_now(conn, cfg0)
            cfg = SchedConfig(capacity=load.held() - 1 + s["free"], class_max=s["class_max"])
            tid, employee, klass = s["running"][-1]  # the turn that ends
            load.by_class[klass] -= 1
            load.by_employee[employee] -= 1
            waiters, workflow_of = await every_waiter(conn)
            expected = [workflow_of[w.stream_key] for w in policy.offers(cfg, load, waiters)]
            _, woken = await admission.release(conn, cfg, tid, names.TURN_DONE)
            assert woken == expected, f"seed {seed}: {s['free']} free"
            offers.append(len(expected))
    assert max(offers) > 2 and sum(1 for n in offers if n) > 8, offers  # the draw offers


async def test_thousands_of_waiters_keep_floors_turns_and_the_owner_slot(
    pool: AsyncConnectionPool[Conn],
) -> None:
    """3,000 background waiters asked before anyone else: the owner still starts at once
    (the reserved slot), a freed slot goes to the one customer waiter (C2 below its floor),
    the next to an employee never served in C4 before the long queue's second."""
    await employees(pool, "bg", "cust", "boss", "quiet")
    cfg = SchedConfig(capacity=2, class_max=ROOMY)
    first = await ask(pool, cfg, "bg", "run1", names.C4_BACKGROUND)
    second = await ask(pool, cfg, "bg", "run2", names.C4_BACKGROUND)
    assert granted(first) and granted(second)
    async with pool.connection() as conn:
        await add_waiters(conn, [(f"bg/g1/worker/q{n}", "bg", names.C4_BACKGROUND,
                                  T0 + timedelta(seconds=n), None) for n in range(QUEUE)])  # fmt: skip
    assert not granted(await ask(pool, cfg, "quiet", "late", names.C4_BACKGROUND))
    assert not granted(await ask(pool, cfg, "cust", "t1", names.C2_CUSTOMER))
    owner = await ask(pool, cfg, "boss", "main", names.C1_OWNER, lane=names.LANE_TALK)
    assert granted(owner) and owner.admission.reserved
    assert await release(pool, cfg, first) == [entity_id("cust", 1, names.LANE_WORKER, "t1")]
    customer = await ask(pool, cfg, "cust", "t1", names.C2_CUSTOMER)
    assert granted(customer)
    # Only C4 waits now: quiet, never served in C4, goes before the 3,000 older waiters of
    # bg (served twice).
    assert await release(pool, cfg, second) == [entity_id("quiet", 1, names.LANE_WORKER, "late")]
