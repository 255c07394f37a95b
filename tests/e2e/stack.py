"""The six services as processes against one database and one Temporal, for tests that kill
or cut off parts of the stack; plus the owner API and database reads those tests share."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
from conftest import ADMIN_TOKEN, PURPOSES
from processes import Running
from psycopg.rows import dict_row

from eventos import names
from eventos.local.temporal_dev import TemporalDevServer
from eventos.outbox.keys import new_key_entry
from eventos.testing import wait_for_sync

T = TypeVar("T")

# Started in this order: each kicks the one before it (ingress → router → relay).
ORDER = ("relay", "router", "ingress", "workers-workflow", "egress", "workers-llm")
KICKS = {"ingress": "router", "router": "relay"}
READY_S = 60.0  # six Python processes booting at once on a small, shared machine
OUTBOX_KEYS = new_key_entry("e2e-1")  # relay, workers-workflow and egress refuse to start without
LLM_CLASSES = ("c1", "c2", "c3", "c4")  # tier L: one workers-llm process per class, as the chart


@dataclass
class Stack:
    """The six services, each a `Running` process on its own fixed ports; at tier L the LLM
    workers are one process per class (`workers-llm-c1` … `-c4`, LLM_CLASS set)."""

    env: dict[str, str]
    log_dir: Path
    tier: str = "S"
    watch: tuple[Path, ...] = ()  # more logs for failure messages (a Temporal server's)
    procs: dict[str, Running] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ORDER:
            if name == "workers-llm" and self.tier == "L":
                for c in LLM_CLASSES:
                    env = {**self.env, "LLM_CLASS": c}
                    self.procs[f"{name}-{c}"] = Running.of(name, env, self.log_dir, suffix=c)
                continue
            self.procs[name] = Running.of(name, dict(self.env), self.log_dir)
        for name, kicked in KICKS.items():
            self.procs[name].env[f"EVENTOS_{name.upper()}_KICK"] = self.procs[kicked].grpc_target

    def __getitem__(self, name: str) -> Running:
        return self.procs[name]

    @property
    def ingress_url(self) -> str:
        return self.procs["ingress"].url

    def start(self) -> None:
        """Spawn every service at once, then wait until each answers /readyz."""
        for proc in self.procs.values():
            spawn(proc)
        for proc in self.procs.values():
            wait_for_sync(proc.ready, timeout=READY_S, what=f"{proc.proc.name} ready")

    def stop(self) -> None:
        """SIGTERM each service still running (SIGKILL where that does not stop it)."""
        for proc in self.procs.values():
            if proc.proc.exit_code() is not None or proc.proc.process is None:
                continue
            try:
                proc.terminate()
            except subprocess.TimeoutExpired:
                proc.kill()

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self) -> str:
        """The last lines of every service's log, for assertion messages."""
        tails = [f"--- {n}\n{p.proc.tail(15)}" for n, p in self.procs.items()]
        for path in self.watch:
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            tails.append(f"--- {path}\n" + "\n".join(line[:600] for line in lines[-15:]))
        return "\n".join(tails)


def spawn(proc: Running) -> None:
    """Start the process without waiting for it (Running.start waits for /readyz)."""
    proc.proc.spawn({**os.environ, **proc.env, **proc.proc.port_env()}, proc.cwd)


def base_env(database_url: str, address: str, namespace: str, blobs: Path) -> dict[str, str]:
    """What every service process sees."""
    return {
        "EVENTOS_DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": address,
        "TEMPORAL_NAMESPACE": namespace,
        "EVENTOS_ADMIN_TOKEN": ADMIN_TOKEN,
        "EVENTOS_INGRESS_SPOOL_DIR": str(blobs),
        "EVENTOS_OUTBOX_KEYS": OUTBOX_KEYS,
        "EVENTOS_SECRETS_PURPOSES": PURPOSES,
        "PYTHONUNBUFFERED": "1",
    }


@dataclass
class Owner:
    """The owner API of one stack, as a user's client would call it."""

    url: str

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", **kw.pop("headers", {})}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=10, **kw)

    def apply_and_start(self, spec: str, name: str) -> None:
        applied = self.call("POST", "/v1/employees", content=spec)
        assert applied.status_code == 200, applied.text
        started = self.call("POST", f"/v1/employees/{name}:start")
        assert started.status_code == 202, started.text
        # The relay's deliverer starts the supervisor, whose first run activates the generation.
        wait_for_sync(lambda: self.call("GET", f"/v1/employees/{name}").json()["state"]
                      == names.GEN_RUNNING, timeout=30, what=f"{name} running")  # fmt: skip

    def chat(self, name: str, text: str) -> int:
        """Send one owner message; the answer must be 202 (queued)."""
        doc = {"client_message_id": uuid.uuid4().hex, "text": text}
        sent = self.call("POST", f"/v1/employees/{name}/chat", json=doc)
        assert sent.status_code == 202, sent.text
        return int(sent.json()["message_id"])

    def message(self, name: str, message_id: int) -> dict[str, Any]:
        found = self.call("GET", f"/v1/employees/{name}/chat/{message_id}")
        assert found.status_code == 200, found.text
        doc: dict[str, Any] = found.json()
        return doc


def rows(url: str, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        return conn.execute(query, params).fetchall()


def one(url: str, query: str, params: dict[str, Any] | None = None) -> Any:
    """The single value of a one-row, one-column query."""
    (row,) = rows(url, query, params)
    (value,) = row.values()
    return value


def reply_rows(url: str) -> list[dict[str, Any]]:
    """The replies shown to the owner (`chat_events` of kind reply)."""
    return rows(url, "SELECT turn_id, outbound_id, text FROM chat_events WHERE kind = 'reply'")


def until(condition: Callable[[], Any], timeout: float, what: str, stack: Stack) -> Any:
    """wait_for_sync, with every service's log tail in the failure message."""
    try:
        return wait_for_sync(condition, timeout=timeout, interval=0.25, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{stack.logs()}") from None


@contextlib.contextmanager
def own_dev_server(folder: Path) -> Iterator[TemporalDevServer]:
    """A dev server of one test's own (its SQLite file and ports), which it may stop and start
    again: the restarted server reuses both, so workflows running before carry on."""
    server = TemporalDevServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a fresh loop in a thread (these tests are synchronous)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
