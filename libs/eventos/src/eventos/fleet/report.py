"""An upgrade's outcome where people and the fleet see it (issue 29): attention items (each
generation that needs Reset; a rollback, or a failure a human must act on) and the metric
`eventos_upgrades_total{outcome}` and the event `eventos.upgrade` (its outcome), exported over
OTLP by the upgrader's process."""

from __future__ import annotations

from prometheus_client import Counter

from eventos import names
from eventos.db import connect
from eventos.db.sql import Q
from eventos.fleet.upgrade import FAILED, ROLLED_BACK, Outcome, needs_reset_detail
from eventos.settings import DatabaseSettings

UPGRADES = Counter("eventos_upgrades", "Upgrades of this instance by outcome (upgraded, current, "
                   "rolled_back, failed, aborted)", ("outcome",), registry=None)  # fmt: skip
DETAIL_MAX = 2000
EVENT = "eventos.upgrade"  # the OTLP event of an outcome (telemetry.Exporter.event)


def count(outcome: Outcome) -> None:
    """The metric: one more upgrade with this outcome."""
    UPGRADES.labels(outcome.outcome).inc()


async def raise_items(database_url: str, outcome: Outcome) -> int:
    """The attention items of the outcome; how many were raised."""
    to = outcome.to.name if outcome.to else "?"
    raised = [{"employee": n.employee, "kind": names.ATTENTION_NEEDS_RESET, "severity": "error",
               "ref": names.supervisor_id(n.employee, n.generation),
               "detail": needs_reset_detail(n, to)} for n in outcome.needs_reset]  # fmt: skip
    instance = {
        "employee": names.INSTANCE_ITEMS,
        "ref": f"upgrade:{to}",
        "detail": _detail(outcome),
    }
    if outcome.outcome == ROLLED_BACK:
        raised.append(
            {**instance, "kind": names.ATTENTION_UPGRADE_ROLLED_BACK, "severity": "warning"}
        )
    elif outcome.outcome == FAILED:
        raised.append({**instance, "kind": names.ATTENTION_UPGRADE_FAILED, "severity": "error"})
    if not raised:
        return 0
    conn = await connect(DatabaseSettings(url=database_url))
    async with conn:
        for params in raised:
            params["detail"] = params["detail"][:DETAIL_MAX]
            await conn.execute(Q["attention_raise"], params)
        await conn.commit()
    return len(raised)


def _detail(outcome: Outcome) -> str:
    failed = [s for s in outcome.steps if not s.ok]
    where = failed[0].name if failed else "?"
    back = "restored the snapshot and " if outcome.restored else ""
    if outcome.outcome == ROLLED_BACK:
        old = outcome.from_.name if outcome.from_ else "?"
        head = f"the upgrade failed at step {where} and {back}rolled back to {old}"
    else:
        head = f"the upgrade failed at step {where} and could not roll back: a human must act"
    return f"{head}: {outcome.reason}"
