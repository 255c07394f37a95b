"""Every bench/ driver runs end to end with `--quick` and prints its figures.

A smoke run checks that a driver still works and still prints what it measures, never how fast
anything was: the figures of a tiny run on a shared machine mean nothing. The drivers share the
session's PostgreSQL (each gets a fresh database; those that read whole tables make their own
on that server) and its Temporal dev server (each in a namespace of its own for this session,
deleted at its end: the workflows one driver leaves behind are never picked up by another's
workers, nor by the same driver's next run on a long-lived TEMPORAL_ADDRESS).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.operatorservice.v1 import DeleteNamespaceRequest
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from eventos import names
from eventos.settings import TemporalSettings
from eventos.testing import wait_for
from eventos.testing.plugin import PostgresForTests

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
# Modules the drivers import or start; slow_uploads.py runs inside soak.py's smoke.
HELPERS = {
    "harness.py",
    "baseline_app.py",
    "loadgen.py",
    "slow_uploads.py",
    "faults_book.py",
    "faults_instance.py",
    "faults_ledger.py",
    "faults_load.py",
    "faults_schedule.py",
    "profiles.py",
}
# Drivers whose code another test runs end to end (their own instance, minutes long).
# suite_cpu.py turns the kernel's process accounting on and off, for the whole machine: a
# smoke run in `make test` would switch off accounting a machine keeps for itself.
RUN_ELSEWHERE = {"faults.py": "tests/e2e/test_faults.py",
                 "suite_cpu.py": "tests/bench/test_suite_cpu.py (its records)"}  # fmt: skip
# What each driver's run must print: the names of its figures and its table headers.
FIGURES = {
    "admission.py": ["queued ask ms", "ask cpu ms", "handoff ms", "handoff cpu ms",
                     "queued ask: cpu at", "handoff: cpu at", "targets:"],
    "alarms.py": ["fire lateness: p50", "p99", "supervisor", "signals", "history events"],
    "burst.py": ["calibration:", "webhooks sent in", "backlog every", "drain:", "inputs/s", "turns once admitted:",
                 "p99", "the owner's first message after the burst: turn start", "targets:"],
    "conversation_burst.py": ["EG7 burst of", "inputs/s", "signals", "history MB", "all runs:",
                              "inputs per Signal", "Signals by name:", "turns:",
                              "delivery ceiling of one conversation",
                              "targets:"],
    "channels.py": ["Telegram,", "conversations", "inbound-to-reply latency: p50", "p99",
                    "most in one second", "account bucket", "sent twice: 0"],
    "chat_latency.py": ["calibration:", "owner chat, message → reply", "p50", "p99", "per stage",
                        "routed"],
    "console.py": ["console pages,", "GET /v1/employee-summaries", "p50 ms", "p99 ms", "bytes",
                   "turns?limit=20", "largest JavaScript payload"],
    "content_rules.py": ["rules, ", "validation (apply)", "compile_rules", "holds() per message",
                         "p50 ms", "/baseline", "ReDoS"],
    "fleet.py": ["calibration:", "employees; webhooks at", "turns finished in the load window", "under load p99",
                 "inputs still waiting", "RSS MiB", "ms/event", "ms/action", "Temporal actions:", "at rest",
                 "all processes:", "target: not growing", "targets:"],
    "fairness.py": ["turns admitted in the load window", "share", "floor",
                    "every class backlogged", "owner admission wait under load",
                    "owner message to turn start", "owner message to reply",
                    "by process (% of one core):", "Temporal workflow tasks over the load window",
                    "targets:"],
    "owner_trace.py": ["turns admitted in the load window", "owner messages traced:", "stage",
                       "p50", "p99", "targets:"],
    "ingress.py": ["Webhook ingress vs baseline", "ok/s", "p99 ms", "server CPU%",
                   "saturation throughput ingress/baseline", "commit check ingress"],
    "publish.py": ["EventIngress.Publish", "events/s", "ack p99 ms", "1 stream throughput",
                   "commit check"],
    "relay.py": ["calls/s", "events/s", "raw", "relay/raw calls/s"],
    "router.py": ["Router drain vs ingress saturation", "rows/s", "router drain (ingress idle)",
                  "router drain / ingress saturation"],
    "operator_events.py": ["inputs/s", "no event trigger", "dead-letter", "events placed/s",
                           "read p50 ms", "a user (1 in 50)"],
    "soak.py": ["ingress peak RSS (MiB)", "chart memory limit", "normal p99 (ms)", "stored whole"],
    "timeline.py": ["page (limit 50)", "p50 ms", "p99 ms", "Index Scan Backward",
                    "no timeline", "mark delivered"],
    "turn_commands.py": ["per input", "wf tasks", "commands", "local acts", "timers",
                         "signals in", "signals out", "actions", "chat", "tool", "webhook",
                         "customer"],
    "turn_replay.py": ["calibration:", "replay CPU per workflow instance", "SDK walks",
                       "walks skipped", "ratio", "TurnWorkflow", "all"],
    "storm.py": ["simulated 1 min", "instant turns", "tool calls:", "ipc ingress rows by outcome",
                 "per minute"],
}  # fmt: skip
RUN_TIMEOUT_S = 100.0
STOP_GRACE_S = 20.0
STACKS_WAIT_S = 3.0
TIER_L_RUN_TIMEOUT_S = 240.0  # it creates the server's databases and 64 shards first
SESSION = secrets.token_hex(3)
PY_SPY_RUN = "py-spy"  # the py-spy smoke's run of chat_latency.py, in a namespace of its own
NAMESPACED = (*FIGURES, PY_SPY_RUN)


def namespace(script: str) -> str:
    return f"bench-{script.removesuffix('.py').replace('_', '-')}-{SESSION}"


@pytest.fixture(scope="module")
async def bench_temporal(temporal_settings: TemporalSettings) -> AsyncIterator[TemporalSettings]:
    """The session's Temporal with a namespace per driver, each answering; deleted after."""
    client = await Client.connect(temporal_settings.address, namespace="default")
    retention = Duration()
    retention.FromTimedelta(timedelta(days=1))
    for script in NAMESPACED:
        request = RegisterNamespaceRequest(
            namespace=namespace(script), workflow_execution_retention_period=retention
        )
        try:
            await client.workflow_service.register_namespace(request)
        except RPCError as exc:
            if exc.status != RPCStatusCode.ALREADY_EXISTS:
                raise
    for script in NAMESPACED:
        ns = await Client.connect(temporal_settings.address, namespace=namespace(script))

        async def answers(ns: Client = ns) -> bool:
            try:
                await ns.count_workflows()
            except RPCError:
                return False  # registered, not yet in the frontend's namespace cache
            return True

        await wait_for(answers, timeout=60, interval=0.5, what=f"namespace of {script}")
    yield temporal_settings
    for script in NAMESPACED:
        await client.operator_service.delete_namespace(
            DeleteNamespaceRequest(namespace=namespace(script))
        )


@pytest.fixture(scope="module")
def bytecode_cache(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One bytecode cache for every Python process the drivers start (about twenty): where
    PYTHONDONTWRITEBYTECODE is set, each would compile every module it imports again."""
    return {"PYTHONPYCACHEPREFIX": str(tmp_path_factory.mktemp("pycache"))}


def driver_env(
    database_url: str, temporal: TemporalSettings, run: str, bytecode_cache: dict[str, str]
) -> dict[str, str]:
    """A driver's environment: the session's PostgreSQL and Temporal, the run's namespace."""
    return {
        **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        **bytecode_cache,
        "EVENTOS_DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": temporal.address,
        "TEMPORAL_NAMESPACE": namespace(run),
    }


def run_driver(
    script: str, env: dict[str, str], *args: str, timeout_s: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """`python bench/<script> --quick` from the repository root, as the docs run it; stopped
    with SIGTERM (the drivers stop what they started on it) if it outlives the timeout."""
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / script), "--quick", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # its stacks, on stderr, before it is stopped
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STACKS_WAIT_S)
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(
            f"{script} --quick still running after {timeout_s:.0f}s; it printed:\n"
            f"{out[-2000:]}\nand on stderr (its stacks at the end):\n{err[-12000:]}"
        )
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.temporal
@pytest.mark.parametrize("script", sorted(FIGURES))
def test_driver_runs_and_prints_its_figures(
    script: str,
    postgres_server: PostgresForTests,
    db_name: str,
    bench_temporal: TemporalSettings,
    bytecode_cache: dict[str, str],
) -> None:
    env = driver_env(postgres_server.url(db_name), bench_temporal, script, bytecode_cache)
    done = run_driver(script, env)
    assert done.returncode == 0, (
        f"{script} --quick exited {done.returncode}:\n{done.stderr[-3000:]}"
    )
    missing = [figure for figure in FIGURES[script] if figure not in done.stdout]
    assert not missing, f"{script} --quick did not print {missing}; it printed:\n{done.stdout}"


@pytest.mark.temporal
def test_a_driver_records_each_service_with_py_spy(
    tmp_path: Path,
    postgres_server: PostgresForTests,
    db_name: str,
    bench_temporal: TemporalSettings,
    bytecode_cache: dict[str, str],
) -> None:
    """`--py-spy DIR` (bench/profiles.py): a raw profile per service, its hottest frames shown."""
    # Not chat_latency.py's smoke namespace: that run's entities (the same ids) would take this
    # run's Signals and drop its inputs as repeats of theirs.
    env = driver_env(postgres_server.url(db_name), bench_temporal, PY_SPY_RUN, bytecode_cache)
    done = run_driver("chat_latency.py", env, "--py-spy", str(tmp_path))
    assert done.returncode == 0, f"chat_latency.py exited {done.returncode}:\n{done.stderr[-3000:]}"
    for service in names.SERVICES:
        logged = (tmp_path / f"{service}.log").read_text()
        assert (tmp_path / f"{service}.txt").exists(), f"no profile of {service}: {logged}"
        assert f"py-spy, {service}: the ten hottest frames" in done.stdout, done.stdout
    sampled = [int(n) for n in re.findall(r"^  (\d+) samples$", done.stdout, re.MULTILINE)]
    assert sampled and max(sampled) > 0, done.stdout  # the busiest service was seen at work


def test_every_driver_has_a_smoke_run() -> None:
    drivers = {p.name for p in BENCH.glob("*.py")} - HELPERS - set(RUN_ELSEWHERE)
    assert drivers == set(FIGURES), "a bench/ driver without a smoke run, or a stale entry"


@pytest.mark.tier_l
def test_fleet_runs_at_tier_l_with_the_servers_counters(bytecode_cache: dict[str, str]) -> None:
    """`fleet.py --tier L --quick` on its own instance: embedded PostgreSQL, the tier L server
    this checkout built, one workers-llm per class; actions counted from the server's metrics."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"
           and not k.startswith(("EVENTOS_DATABASE_URL", "TEMPORAL_"))},
        **bytecode_cache,
    }  # fmt: skip
    done = run_driver("fleet.py", env, "--tier", "L", timeout_s=TIER_L_RUN_TIMEOUT_S)
    assert done.returncode == 0, (
        f"fleet.py --tier L --quick exited {done.returncode}:\n{done.stderr[-3000:]}"
    )
    out = done.stdout
    assert "tier L, 3 employees" in out, out
    for klass in ("c1", "c2", "c3", "c4"):
        assert f"workers-llm-{klass}" in out, out  # one process per class queue, each measured
    actions = re.search(r"Temporal actions: (\d+) \(", out)
    assert actions is not None and int(actions.group(1)) > 0, out
