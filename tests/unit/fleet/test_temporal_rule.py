"""The upgrader moves the Temporal server at most one minor forward (docs/upgrades.md): the rule
table, and the steps and rollback of a move, against an instance that records what it is asked."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import pytest

from eventos.fleet.releases import (
    TEMPORAL_PIN,
    LocalRelease,
    ReleaseRequest,
    TemporalPin,
    makefile_pin,
    read_request,
    write_request,
)
from eventos.fleet.upgrade import (
    ABORTED,
    CURRENT,
    ROLLED_BACK,
    UPGRADED,
    GateReport,
    NeedsReset,
    ReleaseRef,
    UpgradeError,
    temporal_rule,
    upgrade,
)


@pytest.mark.parametrize(
    ("current", "target", "refused"),
    [
        ("1.31.5", "1.32.0", ""),  # the next minor
        ("1.32.0", "1.32.2", ""),  # a patch
        ("1.32.0", "1.32.0", ""),  # no move
        ("", "1.32.0", ""),  # tier S: the dev server is not the upgrader's to move
        ("1.32.0", "", ""),  # a target pinning none
        ("1.30.9", "1.32.0", "one minor at a time, upgrade to a release pinning 1.31.x first"),
        ("1.32.0", "1.31.5", "Temporal is never downgraded"),
        ("1.32.2", "1.32.0", "Temporal is never downgraded"),
        ("1.32.0", "2.0.0", "Temporal moves within its major version only"),
        ("1.32.0", "next", "cannot compare the Temporal server versions"),
    ],
)
def test_the_temporal_rule(current: str, target: str, refused: str) -> None:
    said = temporal_rule(current, target)
    if refused:
        assert refused in said and current in said and target in said
    else:
        assert said == ""


def test_the_makefile_pins_a_server_its_previous_minor_may_move_to() -> None:
    root = Path(__file__).resolve().parents[3]
    pinned, previous = (
        makefile_pin(root, TEMPORAL_PIN),
        makefile_pin(root, "TEMPORAL_PREVIOUS_VERSION"),
    )
    assert pinned and previous and pinned != previous
    assert temporal_rule(previous, pinned) == ""
    assert makefile_pin(root / "nowhere", TEMPORAL_PIN) == ""


def test_a_release_request_carries_the_temporal_server_it_asks_for(tmp_path: Path) -> None:
    pin = TemporalPin("1.32.0", "/x/.tools/temporal-server/v1.32.0", running=False)
    asked = ReleaseRequest(3, LocalRelease("n", "/src", "/py"), {"A": "1"}, ["relay"], pin)
    write_request(tmp_path, asked)
    assert read_request(tmp_path) == asked
    write_request(tmp_path, ReleaseRequest(4))
    assert read_request(tmp_path) == ReleaseRequest(4, temporal=None)


def ref(name: str, temporal: str) -> ReleaseRef:
    return ReleaseRef(name, f"/src/{name}", f"build-{name}", 40, temporal)


@dataclass
class Recorded:
    """An instance that does what it is asked and records it; `ready` fails on `failing`."""

    old: ReleaseRef
    new: ReleaseRef
    failing: str = ""
    calls: list[str] = field(default_factory=list)

    async def current(self) -> ReleaseRef:
        return self.old

    async def install(self, target: str) -> ReleaseRef:
        return self.new

    async def stop(self) -> None:
        self.calls.append("stop")

    async def snapshot(self) -> str:
        self.calls.append("snapshot")
        return "snap-1"

    async def restore(self, snapshot: str) -> None:
        self.calls.append(f"restore {snapshot}")

    async def update_temporal_schema(self, release: ReleaseRef) -> None:
        self.calls.append(f"schema {release.temporal}")

    async def start_temporal(self, release: ReleaseRef, timeout_s: float) -> None:
        self.calls.append(f"temporal {release.temporal}")

    async def migrate(self, release: ReleaseRef) -> list[str]:
        return []

    async def replay(self, release: ReleaseRef) -> GateReport:
        return GateReport(1, [])

    async def start(self, release: ReleaseRef, services: tuple[str, ...], drill: bool) -> None:
        self.calls.append(f"start {release.name} {','.join(services)}")

    async def ready(self, release: ReleaseRef, services: tuple[str, ...], timeout_s: float) -> None:
        if release.name == self.failing:
            raise UpgradeError(f"not ready on {release.name}")

    async def workflow_task_completed_since(self, since: datetime) -> bool:
        return False

    async def generations_of(self, workflow_ids: list[str]) -> list[NeedsReset]:
        return []


def test_a_move_runs_the_schema_tool_then_the_server_after_the_snapshot() -> None:
    inst = Recorded(ref("a", "1.31.5"), ref("b", "1.32.0"))
    out = asyncio.run(upgrade(inst, "b"))
    assert out.outcome == UPGRADED, out.as_json()
    assert inst.calls[:4] == ["stop", "snapshot", "schema 1.32.0", "temporal 1.32.0"]
    names = [s.name for s in out.steps]
    assert names[names.index("snapshot") + 1 : names.index("snapshot") + 3] == [
        "temporal_schema",
        "temporal_server",
    ]
    assert out.as_json()["releases"]["to"]["temporal"] == "1.32.0"


def test_a_failed_target_after_a_move_restores_and_starts_the_old_server_first() -> None:
    inst = Recorded(ref("a", "1.31.5"), ref("b", "1.32.0"), failing="b")
    out = asyncio.run(upgrade(inst, "b", drill=True))
    assert (out.outcome, out.restored) == (ROLLED_BACK, True), out.as_json()
    rollback = inst.calls[inst.calls.index("restore snap-1") :]
    assert rollback[:2] == ["restore snap-1", "temporal 1.31.5"]
    assert rollback[2].startswith("start a ")
    assert [s.name for s in out.steps][-4:] == [
        "restore",
        "rollback_temporal",
        "rollback_start",
        "rollback_ready",
    ]


@pytest.mark.parametrize(("current", "target"), [("1.32.0", "1.32.0"), ("", "1.32.0")])
def test_no_move_no_temporal_step_and_no_restore(current: str, target: str) -> None:
    inst = Recorded(ref("a", current), ref("b", target), failing="b")
    out = asyncio.run(upgrade(inst, "b", drill=True))
    assert (out.outcome, out.restored) == (ROLLED_BACK, False)
    assert not [c for c in inst.calls if c.startswith(("schema", "temporal", "restore"))]


def test_a_refused_move_changes_nothing() -> None:
    inst = Recorded(ref("a", "1.30.1"), ref("b", "1.32.0"))
    out = asyncio.run(upgrade(inst, "b"))
    assert (out.outcome, out.exit_code) == (ABORTED, 8)
    assert "1.30.1" in out.reason and "1.32.0" in out.reason and "1.31.x" in out.reason
    assert inst.calls == []


def test_a_target_the_instance_already_runs_changes_nothing() -> None:
    """The weekly window with an unchanged target: `current`, exit 0, nothing stopped."""
    inst = Recorded(ref("a", "1.32.0"), ref("a", "1.32.0"))
    out = asyncio.run(upgrade(inst, "a"))
    assert (out.outcome, out.exit_code, inst.calls) == (CURRENT, 0, []), out.as_json()
    assert [s.name for s in out.steps] == ["current", "install"]
    assert "already runs a" in out.reason


@pytest.mark.parametrize("field_", ["build", "migrations", "temporal"])
def test_a_target_differing_in_any_part_is_upgraded(field_: str) -> None:
    old = ref("a", "1.31.5")
    differs = {"build": "other", "migrations": old.migrations + 1, "temporal": "1.32.0"}[field_]
    inst = Recorded(old, replace(old, **{field_: differs}))
    out = asyncio.run(upgrade(inst, "a"))
    assert out.outcome == UPGRADED and inst.calls[:2] == ["stop", "snapshot"], out.as_json()


def test_a_drill_runs_even_on_the_release_the_instance_runs() -> None:
    inst = Recorded(ref("a", "1.32.0"), ref("a", "1.32.0"))
    out = asyncio.run(upgrade(inst, "a", drill=True))
    assert out.outcome != CURRENT and inst.calls[:2] == ["stop", "snapshot"], out.as_json()
