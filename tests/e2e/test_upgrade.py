"""EG16 and the upgrade of a local instance (issue 29 point 2, docs/upgrades.md).

One `python -m eventos.local` runs for the module; each test upgrades it with `eventosctl upgrade`
to a target checkout made from this tree: `next` (this code with a marker, so its build differs)
and `nondeterministic` (the supervisor workflow starts a timer before its first activity, so no
open supervisor replays on it). A webhook sender keeps posting events, as a provider does,
retrying each until it is acknowledged; every acknowledged event must be consumed once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import E2E_TIMEOUT_S
from psycopg.rows import dict_row

from eventos import names
from eventos.local.processes import pid_alive
from eventos.testing import wait_for_sync
from eventos.testing.webhooks import WebhookSender

# One instance for the module, as the tests are written: on one xdist worker (split over two,
# each worker started its own instance and installed `next` again: ~2 min more of work).
pytestmark = [
    pytest.mark.stack,
    pytest.mark.timeout(E2E_TIMEOUT_S),
    pytest.mark.xdist_group("upgrade"),
]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
AMBIENT = ("EVENTOS_DATABASE_URL", "TEMPORAL_ADDRESS", "EVENTOS_ADMIN_TOKEN", "EVENTOS_SECRETS_DIR")
READY_S = 120.0
CONSUMED_S = 180.0
UPGRADE_S = 600.0
MIGRATIONS = Path("libs/eventos/src/eventos/db/migrations")
SUPERVISOR = Path("libs/eventos/src/eventos/workflows/supervisor.py")
APPLY = "        await workflow.execute_activity(\n            names.ACT_APPLY_CONTROL, req,"
# The deliberate non-determinism: a timer before the activity every supervisor ran first.
NONDETERMINISTIC = "        await workflow.sleep(timedelta(milliseconds=1))\n" + APPLY


def copy_tree(dest: Path) -> Path:
    """This tree's files (tracked and new, as they are now) in `dest`: a target checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout  # fmt: skip
    for rel in filter(None, listed.decode().split("\0")):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    marker = dest / "libs/eventos/src/eventos/fleet/__init__.py"
    marker.write_text(marker.read_text() + f"# release marker: {dest.name}\n")
    return dest


@dataclass
class Instance:
    root: Path
    process: subprocess.Popen[bytes]
    output: Path

    def stack(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.root / ".eventos/stack.json").read_text())
        return doc

    def upgrade(self, target: Path, *extra: str, **env: str) -> tuple[int, dict[str, Any]]:
        argv = [str(Path(sys.executable).parent / "eventosctl"), "upgrade", "--to", str(target),
                "-o", "json", *extra]  # fmt: skip
        done = subprocess.run(argv, cwd=self.root, capture_output=True, text=True,
                              timeout=UPGRADE_S, env={**os.environ, **env})  # fmt: skip
        assert done.stdout.strip(), done.stderr
        with (self.root / "outcomes.jsonl").open("a") as kept:  # the figures, for a reader
            kept.write(done.stdout.replace("\n", " ") + "\n")
        return done.returncode, json.loads(done.stdout)

    def hook_url(self) -> str:
        """The `hello` employee's webhook on the ingress (read again: it moves on restart)."""
        return str(self.stack()["ingress_url"]) + "/hooks/hello"

    def builds(self) -> dict[str, str]:
        """The build each service's /readyz names, for those answering ready."""
        found = {}
        for name, svc in self.stack()["services"].items():
            answer = httpx.get(svc["http"] + "/readyz", timeout=10)
            if answer.status_code == 200:
                found[name] = answer.json()["release"]["build"]
        return found

    def rows(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with psycopg.connect(self.stack()["database"]["url"], row_factory=dict_row) as conn:
            return conn.execute(query, params or {}).fetchall()


@contextlib.contextmanager
def running_instance(
    root: Path, *args: str, ready_s: float = READY_S, **env: str
) -> Iterator[Instance]:
    """`python -m eventos.local` with the examples in `root` (`args` and `env` added), ready;
    stopped, and whatever it left running killed, afterwards."""
    output = root / "localstack.out"
    env = {**{k: v for k, v in os.environ.items() if k not in AMBIENT}, **env}
    with output.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "eventos.local", "--examples", str(EXAMPLES), *args],
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    running = Instance(root, process, output)

    def summary() -> bool:
        assert process.poll() is None, output.read_text()
        return "Try:" in output.read_text()

    try:
        wait_for_sync(summary, timeout=ready_s, interval=0.5, what="the local instance ready")
        yield running
    finally:
        pids: set[int] = set()
        with contextlib.suppress(OSError, ValueError):
            pids = {int(p) for n, p in running.stack()["pids"].items() if p and n != "localstack"}
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
        for pid in pids:
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Instance]:
    with running_instance(tmp_path_factory.mktemp("upgrade-instance")) as running:
        yield running


@pytest.fixture(scope="module")
def next_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tree(tmp_path_factory.mktemp("next"))


@pytest.fixture(scope="module")
def nondeterministic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = copy_tree(tmp_path_factory.mktemp("nondeterministic"))
    code = (target / SUPERVISOR).read_text()
    assert APPLY in code, "the supervisor's first activity moved: update the test's patch"
    (target / SUPERVISOR).write_text(code.replace(APPLY, NONDETERMINISTIC, 1))
    return target


def keys(event_ids: list[str]) -> list[str]:
    """The inbox's dedupe keys of webhook events by their X-Event-Id (the ingress's `h:`)."""
    return [f"h:{e}" for e in event_ids]


@pytest.fixture(scope="module")
def migrating(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A target with one more migration (a table the previous release does not know)."""
    target = copy_tree(tmp_path_factory.mktemp("migrating"))
    folder = target / MIGRATIONS
    level = max(int(p.name.split("_", 1)[0]) for p in folder.glob("*.sql"))
    (folder / f"{level + 1:04d}_upgrade_drill.sql").write_text(
        "CREATE TABLE upgrade_drill (id integer PRIMARY KEY);\n"
    )
    return target


def consumed_once(instance: Instance, event_ids: list[str]) -> bool:
    """Every event appended once, routed once, and its delivery consumed (done)."""
    event_ids = keys(event_ids)
    found = instance.rows(
        "SELECT i.dedupe_key, i.status, array_agg(d.status) AS deliveries FROM bus_ingress i "
        "LEFT JOIN bus_deliveries d ON d.ingress_id = i.id "
        "WHERE i.dedupe_key = ANY(%(ids)s) GROUP BY i.id, i.dedupe_key, i.status",
        {"ids": event_ids},
    )
    appended = [r["dedupe_key"] for r in found]
    assert len(appended) == len(set(appended)), "an event appended twice"
    assert all(len(r["deliveries"]) == 1 for r in found), f"routed more than once: {found}"
    return sorted(appended) == sorted(event_ids) and all(
        r["status"] == "routed" and r["deliveries"] == ["done"] for r in found
    )


def wait_consumed(instance: Instance, event_ids: list[str]) -> None:
    """Every acknowledged event consumed once, or what is not, in the failure."""
    try:
        wait_for_sync(lambda: consumed_once(instance, event_ids), timeout=CONSUMED_S,
                      what=f"the {len(event_ids)} acknowledged events consumed once")  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{leftovers(instance, event_ids)}") from None


def leftovers(instance: Instance, event_ids: list[str]) -> str:
    """What is not settled yet, for a failure message."""
    queries = (
        "SELECT i.status, d.status AS delivery, count(*) FROM bus_ingress i "
        "LEFT JOIN bus_deliveries d ON d.ingress_id = i.id WHERE i.dedupe_key = ANY(%(ids)s) "
        "GROUP BY 1, 2",
        "SELECT stream_key, delivered_seq, consumed_seq, next_seq, hold_reason FROM bus_streams",
        "SELECT id, status FROM turns ORDER BY started_at DESC LIMIT 5",
        "SELECT kind, ref, detail FROM attention_items",
    )
    found = [f"{q}: {instance.rows(q, {'ids': keys(event_ids)})}" for q in queries]
    missing = set(keys(event_ids)) - {r["dedupe_key"] for r in instance.rows(
        "SELECT dedupe_key FROM bus_ingress WHERE dedupe_key = ANY(%(ids)s)",
        {"ids": keys(event_ids)})}  # fmt: skip
    return "\n".join([*found, f"acknowledged, never appended: {sorted(missing)}"])


def steps(outcome: dict[str, Any]) -> dict[str, bool]:
    return {s["name"]: s["ok"] for s in outcome["steps"]}


def drilled_upgrade(
    instance: Instance, target: Path, label: str
) -> tuple[int, dict[str, Any], list[str]]:
    """An upgrade to `target` with the readiness drill while a sender posts webhooks before,
    during and after it; the exit code, the outcome and the events acknowledged."""
    sender = WebhookSender(instance.hook_url, label).start(acked=3)
    try:
        code, outcome = instance.upgrade(
            target, "--inject-readiness-failure", EVENTOS_UPGRADE_READY_S="20"
        )
        sender.wait_acked(3, timeout_s=60)  # after the rollback
    finally:
        acked = sender.stop()
    return code, outcome, acked


def test_eg16_a_forced_readiness_failure_rolls_back_by_itself(
    instance: Instance, next_release: Path
) -> None:
    before = instance.builds()
    assert set(before) == set(names.SERVICES) and len(set(before.values())) == 1
    code, outcome, acked = drilled_upgrade(instance, next_release, "eg16")

    assert (code, outcome["outcome"]) == (6, "rolled_back"), json.dumps(outcome, indent=1)
    assert steps(outcome)["ready"] is False and steps(outcome)["rollback_ready"] is True
    # The workers of the failed release never polled, its ingress acknowledged nothing.
    assert "start_workers" not in steps(outcome) and "start_ingress" not in steps(outcome)
    assert outcome["restored"] is False  # no migration ran, no workflow task completed
    assert outcome["from"] != outcome["to"]
    old = outcome["releases"]["from"]["build"]
    assert instance.builds() == dict.fromkeys(names.SERVICES, old)  # the old release answers
    wait_consumed(instance, acked)
    items = instance.rows("SELECT kind, ref FROM attention_items WHERE kind = %(k)s",
                          {"k": names.ATTENTION_UPGRADE_ROLLED_BACK})  # fmt: skip
    assert items == [{"kind": "upgrade_rolled_back", "ref": f"upgrade:{outcome['to']}"}]


def test_a_target_that_migrated_and_failed_is_rolled_back_onto_the_snapshot(
    instance: Instance, migrating: Path
) -> None:
    level = instance.rows("SELECT max(version) AS v FROM schema_migrations")[0]["v"]
    code, outcome, acked = drilled_upgrade(instance, migrating, "restore")

    assert (code, outcome["outcome"]) == (6, "rolled_back"), json.dumps(outcome, indent=1)
    assert outcome["restored"] is True and steps(outcome)["restore"] is True
    assert outcome["releases"]["to"]["migrations"] == level + 1
    assert instance.rows("SELECT max(version) AS v FROM schema_migrations")[0]["v"] == level
    assert instance.rows("SELECT to_regclass('upgrade_drill') AS t") == [{"t": None}]
    old = outcome["releases"]["from"]["build"]
    assert instance.builds() == dict.fromkeys(names.SERVICES, old)
    wait_consumed(instance, acked)


def test_an_upgrade_replays_the_open_runs_and_runs_the_new_release(
    instance: Instance, next_release: Path
) -> None:
    code, outcome = instance.upgrade(next_release)

    assert (code, outcome["outcome"]) == (0, "upgraded"), outcome
    assert all(s["ok"] for s in outcome["steps"]), outcome
    assert outcome["replayed"] >= 1 and outcome["needs_reset"] == []  # hello's supervisor
    new = outcome["releases"]["to"]["build"]
    assert instance.builds() == dict.fromkeys(names.SERVICES, new)
    sender = WebhookSender(instance.hook_url, "after-upgrade").start(acked=2)
    acked = sender.stop()
    wait_consumed(instance, acked)
    # The next window with the same target: nothing to do, nothing stopped.
    code, again = instance.upgrade(next_release)
    assert (code, again["outcome"]) == (0, "current"), again
    assert [s["name"] for s in again["steps"]] == ["current", "install"], again
    assert instance.builds() == dict.fromkeys(names.SERVICES, new)


def test_a_run_that_cannot_replay_marks_its_generation_needs_reset(
    instance: Instance, nondeterministic: Path
) -> None:
    (live,) = instance.rows(
        "SELECT generation FROM generations WHERE employee = 'hello' AND state = %(s)s",
        {"s": names.GEN_RUNNING},
    )
    code, outcome = instance.upgrade(nondeterministic)

    assert (code, outcome["outcome"]) == (0, "upgraded"), outcome
    supervisor = names.supervisor_id("hello", live["generation"])
    assert outcome["needs_reset"] == [
        {"employee": "hello", "generation": live["generation"], "workflows": [supervisor]}
    ]
    new = outcome["releases"]["to"]["build"]
    assert instance.builds() == dict.fromkeys(names.SERVICES, new)
    doc = instance.stack()
    listed = httpx.get(f"{doc['ingress_url']}/v1/attention", timeout=10,
                       headers={"Authorization": f"Bearer {doc['admin_token']}"}).json()  # fmt: skip
    items = [(i["employee"], i["severity"], i["ref"], i["actions"]) for i in listed["attention"]
             if i["kind"] == names.ATTENTION_NEEDS_RESET]  # fmt: skip
    assert items == [("hello", "error", supervisor, [names.ACTION_RESET])]
