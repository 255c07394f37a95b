"""The upgrade of one instance (SPEC §14, RFC-0005 §21.2; docs/upgrades.md): its steps, each
timed, its rollback rules and its outcome.

With the services stopped (inputs wait at their providers, SPEC §14), it snapshots the
database, applies the target's forward-only migrations and replays every open run on the target's
code; then it starts the target's services, those that feed the workers first and the workers
last, each checked on `/readyz` (answering ready, on the target's build) within a deadline. Runs
that do not replay mark their generations "needs Reset" and the upgrade goes on. When a step
fails it rolls back on its own: the previous release's services again, and the snapshot restored
first where the target ran a migration or a workflow task (the previous code could not read
either). At tier L the instance's Temporal server moves too when the target pins another version:
at most one minor forward per upgrade (`temporal_rule`), its schema tool first, then the server,
both after the snapshot (which holds Temporal's databases), so a rollback restores the snapshot
and starts the previous server again. `Instance` is what it drives; `eventos.fleet.local_driver`
drives a `make run` instance.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from eventos import names
from eventos.errors import EventOSError

T = TypeVar("T")

# The target starts in three groups, each answering ready before the next starts. The workers
# poll only after the replay gate and after the services that feed them answer ready, so a
# target that fails there completed no workflow task: its rollback needs no snapshot (it is
# replay-safe only before that, RFC-0005 §21.2). The ingress comes last, so a target that
# fails before acknowledged no event a restore of the snapshot could lose.
INNER = ("router", "relay", "egress")
WORKERS = ("workers-workflow", "workers-llm")
INGRESS = ("ingress",)
SERVICES = INNER + WORKERS + INGRESS

UPGRADED, ROLLED_BACK, FAILED, ABORTED = "upgraded", "rolled_back", "failed", "aborted"
CURRENT = "current"  # the instance already runs the target: nothing to do, nothing changed
# The exit code of each outcome: 0 upgraded (or already current), 6 rolled back by itself, 7
# when a human must act (the rollback itself failed), 8 when nothing was changed (the target
# could not be installed, or its Temporal server may not move there: `temporal_rule`).
EXIT_CODES = {UPGRADED: 0, CURRENT: 0, ROLLED_BACK: 6, FAILED: 7, ABORTED: 8}


class UpgradeError(EventOSError):
    """An upgrade step failed."""


@dataclass(frozen=True)
class ReleaseRef:
    """A release an instance can run: its name, where it comes from (a checkout, an image
    tag), the build id its workers run under, the migration level it ships and its Temporal
    server version. `temporal` is, for the release the instance runs now, the version its own
    Temporal server runs (tier L); for an installed target, the version that target pins; ""
    where the upgrader does not move Temporal (tier S's dev server, a target pinning none)."""

    name: str
    source: str
    build: str
    migrations: int
    temporal: str = ""


@dataclass(frozen=True)
class GateReport:
    """The replay gate's answer: the open runs replayed, and those that failed (their ids)."""

    replayed: int
    failed: list[dict[str, str]]
    truncated: bool = False


@dataclass(frozen=True)
class NeedsReset:
    """A generation one of whose open runs cannot replay on the new code."""

    employee: str
    generation: int
    workflows: list[str]

    def as_json(self) -> dict[str, Any]:
        return {"employee": self.employee, "generation": self.generation,
                "workflows": self.workflows}  # fmt: skip


class Instance(Protocol):
    """One instance as the upgrader drives it (a local one; a Kubernetes one next)."""

    async def current(self) -> ReleaseRef:
        """The release the services run now."""
        ...

    async def install(self, target: str) -> ReleaseRef:
        """Make `target` runnable beside the current release."""
        ...

    async def stop(self) -> None:
        """Stop every service (the instance takes no input until started again)."""
        ...

    async def snapshot(self) -> str:
        """Snapshot the databases; the snapshot's id."""
        ...

    async def restore(self, snapshot: str) -> None:
        """Restore the snapshot `snapshot` (the services are stopped). Where it replaces
        Temporal's databases it stops the Temporal server first; after a rollback that moved
        Temporal, `start_temporal(old)` starts it again, otherwise the driver restarts it on
        the version it ran."""
        ...

    async def update_temporal_schema(self, release: ReleaseRef) -> None:
        """Run `release`'s temporal-sql-tool `update-schema` from `release`'s schema files
        (postgresql v12 `temporal/versioned`, `visibility/versioned`) on both Temporal
        databases, while the old server still runs."""
        ...

    async def start_temporal(self, release: ReleaseRef, timeout_s: float) -> None:
        """(Re)start the Temporal server on `release.temporal`; return once it serves (the
        namespace answers, GetSystemInfo's server_version is `release.temporal`), else
        UpgradeError naming what it saw within `timeout_s`."""
        ...

    async def migrate(self, release: ReleaseRef) -> list[str]:
        """Apply `release`'s migrations; the names of those applied."""
        ...

    async def replay(self, release: ReleaseRef) -> GateReport:
        """Replay every open run on `release`'s workflow code."""
        ...

    async def start(self, release: ReleaseRef, services: tuple[str, ...], drill: bool) -> None:
        """Start `services` (the others stay as they are) on `release`; `drill` sets the
        switch that fails their readiness check."""
        ...

    async def ready(self, release: ReleaseRef, services: tuple[str, ...], timeout_s: float) -> None:
        """Return once every one of `services` answers ready on `release`; UpgradeError naming
        those that did not within `timeout_s`."""
        ...

    async def workflow_task_completed_since(self, since: datetime) -> bool:
        """Whether any workflow task was completed since `since` (or cannot be ruled out)."""
        ...

    async def generations_of(self, workflow_ids: list[str]) -> list[NeedsReset]:
        """The generations the workflows belong to (those the database knows)."""
        ...


@dataclass(frozen=True)
class Step:
    name: str
    ok: bool
    seconds: float
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "ok": self.ok, "seconds": round(self.seconds, 3)}
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass
class Outcome:
    """What the upgrade did: the `-o json` document and the exit code."""

    from_: ReleaseRef | None = None
    to: ReleaseRef | None = None
    outcome: str = ABORTED
    steps: list[Step] = field(default_factory=list)
    needs_reset: list[NeedsReset] = field(default_factory=list)
    reason: str = ""
    restored: bool = False
    replayed: int = 0  # open runs the replay gate replayed on the new code

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def as_json(self) -> dict[str, Any]:
        return {
            "from": self.from_.name if self.from_ else None,
            "to": self.to.name if self.to else None,
            "outcome": self.outcome,
            "steps": [s.as_json() for s in self.steps],
            "needs_reset": [n.as_json() for n in self.needs_reset],
            "reason": self.reason,
            "restored": self.restored,
            "replayed": self.replayed,
            "releases": {k: r.__dict__ for k, r in (("from", self.from_), ("to", self.to)) if r},
        }

    async def step(self, name: str, work: Awaitable[T]) -> T:
        """Run one step, timed; its failure is recorded and raised as UpgradeError."""
        started = time.monotonic()
        try:
            result = await work
        except Exception as exc:
            took = time.monotonic() - started
            self.steps.append(Step(name, False, took, f"{type(exc).__name__}: {exc}"[:2000]))
            raise UpgradeError(f"{name}: {exc}") from exc
        self.steps.append(Step(name, True, time.monotonic() - started))
        return result


@dataclass
class Attempt:
    """What the target changed so far: what its rollback must undo."""

    snapshot: str = ""
    migrated: bool = False
    temporal_moved: bool = False  # the target's Temporal schema tool ran (or may have)
    workers_since: datetime | None = None  # when the target's workers were first started


@dataclass(frozen=True)
class Deadlines:
    """How long the target's services have to answer ready, and the previous release's after
    a rollback (longer: it must come back, on a machine the failed attempt may have loaded)."""

    ready_s: float = 90.0
    rollback_ready_s: float = 180.0
    temporal_s: float = 180.0  # the Temporal server serving again on a version


async def upgrade(
    instance: Instance, target: str, *, drill: bool = False, deadlines: Deadlines = Deadlines()
) -> Outcome:
    """Upgrade `instance` to `target`; roll it back on its own when a step fails."""
    out = Outcome()
    try:
        out.from_ = await out.step("current", instance.current())
        out.to = await out.step("install", instance.install(target))
    except UpgradeError as exc:
        out.outcome, out.reason = ABORTED, str(exc)
        return out
    refused = temporal_rule(out.from_.temporal, out.to.temporal)
    if refused:
        out.outcome, out.reason = ABORTED, refused
        return out
    if out.from_ == replace(out.to, source=out.from_.source) and not drill:
        # A weekly window whose target already runs: no stop, no snapshot, no restart. A drill
        # still runs (it rehearses the rollback, whatever the target).
        out.outcome, out.reason = CURRENT, f"the instance already runs {out.to.name}"
        return out
    attempt = Attempt()
    try:
        await _forward(instance, out, attempt, drill, deadlines)
        out.outcome = UPGRADED
    except UpgradeError as exc:
        out.reason = str(exc)
        await _roll_back(instance, out, attempt, deadlines)
    return out


def _version(text: str) -> tuple[int, int, int] | None:
    parts = text.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def temporal_rule(current: str, target: str) -> str:
    """Why the Temporal server may not move from `current` to `target` in one upgrade, or ""
    when it may: forward, in the same major, by at most one minor (Temporal's schema and
    server upgrade one minor at a time). "" on either side means Temporal does not move."""
    if not current or not target or current == target:
        return ""
    old, new = _version(current), _version(target)
    if old is None or new is None:
        return f"cannot compare the Temporal server versions {current!r} and {target!r}"
    said = f"the target pins Temporal {target}, the instance runs {current}"
    if new < old:
        return f"{said}: Temporal is never downgraded (roll back to a release pinning {current})"
    if new[0] != old[0]:
        return f"{said}: Temporal moves within its major version only"
    if new[1] > old[1] + 1:
        through = f"{old[0]}.{old[1] + 1}.x"
        return f"{said}: one minor at a time, upgrade to a release pinning {through} first"
    return ""


async def _forward(
    instance: Instance, out: Outcome, attempt: Attempt, drill: bool, deadlines: Deadlines
) -> None:
    assert out.from_ is not None and out.to is not None
    new, ready_s = out.to, deadlines.ready_s
    await out.step("stop", instance.stop())
    attempt.snapshot = await out.step("snapshot", instance.snapshot())
    if out.from_.temporal and new.temporal and new.temporal != out.from_.temporal:
        attempt.temporal_moved = True  # from here the schema may be the target's
        await out.step("temporal_schema", instance.update_temporal_schema(new))
        await out.step("temporal_server", instance.start_temporal(new, deadlines.temporal_s))
    attempt.migrated = True  # from here a failed migration may have left part of its work
    applied = await out.step("migrate", instance.migrate(new))
    attempt.migrated = bool(applied)
    report = await out.step("replay", instance.replay(new))
    out.replayed = report.replayed
    failed = [f["workflow_id"] for f in report.failed]
    out.needs_reset = await out.step("needs_reset", instance.generations_of(failed))
    await out.step("start", instance.start(new, INNER, drill))
    await out.step("ready", instance.ready(new, INNER, ready_s))
    attempt.workers_since = datetime.now(UTC)
    await out.step("start_workers", instance.start(new, WORKERS, drill))
    await out.step("ready_workers", instance.ready(new, WORKERS, ready_s))
    await out.step("start_ingress", instance.start(new, INGRESS, drill))
    await out.step("ready_ingress", instance.ready(new, INGRESS, ready_s))


async def _roll_back(
    instance: Instance, out: Outcome, attempt: Attempt, deadlines: Deadlines
) -> None:
    """The previous release again, on the snapshot where the target changed what it cannot
    read (its migrations, a workflow task it completed, Temporal's schema and server: then
    the previous Temporal server again, before the services); `failed` when that does not
    come back ready."""
    assert out.from_ is not None
    old, ready_s = out.from_, deadlines.rollback_ready_s
    try:
        await out.step("rollback_stop", instance.stop())
        ran_tasks = attempt.workers_since is not None and await out.step(
            "rollback_check_tasks", instance.workflow_task_completed_since(attempt.workers_since)
        )
        if attempt.snapshot and (attempt.migrated or ran_tasks or attempt.temporal_moved):
            await out.step("restore", instance.restore(attempt.snapshot))
            out.restored = True
        if attempt.temporal_moved:
            await out.step("rollback_temporal", instance.start_temporal(old, deadlines.temporal_s))
        await out.step("rollback_start", instance.start(old, SERVICES, False))
        await out.step("rollback_ready", instance.ready(old, SERVICES, ready_s))
    except UpgradeError as exc:
        out.outcome = FAILED
        out.reason = f"{out.reason}; the rollback failed too: {exc}"
        return
    out.outcome = ROLLED_BACK


def needs_reset_detail(item: NeedsReset, to: str) -> str:
    """The attention item's text for a generation whose runs cannot replay on `to`."""
    shown = ", ".join(item.workflows[:5]) + (" …" if len(item.workflows) > 5 else "")
    return (f"generation {item.generation} has runs the release {to} cannot replay ({shown}): "
            f"they stay stuck until the generation is Reset ({names.ACTION_RESET})")  # fmt: skip
