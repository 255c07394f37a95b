"""`eventosctl upgrade --to TARGET`: upgrade an instance, rolling it back on its own when the new
release fails (docs/upgrades.md, docs/cli.md#upgrade). The local instance (`make run`): TARGET
is another checkout. An instance the chart installed (in a pod of its upgrade CronJob, or with
--namespace/--kubeconfig): TARGET is an image tag.

Exit codes: 0 upgraded, 6 rolled back, 7 the rollback failed too (a human must act), 8 nothing
was changed (the target could not be installed, or the Temporal server may not move to the
version it pins)."""

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
from eventos.fleet.k8s_driver import KubernetesInstance
from eventos.fleet.local_driver import LocalInstance
from eventos.fleet.upgrade import Deadlines, Outcome, upgrade
from eventos.settings import KubernetesUpgradeSettings, UpgradeSettings


def cmd_upgrade(args: argparse.Namespace) -> int:
    settings = UpgradeSettings.from_env()
    if args.ready_timeout is not None:
        settings = dataclasses.replace(settings, ready_s=args.ready_timeout)
    instance, target = _instance(args, settings)
    with telemetry.started("eventosctl") as exporter:
        REGISTRY.register(report.UPGRADES)
        try:
            outcome = asyncio.run(_run(instance, target, args.inject_readiness_failure))
            exporter.event(report.EVENT, outcome.outcome)
        finally:
            REGISTRY.unregister(report.UPGRADES)
    emit(args, outcome.as_json(), _text(outcome))
    return outcome.exit_code


def _instance(
    args: argparse.Namespace, settings: UpgradeSettings
) -> tuple[LocalInstance | KubernetesInstance, str]:
    """The driver (Kubernetes when a namespace, a kubeconfig or a pod's own cluster says so,
    else the local instance) and the target as it names one."""
    where = KubernetesUpgradeSettings.from_env()
    where = dataclasses.replace(
        where, **{k: v for k in ("namespace", "release", "kubeconfig")
                  if (v := getattr(args, k, None))})  # fmt: skip
    if where.chosen:
        return KubernetesInstance(where, settings), args.to
    stack = getattr(args, "stack", None) or find_stack(Path.cwd())
    if stack is None or not Path(stack).is_file():
        raise NoInstance(f"no local instance to upgrade: {START_HINT}")
    return LocalInstance(Path(stack).resolve(), settings), str(Path(args.to).resolve())


async def _run(instance: LocalInstance | KubernetesInstance, target: str, drill: bool) -> Outcome:
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
    p = add("upgrade", cmd_upgrade, "upgrade an instance to another release")  # type: ignore[operator]
    to = "the release to run next: a checkout (local instance), an image tag (Kubernetes)"
    p.add_argument("--to", required=True, metavar="TARGET", help=to)
    k8s = "Kubernetes: the instance's namespace (EVENTOS_UPGRADE_NAMESPACE; a pod's own)"
    p.add_argument("--namespace", help=k8s)
    helm = "Kubernetes: the chart's release name (EVENTOS_UPGRADE_RELEASE)"
    p.add_argument("--release", help=helm)
    kubeconfig = "Kubernetes: the kubeconfig file (EVENTOS_UPGRADE_KUBECONFIG; in a pod, none)"
    p.add_argument("--kubeconfig", help=kubeconfig)
    drill = "drill: the new release fails its readiness check (it rolls back)"
    p.add_argument("--inject-readiness-failure", action="store_true", help=drill)
    ready = "how long each service has to answer ready (EVENTOS_UPGRADE_READY_S, 90)"
    p.add_argument("--ready-timeout", type=float, metavar="SECONDS", help=ready)
