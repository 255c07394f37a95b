"""`make run` as a user runs it: `python -m eventos.local` in a folder, then Ctrl-C or a crash.

Each test owns its folder, so its embedded PostgreSQL and Temporal dev server are its own;
EVENTOS_DATABASE_URL and TEMPORAL_ADDRESS are dropped so the embedded path is what runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from conftest import E2E_TIMEOUT_S
from temporalio.client import Client, WorkflowExecutionStatus

from eventos import names
from eventos.client.owner_api import InstanceUnreachable, OwnerApiError, OwnerClient
from eventos.local.processes import pid_alive
from eventos.settings import CHART_VAR, TOOLS_BIN_VAR
from eventos.testing import wait_for_sync
from eventos.v1 import ingress_pb2, ingress_pb2_grpc

# Whole stacks of processes on a small shared machine: a longer hang limit than the default.
pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
READY_S = 45.0
STOP_S = 30.0
AMBIENT = ("EVENTOS_DATABASE_URL", "TEMPORAL_ADDRESS", "EVENTOS_ADMIN_TOKEN", "EVENTOS_SECRETS_DIR")


@dataclass
class Run:
    """One `python -m eventos.local` in `root`."""

    root: Path
    process: subprocess.Popen[bytes]
    output: Path
    seen_pids: set[int] = field(default_factory=set)

    def log(self) -> str:
        return self.output.read_text(errors="replace")

    def stack(self) -> dict[str, Any] | None:
        """This run's stack.json once written (a crashed run's file is not ours)."""
        if self.process.poll() is not None:
            raise AssertionError(f"localstack exited {self.process.returncode}:\n{self.log()}")
        try:
            doc: dict[str, Any] = json.loads((self.root / ".eventos" / "stack.json").read_text())
        except (OSError, ValueError):
            return None
        if doc["pids"]["localstack"] != self.process.pid:
            return None
        self.seen_pids.update(self.children(doc))
        return doc

    def ready(self, timeout: float = READY_S) -> dict[str, Any]:
        """stack.json written, and the summary printed (examples applied)."""

        def summary_printed() -> dict[str, Any] | None:
            doc = self.stack()
            return doc if doc is not None and "Try:" in self.log() else None

        doc = wait_for_sync(summary_printed, timeout=timeout, interval=0.2, what="ready")
        assert doc is not None
        return doc

    @staticmethod
    def children(doc: dict[str, Any]) -> set[int]:
        return {int(p) for name, p in doc["pids"].items() if name != "localstack" and p}


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """Start localstack in tmp_path; whatever a test leaves running is stopped afterwards."""
    runs: list[Run] = []
    env = {k: v for k, v in os.environ.items() if k not in AMBIENT}

    def start(*args: str, **extra_env: str) -> Run:
        output = tmp_path / f"localstack-{len(runs)}.out"
        with output.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "eventos.local", "--examples", str(EXAMPLES), *args],
                cwd=tmp_path,
                env={**env, **extra_env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        runs.append(Run(tmp_path, process, output))
        return runs[-1]

    yield start
    for run in runs:
        if run.process.poll() is None:
            run.process.send_signal(signal.SIGINT)
            try:
                run.process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                run.process.kill()
    for pid in {p for run in runs for p in run.seen_pids}:
        if pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)


def all_gone(pids: set[int]) -> Callable[[], bool]:
    return lambda: not any(pid_alive(p) for p in pids)


def running_in(root: Path) -> list[str]:
    """Processes whose command line or working directory is inside `root` (Linux /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if cmdline and (str(root) in cmdline or cwd == str(root)):
            found.append(f"{proc.name}: {cmdline}")
    return found


def employees(doc: dict[str, Any]) -> dict[str, str]:
    auth = {"Authorization": f"Bearer {doc['admin_token']}"}
    found = httpx.get(f"{doc['ingress_url']}/v1/employees", headers=auth, timeout=5).json()
    return {e["name"]: e["state"] for e in found["employees"]}


def internal_append(doc: dict[str, Any], key: str) -> Any:
    """Append one internal event over gRPC with the instance's internal token."""
    body = {"specversion": "1.0", "id": key, "source": "/e2e", "type": "eventos.e2e"}
    ev = ingress_pb2.DriverEvent(driver_id="e2e", seq=1, source_key="internal:e2e",
                                 dedupe_key=key, type="eventos.e2e",
                                 envelope=json.dumps(body).encode())  # fmt: skip
    auth = (("authorization", f"Bearer {doc['internal_token']}"),)
    with grpc.insecure_channel(doc["services"]["ingress"]["grpc"]) as channel:
        return ingress_pb2_grpc.EventIngressStub(channel).Append(ev, timeout=10, metadata=auth)


def check_operator_aids(run: Run, doc: dict[str, Any]) -> None:
    """The Temporal Web UI runs on loopback at the address printed and in stack.json, and the
    services' logs show exceptions' text (the operator's own instance; issue 26)."""
    ui = doc["temporal"]["ui"]
    assert ui.startswith("http://127.0.0.1:"), ui
    assert f"Temporal Web UI   {ui}" in run.log()
    page = wait_for_sync(lambda: _answers(ui), timeout=30, what="the Temporal Web UI answers")
    assert "<html" in page.lower()
    for name in names.SERVICES:
        environ = Path(f"/proc/{doc['pids'][name]}/environ").read_bytes().split(b"\0")
        assert b"EVENTOS_LOG_EXCEPTIONS=text" in environ, name


def _answers(url: str) -> str | None:
    try:
        r = httpx.get(url, timeout=5, follow_redirects=True)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


def check_services(doc: dict[str, Any]) -> None:
    assert set(doc["services"]) == set(names.SERVICES)
    for name, svc in doc["services"].items():
        assert (svc["grpc"] is not None) == (name in ("ingress", "router", "relay"))
        for route in ("/livez", "/readyz"):
            answer = httpx.get(svc["http"] + route, timeout=5)
            assert answer.status_code == 200, (name, route, answer.text)
            assert answer.json()["service"] == name
        metrics = httpx.get(svc["metrics"], timeout=5)
        assert metrics.status_code == 200 and "# TYPE" in metrics.text, name


def test_starts_serves_and_stops_on_ctrl_c(launch: Callable[..., Run]) -> None:
    run = launch()
    doc = run.ready()

    assert doc["database"]["url"].endswith("/eventos") and doc["database"]["embedded"]
    assert doc["temporal"]["address"] and doc["temporal"]["namespace"] == "default"
    assert len(doc["admin_token"]) >= 32
    assert len(doc["internal_token"]) >= 32 and doc["internal_token"] != doc["admin_token"]
    assert internal_append(doc, "e2e-internal").status == ingress_pb2.Ack.ACCEPTED
    assert doc["ingress_url"] == doc["services"]["ingress"]["http"]
    check_services(doc)
    check_operator_aids(run, doc)
    # hello needs nothing; support needs credentials nobody gave, so it was skipped.
    assert employees(doc) == {"hello": "running"}
    assert "support: skipped (needs openai-main, stripe-whsec, deploy-hook" in run.log()
    # The console line names the file holding the token to paste, and that token signs in.
    console = f"web console       {doc['ingress_url']}/console (sign in with the admin token in "
    [named] = [line.split(console, 1)[1] for line in run.log().splitlines() if console in line]
    pasted = (run.root / named.removesuffix(")")).read_text().strip()
    me = httpx.get(f"{doc['ingress_url']}/v1/me", headers={"Authorization": f"Bearer {pasted}"},
                   timeout=5)  # fmt: skip
    assert me.status_code == 200, me.text
    assert httpx.get(f"{doc['ingress_url']}/console", timeout=5).status_code == 200
    # The "Try:" line, run as printed, waits for the reply and shows it.
    [tried] = [
        line.removeprefix("Try:") for line in run.log().splitlines() if line.startswith("Try:")
    ]
    assert shlex.split(tried)[1:] == ["chat", "hello", "hi", "--wait"]
    answer = subprocess.run(tried, shell=True, cwd=run.root, capture_output=True, text=True,
                            timeout=90)  # fmt: skip
    assert answer.returncode == 0, answer.stderr
    queued, reply = answer.stdout.strip().splitlines()
    assert queued.endswith(" queued") and reply.startswith("[local]") and "hi" in reply
    hook = httpx.post(
        f"{doc['ingress_url']}/hooks/hello",
        json={"hello": "world"},
        headers={"X-Event-Id": "e2e-1"},
        timeout=5,
    )
    assert hook.status_code == 200 and hook.json()["status"] == "accepted"
    # The owner's message goes through all six services as processes and is answered.
    ctl = [str(Path(sys.executable).parent / "eventosctl"), "chat", "hello", "hi from e2e"]
    chat = subprocess.run([*ctl, "--wait", "--timeout", "60"], cwd=run.root, capture_output=True,
                          text=True, timeout=90)  # fmt: skip
    assert chat.returncode == 0, chat.stderr
    queued, reply = chat.stdout.strip().splitlines()
    assert queued.endswith(" queued")
    assert reply.startswith("[local]") and "hi from e2e" in reply
    token_file = run.root / ".eventos" / "admin-token"
    assert token_file.read_text().strip() == doc["admin_token"]
    assert token_file.stat().st_mode & 0o777 == 0o600

    run.process.send_signal(signal.SIGINT)
    assert run.process.wait(STOP_S) == 0, run.log()
    wait_for_sync(all_gone(run.children(doc)), timeout=STOP_S, what="every child gone")
    assert not (run.root / ".eventos" / "stack.json").exists()


def test_restarts_cleanly_after_the_launcher_is_killed(launch: Callable[..., Run]) -> None:
    first = launch()
    before = first.ready()
    first.process.kill()
    first.process.wait(STOP_S)
    orphans = first.children(before)
    assert all(pid_alive(p) for p in orphans), "the children outlive a SIGKILLed launcher"

    second = launch()
    after = second.ready()
    wait_for_sync(all_gone(orphans - second.children(after)), timeout=5, what="leftovers gone")
    check_services(after)
    # The database survived the crash: the employee keeps its generation, not a second start.
    assert employees(after) == {"hello": "running"}
    assert "hello: running (generation 1)" in second.log()
    assert after["admin_token"] == before["admin_token"]
    assert after["internal_token"] == before["internal_token"]

    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(STOP_S) == 0, second.log()
    wait_for_sync(all_gone(second.children(after)), timeout=STOP_S, what="every child gone")


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="finds leftovers through /proc")
def test_a_service_that_cannot_start_stops_everything(launch: Callable[..., Run]) -> None:
    run = launch(EVENTOS_ADMIN_TOKEN="too-short")
    assert run.process.wait(READY_S) == 1, run.log()
    log = run.log()
    assert "error: ingress exited with code 1 before it was ready" in log
    assert "EVENTOS_ADMIN_TOKEN must be at least 16 characters" in log  # the log's tail
    assert "Try:" not in log
    assert running_in(run.root) == []
    assert not (run.root / ".eventos" / "stack.json").exists()


# A server killed under `make run` comes back after its first back-off delay (1 s), then its
# start; the services reconnect on their own retry clocks. Generous for a loaded shared machine.
HEAL_S = 180.0


def answered(owner: OwnerClient, message_id: int) -> str | None:
    """The reply to an owner message once there is one (None meanwhile, or while unreachable)."""
    try:
        reply = owner.message("hello", message_id)["reply"]
    except (InstanceUnreachable, OwnerApiError):
        return None
    return None if reply is None else str(reply)


def hooks_consumed(owner: OwnerClient, hooks: int) -> bool:
    """`hooks` webhooks routed to hello, none dead, and nothing of hello's waits any more."""
    try:
        accepted = owner.timeline("hello", kind="input.accepted", limit=200)["timeline"]
        dead = owner.timeline("hello", kind="input.dead", limit=200)["timeline"]
        waiting = owner.waiting("hello")["waiting"]
    except (InstanceUnreachable, OwnerApiError):
        return False
    assert dead == [], dead
    return sum("webhook" in e["summary"] for e in accepted) >= hooks and waiting == []


def post_hook(doc: dict[str, Any], event_id: str) -> bool:
    """One webhook to hello; True once ingress took it (a retry of one it took, whose answer
    was lost, is a duplicate)."""
    try:
        answer = httpx.post(f"{doc['ingress_url']}/hooks/hello", json={"n": event_id},
                            headers={"X-Event-Id": event_id}, timeout=5)  # fmt: skip
    except httpx.HTTPError:
        return False
    return answer.status_code == 200 and answer.json()["status"] in ("accepted", "duplicate")


def chat(owner: OwnerClient, text: str) -> int | None:
    """Queue an owner message to hello; its id once ingress took it."""
    try:
        return int(owner.chat("hello", text, f"heal-{text}")["message_id"])
    except (InstanceUnreachable, OwnerApiError):
        return None


def current_run(address: str, workflow_id: str) -> dict[str, str]:
    """The workflow's running run: {workflow id: run id}."""

    async def described() -> dict[str, str]:
        client = await Client.connect(address, namespace="default")
        found = await client.get_workflow_handle(workflow_id).describe()
        assert found.status == WorkflowExecutionStatus.RUNNING, found.status
        return {workflow_id: found.run_id}

    return asyncio.run(described())


def still_running(address: str, runs: dict[str, str]) -> dict[str, str]:
    """The workflow ids among `runs` no longer running the same run."""

    async def described() -> dict[str, str]:
        client = await Client.connect(address, namespace="default")
        lost = {}
        for workflow_id, run_id in runs.items():
            found = await client.get_workflow_handle(workflow_id).describe()
            if found.status != WorkflowExecutionStatus.RUNNING or found.run_id != run_id:
                lost[workflow_id] = f"{found.status} {found.run_id}"
        return lost

    return asyncio.run(described())


def restarted(run: Run, name: str, old_pid: int) -> dict[str, Any] | None:
    """stack.json once it names another live process for `name` than `old_pid`."""
    doc = run.stack()
    pid = doc["pids"].get(name) if doc is not None else None
    return doc if pid and pid != old_pid and pid_alive(pid) else None


@pytest.mark.parametrize("tier", ["S", pytest.param("L", marks=pytest.mark.tier_l)])
def test_heals_itself_when_its_servers_and_a_service_are_killed(
    launch: Callable[..., Run], tier: str
) -> None:
    """SIGKILL the Temporal server (the dev server; at tier L the full one, its databases on
    the instance's PostgreSQL), then PostgreSQL, then a service: each is started again on its
    state and ports and said in the log, and without help an owner message sent during or after
    each outage is answered and a webhook accepted then is consumed."""
    if tier == "S":
        run, server, worker = launch(), "Temporal dev server", "workers-llm"
    else:
        tools = {TOOLS_BIN_VAR: str(ROOT / ".tools" / "bin"),
                 CHART_VAR: str(ROOT / "deploy" / "helm" / "eventos")}  # fmt: skip
        run, server, worker = launch("--tier", "L", **tools), "Temporal server", "workers-llm-c1"
    # Tier L sets up the server's two databases (64 shards) and starts nine processes.
    doc = run.ready(READY_S if tier == "S" else HEAL_S)
    owner = OwnerClient(doc["ingress_url"], doc["admin_token"])
    temporal, database = doc["temporal"]["address"], doc["database"]["url"]
    # hello's supervisor runs as long as its generation: the same run must survive each kill.
    runs = current_run(temporal, names.supervisor_id("hello", 1))

    # The Temporal dev server: killed, the instance keeps taking work, then drains it.
    old = doc["pids"]["temporal"]
    os.kill(old, signal.SIGKILL)
    said = f"{server} (pid {old}) was killed by SIGKILL; restart 1 in 1s"
    wait_for_sync(lambda: said in run.log(), timeout=30, what="the kill said")
    message = wait_for_sync(lambda: chat(owner, "while-temporal-is-down"), timeout=30)
    assert wait_for_sync(lambda: post_hook(doc, "heal-1"), timeout=30)
    doc = wait_for_sync(lambda: restarted(run, "temporal", old), timeout=HEAL_S, what="restart")
    assert f"{server} restarted (pid" in run.log()
    assert doc["temporal"]["address"] == temporal  # the same port
    reply = wait_for_sync(lambda: answered(owner, message), timeout=HEAL_S, what="reply")
    assert "while-temporal-is-down" in reply
    wait_for_sync(lambda: hooks_consumed(owner, 1), timeout=HEAL_S, what="hook consumed")
    # Its SQLite file kept its state: the supervisor of before runs on.
    assert still_running(temporal, runs) == {}

    # PostgreSQL: killed with its lock file left behind; back on the same data and port.
    old = doc["pids"]["postgres"]
    os.kill(old, signal.SIGKILL)
    said = f"PostgreSQL (pid {old}) was killed by SIGKILL; restart 1 in 1s"
    wait_for_sync(lambda: said in run.log(), timeout=30, what="the kill said")
    doc = wait_for_sync(lambda: restarted(run, "postgres", old), timeout=HEAL_S, what="restart")
    assert "PostgreSQL restarted (pid" in run.log()
    assert doc["database"]["url"] == database
    assert wait_for_sync(lambda: post_hook(doc, "heal-2"), timeout=HEAL_S, what="hook taken")
    message = wait_for_sync(lambda: chat(owner, "after-postgres-died"), timeout=HEAL_S)
    reply = wait_for_sync(lambda: answered(owner, message), timeout=HEAL_S, what="reply")
    assert "after-postgres-died" in reply
    wait_for_sync(lambda: hooks_consumed(owner, 2), timeout=HEAL_S, what="hook consumed")

    # A service, as before: the LLM worker (at tier L the owner chat's class's).
    old = doc["pids"][worker]
    os.kill(old, signal.SIGKILL)
    doc = wait_for_sync(lambda: restarted(run, worker, old), timeout=HEAL_S)
    assert f"{worker} (pid {old}) was killed by SIGKILL; restart 1 in 1s" in run.log()
    message = wait_for_sync(lambda: chat(owner, "after-a-worker-died"), timeout=HEAL_S)
    reply = wait_for_sync(lambda: answered(owner, message), timeout=HEAL_S, what="reply")
    assert "after-a-worker-died" in reply
    assert still_running(temporal, runs) == {}

    run.process.send_signal(signal.SIGINT)
    assert run.process.wait(STOP_S) == 0, run.log()
    wait_for_sync(all_gone(run.children(doc)), timeout=STOP_S, what="every child gone")
