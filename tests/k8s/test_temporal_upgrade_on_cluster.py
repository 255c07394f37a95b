"""The upgrader's Temporal step on the cluster (issue 29, point 2): tier L installed by the chart
with its Temporal server on the previous minor (values-eventos-temporal-previous.yaml of `make
images`), its weekly upgrade CronJob targeting the same service images under another tag, which
pin the Makefile's Temporal version (EVENTOS_TEMPORAL_PIN), the `hello` employee running and
webhooks posted before, during and after each upgrade.

1. The CronJob's Job with `--inject-readiness-failure` exits 6 `rolled_back`: the schema step
   and the server's move ran, the snapshot (Temporal's databases with the app's) is restored,
   Temporal is back on the previous version (its Deployment's images and the server's own
   answer), every acknowledged event is consumed once.
2. The CronJob's Job as it is exits 0 `upgraded`, steps temporal_schema and temporal_server ok:
   the server answers with the pinned version, every service on the new tag, every
   acknowledged event consumed once.

Each Job's outcome JSON is printed: read with -rP.

    EVENTOS_K8S_REUSE=1 .venv/bin/pytest -q -m k8s -p no:xdist \
        tests/k8s/test_temporal_upgrade_on_cluster.py -rP
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from k8s_release import IMAGE_VALUES, Release, chat
from test_upgrade_on_cluster import (
    SERVICES,
    consumed_once,
    job_from_cronjob,
    service_pods,
    steps,
    tag_the_next,
    tags,
    upgrade_under_load,
)

from eventos.fleet.checks import temporal_serves
from eventos.settings import TemporalSettings
from eventos.testing import wait_for_sync

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(2400)]
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once

NAMESPACE = "eventos-temporal-upgrade"
NAME = "tup"
PREFIX = f"{NAME}-eventos"
PREVIOUS_VALUES = IMAGE_VALUES.parent / "values-eventos-temporal-previous.yaml"
# One pod a role and a class (tier L's values ask 2-3 and 1-2): the steps are the same, the
# install and each upgrade's stops and rollouts shorter on one loaded node.
ONE_REPLICA = [*(f"roles.{r}.replicas=1" for r in ("ingress", "router", "relay", "workersWorkflow",
                                                   "egress")),
               "llmClasses.c1.minReplicas=1", "llmClasses.c2.minReplicas=1"]  # fmt: skip
SERVES_S = 60.0  # the server answering on its version, through a port-forward
DRILL_READY_S = "45"  # how long the drilled target has to answer ready (it never does)


def versions() -> tuple[str, str]:
    """The Temporal version the instance starts on, and the one the images pin."""
    previous = json.loads(PREVIOUS_VALUES.read_text())["temporal"]["server"]["image"]
    pinned = json.loads(IMAGE_VALUES.read_text())["temporal"]["server"]["image"]
    return previous.rpartition(":")[2], pinned.rpartition(":")[2]


@pytest.fixture(scope="module")
def release(cluster: Cluster) -> Iterator[Release]:
    """Tier L on the previous Temporal minor with the upgrade CronJob (target: the next tag),
    `hello` started; removed with its namespace at the end."""
    _, following = tags()
    tag_the_next(cluster)
    up = Release(cluster, NAME, NAMESPACE, "L")
    try:
        out = up.install("upgrades.enabled=true", f"upgrades.targetTag={following}",
                         "upgrades.readySeconds=240", *ONE_REPLICA, values=[PREVIOUS_VALUES])  # fmt: skip
        print(f"helm install (tier L, Temporal {versions()[0]}): {up.install_s:.0f} s\n"
              f"{out[-600:]}")  # fmt: skip
        chat(up, "hello before the upgrades")
        yield up
    finally:
        print(up.kubectl("get", "pods,jobs", "-o", "wide", check=False))
        up.uninstall()


def temporal_images(up: Release) -> tuple[str, str]:
    """The tags of the Temporal Deployment's server image and of its schema step's."""
    found = json.loads(up.kubectl("get", "deployment", f"{PREFIX}-temporal", "-o", "json"))
    spec = found["spec"]["template"]["spec"]
    (server,) = [c for c in spec["containers"] if c["name"] == "temporal"]
    (schema,) = [c for c in spec["initContainers"] if c["name"] == "schema"]
    return server["image"].rpartition(":")[2], schema["image"].rpartition(":")[2]


def serves_on(up: Release, version: str) -> bool:
    """Whether the Temporal server, through a forward, serves the namespace on `version`
    (UpgradeError naming what it answers otherwise)."""
    with up.forward("temporal", 7233) as port:
        settings = TemporalSettings(address=f"127.0.0.1:{port}", namespace="default")
        asyncio.run(temporal_serves(settings, version, SERVES_S))
    return True


def every_service_on(up: Release, tag: str) -> bool:
    """Every service pod (tier L: the four LLM classes too) on `tag` and Ready."""
    pods = service_pods(up)
    deployments = {n.rsplit("-", 2)[0] for n in pods}
    return len(deployments) == len(SERVICES) + 3 and all(p == (tag, True) for p in pods.values())


def test_the_drilled_upgrade_restores_temporal_on_its_previous_version(release: Release) -> None:
    current, following = tags()
    previous, pinned = versions()
    assert temporal_images(release) == (previous, previous)
    assert serves_on(release, previous)
    drill = ("--inject-readiness-failure",)
    code, outcome, acked = upgrade_under_load(release, "upgrade-drill", lambda: job_from_cronjob(
        release, f"{PREFIX}-upgrade", "upgrade-drill", drill,
        {"EVENTOS_UPGRADE_READY_S": DRILL_READY_S}))  # fmt: skip

    assert (code, outcome["outcome"]) == (6, "rolled_back"), outcome
    assert (outcome["from"], outcome["to"]) == (current, following)
    releases = outcome["releases"]
    assert (releases["from"]["temporal"], releases["to"]["temporal"]) == (previous, pinned)
    done = steps(outcome)
    assert done["temporal_schema"] and done["temporal_server"], outcome
    assert done["ready"] is False and done["rollback_temporal"] and done["rollback_ready"]
    assert outcome["restored"] is True  # Temporal's schema moved: the snapshot is restored
    assert temporal_images(release) == (previous, previous)
    assert serves_on(release, previous)
    assert every_service_on(release, current), service_pods(release)
    consumed_once(release, acked)
    print(f"{len(acked)} events acknowledged around the drill, each consumed once")


def test_the_upgrade_moves_temporal_one_minor_then_the_services(release: Release) -> None:
    _, following = tags()
    previous, pinned = versions()
    from_cronjob = ("create", "job", f"--from=cronjob/{PREFIX}-upgrade", "upgrade-now")
    code, outcome, acked = upgrade_under_load(
        release, "upgrade-now", lambda: release.kubectl(*from_cronjob)
    )

    assert (code, outcome["outcome"]) == (0, "upgraded"), outcome
    assert all(s["ok"] for s in outcome["steps"]), outcome
    names = [s["name"] for s in outcome["steps"]]
    assert names.index("snapshot") < names.index("temporal_schema") < names.index(
        "temporal_server") < names.index("migrate")  # fmt: skip
    assert outcome["releases"]["to"]["temporal"] == pinned != previous
    assert temporal_images(release) == (pinned, pinned)
    assert serves_on(release, pinned)
    wait_for_sync(lambda: every_service_on(release, following) or None, timeout=120,
                  what=f"every service on {following}")  # fmt: skip
    consumed_once(release, acked)
    print(f"{len(acked)} events acknowledged around the upgrade, each consumed once")
