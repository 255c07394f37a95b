"""The Temporal step of the upgrade (issue 29 point 2, docs/upgrades.md): a tier L local instance
started on the previous minor of the Temporal server (the Makefile's TEMPORAL_PREVIOUS_VERSION,
which `make test` builds) is upgraded to a checkout pinning TEMPORAL_SERVER_VERSION.

One `python -m eventos.local --tier L` runs for the module, its server on the previous minor.
First a target whose readiness is made to fail: after the schema tool and the new server ran, the
rollback restores the snapshot (Temporal's databases with it), puts the previous server back and
the old release answers. Then the same target without the failure: the server moves one minor
and the open runs replay on it. A webhook sender posts throughout, as a provider does; every
event acknowledged before and during each attempt is consumed once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import E2E_TIMEOUT_S
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from test_upgrade import (
    Instance,
    copy_tree,
    drilled_upgrade,
    running_instance,
    steps,
    wait_consumed,
)

from eventos.fleet.releases import TEMPORAL_PIN, makefile_pin
from eventos.settings import CHART_VAR, TEMPORAL_SERVER_VERSION_VAR, TOOLS_BIN_VAR
from eventos.testing.webhooks import WebhookSender

pytestmark = [pytest.mark.stack, pytest.mark.tier_l, pytest.mark.timeout(E2E_TIMEOUT_S)]

ROOT = Path(__file__).resolve().parents[2]
PINNED = makefile_pin(ROOT, TEMPORAL_PIN)
PREVIOUS = makefile_pin(ROOT, "TEMPORAL_PREVIOUS_VERSION")
# Tier L sets up Temporal's two databases (64 shards) and starts nine processes.
TIER_L_READY_S = 300.0


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Instance]:
    tools = {TOOLS_BIN_VAR: str(ROOT / ".tools" / "bin"),
             CHART_VAR: str(ROOT / "deploy" / "helm" / "eventos"),
             TEMPORAL_SERVER_VERSION_VAR: PREVIOUS}  # fmt: skip
    root = tmp_path_factory.mktemp("temporal-upgrade")
    with running_instance(root, "--tier", "L", ready_s=TIER_L_READY_S, **tools) as running:
        yield running


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This tree (its Makefile pins TEMPORAL_SERVER_VERSION) with a marker: another build."""
    return copy_tree(tmp_path_factory.mktemp("next-temporal"))


def server_version(instance: Instance) -> str:
    """What the instance's Temporal server says it runs (GetSystemInfo)."""
    address = str(instance.stack()["temporal"]["address"])

    async def ask() -> str:
        client = await Client.connect(address)
        info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
        return info.server_version

    return asyncio.run(ask())


def answers_on(instance: Instance, build: str) -> None:
    """Every process of the instance answers ready on `build`."""
    assert instance.builds() == dict.fromkeys(instance.stack()["services"], build)


def shown(outcome: dict[str, Any]) -> str:
    """The outcome, kept beside the instance (outcomes.jsonl) and in the failure message."""
    return json.dumps(outcome, indent=1)


def test_a_failed_target_restores_temporal_and_the_previous_server(
    instance: Instance, target: Path
) -> None:
    assert PREVIOUS and PINNED and PREVIOUS != PINNED
    assert server_version(instance) == PREVIOUS == instance.stack()["temporal"]["version"]
    code, outcome, acked = drilled_upgrade(instance, target, "temporal-drill")

    assert (code, outcome["outcome"]) == (6, "rolled_back"), shown(outcome)
    done = steps(outcome)
    assert done["temporal_schema"] and done["temporal_server"], shown(outcome)
    assert done["ready"] is False and "start_workers" not in done
    assert done["restore"] and done["rollback_temporal"] and done["rollback_ready"]
    assert outcome["restored"] is True
    assert outcome["releases"]["from"]["temporal"] == PREVIOUS
    assert outcome["releases"]["to"]["temporal"] == PINNED
    assert server_version(instance) == PREVIOUS == instance.stack()["temporal"]["version"]
    answers_on(instance, outcome["releases"]["from"]["build"])
    wait_consumed(instance, acked)


def test_an_upgrade_moves_temporal_one_minor_and_replays_the_open_runs(
    instance: Instance, target: Path
) -> None:
    assert server_version(instance) == PREVIOUS
    sender = WebhookSender(instance.hook_url, "temporal-upgrade").start(acked=3)
    try:
        code, outcome = instance.upgrade(target)
        sender.wait_acked(3, timeout_s=60)  # on the new release
    finally:
        acked = sender.stop()

    assert (code, outcome["outcome"]) == (0, "upgraded"), shown(outcome)
    assert all(s["ok"] for s in outcome["steps"]), shown(outcome)
    order = [s["name"] for s in outcome["steps"]]
    at = order.index("snapshot")
    assert order[at + 1 : at + 3] == ["temporal_schema", "temporal_server"], order
    assert outcome["replayed"] >= 1 and outcome["needs_reset"] == []  # hello's supervisor
    assert server_version(instance) == PINNED == instance.stack()["temporal"]["version"]
    answers_on(instance, outcome["releases"]["to"]["build"])
    wait_consumed(instance, acked)
