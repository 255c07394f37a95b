"""Faults on the cluster (issue 28, point 6): bench/faults.py's run against a tier S release.

The release (namespace eventos-faults, bundled PostgreSQL) takes the fault run's steady mixed
load from the host — signed webhooks, owner chat from two users and the admin with tool calls,
driver events over gRPC, Telegram customers — while a seeded schedule deletes each role's pods
with no grace (`kubectl delete pod --grace-period=0 --force`), one role at a time, every role
twice, and PostgreSQL's pod once, each once the release is whole again. Then the load stops,
the run drains, and the ledger adds up everything acknowledged, consumed, replied and done
against the release's database (docs/faults.md says what each line checks).

The load reaches ingress at its Service's ClusterIP, which the host routes to the bridge and
kube-proxy translates: unlike a port-forward it outlives the deletion of the ingress pod. The
Telegram Bot API fake and the tool calls' effect server listen on the host's bridge address,
which the pods reach. The ledger reads the database through a port-forward opened after the
faults. Printed (read with -rP): the plan, the faults as done, the ledger, the durations.

    EVENTOS_K8S_REUSE=1 .venv/bin/pytest -q -m k8s -p no:xdist tests/k8s/test_faults_on_cluster.py -rP
    EVENTOS_FAULT_SEED=<n> …   # another schedule and load
    EVENTOS_FAULT_KEEP=1 …      # leave the release up when the ledger does not add up

When a line does not add up, the logs of the pods alive at the end are written beside the
test's ledger (its tmp_path, which pytest keeps for a failed test).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from k8s_faults import POSTGRES, ClusterTarget, database_url
from k8s_release import Release

from eventos import names
from eventos.client.owner_api import OwnerClient
from eventos.local.examples import apply_examples
from eventos.settings import SecretStore
from eventos.testing import wait_for_sync

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import faults
from faults_book import CHANNELS
from faults_load import ACCOUNT, SECRETS, TELEGRAM_LATENCY_S, EffectTarget, Rates, secret_env, specs
from faults_schedule import KILL, LOSE, Profile
from harness import progress

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_telegram import FakeTelegram

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(1800)]
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once

NAMESPACE = "eventos-faults"
SEED = int(os.environ.get("EVENTOS_FAULT_SEED", "28"))
BRIDGE = "10.244.0.1"  # the host on the pods' bridge (docs/cluster.md)
HTTP_PORT, GRPC_PORT = 8080, 9090  # the ingress Service's ports (the chart's defaults)
# Every role's pods deleted twice and PostgreSQL's once; the plan spaces them over 2.5 minutes,
# but each fault waits until the release is whole again, which sets the pace on this node.
PROFILE = Profile(2.5, kills_each=2, postgres_losses=1, temporal_losses=0, postgres_s=0.0)
# Half the local run's rates: the node's 2 cores also run the cluster and the other tests.
RATES = Rates(webhooks=0.9, driver=0.4, chat=0.08, telegram=0.25)
DRAIN_S = 300.0
START_S = 180.0  # the employees' first generations running
KEEP = os.environ.get("EVENTOS_FAULT_KEEP") == "1"
NOT_OK: list[str] = []  # ledgers that did not add up (the fixture keeps the release then)


@pytest.fixture(scope="module")
def release(cluster: Cluster) -> Iterator[Release]:
    """The release, installed by the test (its values name the fakes it starts); removed with
    its namespace at the end, whatever happened."""
    release = Release(cluster, "fx", NAMESPACE, "S")
    yield release
    print(release.kubectl("get", "pods", "-o", "wide", check=False))
    if KEEP and NOT_OK:
        print(f"kept: namespace {NAMESPACE} (remove it with `kubectl delete namespace`)")
        return
    release.uninstall()


def test_deleting_every_roles_pods_and_the_database_loses_nothing_and_does_nothing_twice(
    release: Release, tmp_path: Path
) -> None:
    config = faults.Config(SEED, PROFILE, rates=RATES, drain_s=DRAIN_S)
    started = time.monotonic()
    result = asyncio.run(run_on_cluster(config, release, tmp_path))
    print(f"seed {SEED}: {len(result.done)} faults, {time.monotonic() - started:.0f} s in all "
          f"(install {release.install_s:.0f} s)")  # fmt: skip
    for done in result.done:
        up = f", serving again after {done.up - done.began:4.1f} s" if done.up else ""
        print(f"  {done.fault}  gone after {done.down - done.began:4.1f} s{up}, whole again "
              f"after {done.back - done.began:4.1f} s")  # fmt: skip
    restart = ClusterTarget(release).logs(POSTGRES).split("ready to accept connections")[0]
    print(f"PostgreSQL's log since its pod was deleted:\n{restart}ready to accept connections")
    print(result.ledger.render())
    (tmp_path / "ledger.txt").write_text(result.ledger.render())
    if not result.ledger.ok:
        print(f"logs of the pods alive at the end: {save_logs(release, tmp_path / 'logs')}")
        NOT_OK.append(result.ledger.render())
    replay = f"replay: EVENTOS_FAULT_SEED={SEED} … {__file__}"
    kills = collections.Counter(d.fault.target for d in result.done if d.fault.kind == KILL)
    losses = collections.Counter(d.fault.target for d in result.done if d.fault.kind == LOSE)
    assert kills == dict.fromkeys(names.SERVICES, 2), (kills, replay)
    assert losses == {POSTGRES: 1}, (losses, replay)
    assert len(result.done) == len(result.faults), (result.done, replay)
    assert set(result.acked) == set(CHANNELS), (result.acked, replay)  # every sender got through
    assert result.ledger.ok, f"{replay}\n{result.ledger.render()}"


async def run_on_cluster(config: faults.Config, release: Release, workdir: Path) -> faults.Result:
    """The fakes on the bridge, the release installed and its employees started, then the run."""
    fake = FakeTelegram()
    fake.host = BRIDGE
    await fake.start()
    try:
        bot = fake.add_bot("fx_shop_bot")
        fake.send_latency_s = TELEGRAM_LATENCY_S
        with EffectTarget(config.seed, BRIDGE) as effects:
            await asyncio.to_thread(install, release, fake.base_url, bot, workdir)
            stage = cluster_stage(release)
            await asyncio.to_thread(start_employees, stage, bot, workdir)
            return await faults.load_and_faults(config, stage, fake, bot, effects, workdir)
    finally:
        await fake.stop()


def install(release: Release, telegram_api: str, bot: str, workdir: Path) -> None:
    """Tier S with the run's settings in every service and its secrets as the employees'."""
    values = workdir / "values-faults.yaml"  # JSON is YAML: every value stays a string
    # The fakes listen on the bridge, a private address: the egress policy lets the roles reach
    # it only as an operator's listed peer (networkPolicy.egress.to).
    bridge = {"to": [{"ipBlock": {"cidr": f"{BRIDGE}/32"}}]}
    values.write_text(json.dumps({"defaults": {"env": faults.service_env(telegram_api)},
                                  "networkPolicy": {"egress": {"to": [bridge]}}}))  # fmt: skip
    progress(f"installing tier S in {release.namespace}")
    release.install(values=[values], employee_secrets={**SECRETS, ACCOUNT: bot})
    progress(f"installed in {release.install_s:.0f} s")


def cluster_stage(release: Release) -> faults.Stage:
    """The release as the run's stage: ingress at its ClusterIP, the roles as the victims."""
    ip = release.service_ip("ingress")
    target = ClusterTarget(release, progress)

    def late_tasks() -> dict[str, int]:
        return {role: target.logs(role).count(faults.LATE_TASK) for role in names.SERVICES}

    return faults.Stage(f"http://{ip}:{HTTP_PORT}", f"{ip}:{GRPC_PORT}", release.admin_token,
                        target, list(names.SERVICES), lambda: database_url(release),
                        late_tasks)  # fmt: skip


def save_logs(release: Release, folder: Path) -> Path:
    """Each pod's log as it is now, one file per pod."""
    folder.mkdir(parents=True, exist_ok=True)
    for pod in release.pods():
        name = pod["metadata"]["name"]
        (folder / f"{name}.log").write_text(release.kubectl("logs", name, "--tail=-1",
                                                           check=False))  # fmt: skip
    return folder


def start_employees(stage: faults.Stage, bot: str, workdir: Path) -> None:
    """The run's three employees applied and started through ingress, as `make run` does."""
    folder = workdir / "employees"
    folder.mkdir()
    for name, text in specs(BRIDGE).items():
        (folder / f"{name}.yaml").write_text(text)
    store = SecretStore(env=secret_env(bot))
    outcomes = apply_examples(folder, stage.ingress_url, stage.admin_token, store)
    assert {o.state for o in outcomes} <= {"running", "starting"}, [o.describe() for o in outcomes]
    with OwnerClient(stage.ingress_url, stage.admin_token) as client:  # a loaded node is slow

        def starting() -> list[str]:
            return [o.name for o in outcomes if client.get(o.name)["state"] != "running"]

        wait_for_sync(lambda: not starting(), timeout=START_S, interval=1,
                      what="the employees running")  # fmt: skip
