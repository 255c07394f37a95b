"""`eventosctl upgrade --to TARGET`: upgrade the local instance to another checkout, rolling it
back on its own when the new release fails (docs/upgrades.md, docs/cli.md#upgrade).

Exit codes: 0 upgraded, 6 rolled back, 7 the rollback failed too (a human must act), 8 nothing
was changed (the target could not be installed)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from pathlib import Path

from prometheus_client import REGISTRY

from eventos import telemetry
from eventos.cli.instance import START_HINT, NoInstance, find_stack
from eventos.cli.output import emit
from eventos.fleet import report
from eventos.fleet.local_driver import LocalInstance
from eventos.fleet.upgrade import Deadlines, Outcome, upgrade
from eventos.settings import UpgradeSettings


def cmd_upgrade(args: argparse.Namespace) -> int:
    stack = getattr(args, "stack", None) or find_stack(Path.cwd())
    if stack is None or not Path(stack).is_file():
        raise NoInstance(f"no local instance to upgrade: {START_HINT}")
    settings = UpgradeSettings.from_env()
    if args.ready_timeout is not None:
        settings = dataclasses.replace(settings, ready_s=args.ready_timeout)
    instance = LocalInstance(Path(stack).resolve(), settings)
    with telemetry.started("eventosctl") as exporter:
        REGISTRY.register(report.UPGRADES)
        try:
            target = str(Path(args.to).resolve())
            outcome = asyncio.run(_run(instance, target, args.inject_readiness_failure))
            exporter.event(report.EVENT, outcome.outcome)
        finally:
            REGISTRY.unregister(report.UPGRADES)
    emit(args, outcome.as_json(), _text(outcome))
    return outcome.exit_code


async def _run(instance: LocalInstance, target: str, drill: bool) -> Outcome:
    s = instance.settings
    deadlines = Deadlines(ready_s=s.ready_s, rollback_ready_s=s.rollback_ready_s)
    outcome = await upgrade(instance, target, drill=drill, deadlines=deadlines)
    report.count(outcome)
    await report.raise_items(instance.database_url, outcome)
    return outcome


def _text(outcome: Outcome) -> str:
    lines = [f"{outcome.outcome}: {outcome.from_.name if outcome.from_ else '?'} → "
             f"{outcome.to.name if outcome.to else '?'}"]  # fmt: skip
    for step in outcome.steps:
        mark = "ok" if step.ok else "FAILED"
        lines.append(f"  {step.name:<22} {mark:<6} {step.seconds:8.2f}s  {step.detail[:200]}")
    for n in outcome.needs_reset:
        lines.append(
            f"  needs Reset: {n.employee} generation {n.generation} ({len(n.workflows)} runs)"
        )
    if outcome.reason:
        lines.append(f"  why: {outcome.reason[:1000]}")
    return "\n".join(lines)


def add_command(add: object) -> None:
    """Register `upgrade` with the parser's `add`."""
    p = add("upgrade", cmd_upgrade, "upgrade the local instance to another checkout")  # type: ignore[operator]
    p.add_argument("--to", required=True, metavar="TARGET", help="the checkout to run next")
    drill = "drill: the new release fails its readiness check (it rolls back)"
    p.add_argument("--inject-readiness-failure", action="store_true", help=drill)
    ready = "how long each service has to answer ready (EVENTOS_UPGRADE_READY_S, 90)"
    p.add_argument("--ready-timeout", type=float, metavar="SECONDS", help=ready)
