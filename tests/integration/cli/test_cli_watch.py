"""`eventosctl attention --watch` and `list --watch` across an ingress restart: the watch's
connection drops for real while changes are written, it reconnects with Last-Event-ID, and
prints every change once, in order — nothing missed, nothing twice."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ADMIN_TOKEN, SPEC, ingress_config, run_service
from eventos_ingress.app import build
from psycopg_pool import AsyncConnectionPool

from eventos import names
from eventos.cli import main, watch
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.local.ports import free_port
from eventos.runtime.service import Service
from eventos.settings import DatabaseSettings, ServiceSettings
from eventos.testing import ConditionTimeout, wait_for


@dataclass
class Restartable:
    """An ingress on a fixed port that a test stops and starts again."""

    db: DatabaseSettings
    folder: Path
    port: int = field(default_factory=free_port)
    service: Service | None = None
    task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        http = ServiceSettings("ingress", http_port=self.port, grpc_port=0)
        self.service = await build(ingress_config(self.db, self.folder, service=http))
        self.task = await run_service(self.service)

    async def stop(self) -> None:
        if self.service is not None and self.task is not None:
            self.service.stop()
            await asyncio.wait_for(self.task, 15)
        self.service = self.task = None


@pytest.fixture
async def restartable(db_settings: DatabaseSettings, tmp_path: Path) -> AsyncIterator[Restartable]:
    ingress = Restartable(db_settings, tmp_path)
    await ingress.start()
    yield ingress
    await ingress.stop()


@dataclass
class Watching:
    """A `--watch` command running in a thread; its stdout lines as they come."""

    capsys: pytest.CaptureFixture[str]
    lines: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    done: asyncio.Future[int] | None = None

    def read(self) -> None:
        """Take what the command printed since the last read."""
        printed = self.capsys.readouterr()
        self.lines.extend(printed.out.splitlines())
        self.errors.extend(printed.err.splitlines())

    def objects(self) -> list[Any]:
        return [json.loads(line) for line in self.lines]

    async def until(self, what: str, check: Callable[[list[Any]], bool]) -> list[Any]:
        """Wait until `check` holds for what the command printed; fails at once, saying why,
        when the command ended before."""

        async def holds() -> list[Any] | None:
            found = self.objects()
            if check(found):
                return found
            if self.done is not None and self.done.done():
                self.read()
                raise AssertionError(f"the watch ended before {what}: {self.said()}")
            return None

        try:
            return await wait_for(holds, timeout=60, what=what)
        except ConditionTimeout as exc:  # say what the command printed meanwhile
            raise ConditionTimeout(f"{exc}; {self.said()}") from None

    def said(self) -> str:
        """The command's end (if it ended) and its last lines, for a failure's message."""
        end = ""
        if self.done is not None and self.done.done():
            end = f"exit {self.done.exception() or self.done.result()}; "
        return f"{end}out {self.lines[-10:]}, err {self.errors[-10:]}"


Runner = Callable[[list[str]], Watching]


@pytest.fixture
async def run_watch(capsys: pytest.CaptureFixture[str],
                    monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Runner]:  # fmt: skip
    """Start `eventosctl *argv` in a thread; it ends at its first block (or reconnect pause)
    after `stop` is set, and at the test's end in any case."""
    started: list[Watching] = []

    def run(argv: list[str]) -> Watching:
        watching = Watching(capsys)

        def on_block() -> None:
            watching.read()
            if watching.stop.is_set():
                raise KeyboardInterrupt

        def pause(seconds: float) -> None:
            if watching.stop.wait(seconds):
                raise KeyboardInterrupt

        monkeypatch.setattr(watch, "on_block", on_block)
        monkeypatch.setattr(watch, "pause", pause)
        monkeypatch.setattr(watch, "RECONNECT_S", (0.2, 0.5, 1.0))
        watching.done = asyncio.ensure_future(asyncio.to_thread(main, argv))
        started.append(watching)
        return watching

    yield run
    for watching in started:  # a failed test's watch ends at its next keep-alive (15 s)
        watching.stop.set()
        assert watching.done is not None
        await asyncio.wait_for(asyncio.shield(watching.done), 60)


async def all_placed(pool: AsyncConnectionPool[Conn]) -> None:
    """Wait until the sequencer placed every event written so far. The `started` fixture's
    `employee.starting` and `employee.running` are placed by the ingress's sequencer after they
    commit; a stream opened before that (on a loaded machine) rightly shows them as changes
    after the list, which the tests' counts do not expect."""

    async def none_unplaced() -> bool:
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT NOT EXISTS (SELECT FROM operator_events "
                                     "WHERE pos IS NULL) AS placed")  # fmt: skip
            row = await cur.fetchone()
        return row is not None and bool(row["placed"])

    await wait_for(none_unplaced, timeout=60, what="every event placed")


async def ended(watching: Watching, poke: Callable[[], Awaitable[None]]) -> int:
    """Stop the watch: set its flag, then make one more block come."""
    watching.stop.set()
    await poke()
    assert watching.done is not None
    return await asyncio.wait_for(watching.done, 60)


async def test_attention_watch_resumes_after_the_ingress_restarts(
    started: str,
    pool: AsyncConnectionPool[Conn],
    restartable: Restartable,
    run_watch: Runner,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def raise_item(kind: str) -> None:
        async with pool.connection() as conn:
            await conn.execute(Q["attention_raise"], {"employee": started, "kind": kind,
                                                      "severity": "warning", "ref": started,
                                                      "detail": "seen"})  # fmt: skip

    argv = ["attention", "--watch", "-o", "json", "--url", restartable.url, "--token", ADMIN_TOKEN]
    watching = run_watch(argv)
    first, *_ = await watching.until("the initial list", lambda o: len(o) == 1)
    assert first == {"attention": [], "next_cursor": None}

    await raise_item(names.ATTENTION_BUDGET_HIGH)
    await watching.until("the first item", lambda o: len(o) == 2)
    await restartable.stop()  # the watch's connection drops; changes go on meanwhile
    await raise_item(names.ATTENTION_BUDGET_MAX)
    await raise_item(names.ATTENTION_SLOW_TURN)
    async with pool.connection() as conn:
        await conn.execute("UPDATE attention_items SET state = 'acked', acked_by = 'owner' "
                           "WHERE kind = %s", (names.ATTENTION_BUDGET_HIGH,))  # fmt: skip
    await restartable.start()
    await watching.until("the changes made while it was down", lambda o: len(o) == 5)
    await raise_item(names.ATTENTION_PARKED_TURN)
    await watching.until("a change after the reconnect", lambda o: len(o) == 6)
    assert await ended(watching, lambda: raise_item(names.ATTENTION_MISSED_ALARM)) == 0

    printed = [(o["kind"], o["state"]) for o in watching.objects()[1:]]
    assert printed[:5] == [("budget_high", "open"), ("budget_max", "open"),
                           ("slow_turn", "open"), ("budget_high", "acked"),
                           ("parked_turn", "open")]  # fmt: skip
    assert printed[5:] in ([], [("missed_alarm", "open")])
    said = watching.errors + capsys.readouterr().err.splitlines()
    assert any("reconnecting" in line for line in said)  # on stderr, never on stdout


async def test_list_watch_prints_each_employee_change_once_across_a_restart(
    started: str,
    pool: AsyncConnectionPool[Conn],
    restartable: Restartable,
    run_watch: Runner,
) -> None:
    async def lifecycle(action: str) -> None:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(base_url=restartable.url, headers=headers) as api:
            r = await api.post(f"/v1/employees/{started}:{action}")
        assert r.status_code == 202, r.text

    argv = ["list", "--watch", "-o", "json", "--url", restartable.url, "--token", ADMIN_TOKEN]
    await all_placed(pool)
    watching = run_watch(argv)
    (listed,) = await watching.until("the initial list", lambda o: len(o) == 1)
    assert [(e["name"], e["state"]) for e in listed] == [(started, "running")]
    await lifecycle("stop")
    await watching.until("paused", lambda o: len(o) == 2)
    await restartable.stop()
    await restartable.start()
    await lifecycle("resume")
    await watching.until("running again", lambda o: len(o) == 3)
    assert await ended(watching, lambda: lifecycle("stop")) == 0
    states = [(o["name"], o["state"]) for o in watching.objects()[1:3]]
    assert states == [(started, "paused"), (started, "running")]


async def test_list_watch_prints_a_deleted_employee_once(
    started: str,
    pool: AsyncConnectionPool[Conn],
    restartable: Restartable,
    run_watch: Runner,
) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    argv = ["list", "--watch", "-o", "json", "--url", restartable.url, "--token", ADMIN_TOKEN]
    await all_placed(pool)
    watching = run_watch(argv)
    await watching.until("the initial list", lambda o: len(o) == 1)
    async with httpx.AsyncClient(base_url=restartable.url, headers=headers) as api:
        assert (await api.post(f"/v1/employees/{started}:stop")).status_code == 202
        await watching.until("paused", lambda o: len(o) == 2)
        assert (await api.delete(f"/v1/employees/{started}")).status_code == 200
        await watching.until("deleted", lambda o: o[-1]["state"] == "deleted")

        async def start_again() -> None:  # the name applied again: a fresh employee starts
            r = await api.post("/v1/employees", content=SPEC,
                               headers={"content-type": "application/yaml"})  # fmt: skip
            assert r.json()["applied"][0]["created"] is True
            assert (await api.post(f"/v1/employees/{started}:start")).status_code == 202

        assert await ended(watching, start_again) == 0
    states = [(o["name"], o["state"]) for o in watching.objects()[1:]]
    # The retirement the deletion made is not printed as a row of its own.
    assert states[:2] == [(started, "paused"), (started, "deleted")]
    assert all(state != "deleted" for _, state in states[2:])
