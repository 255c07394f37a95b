"""Where an owner message waits under load (issue 27): the fairness bench, traced.

    .venv/bin/python bench/owner_trace.py [--seconds 60] [fairness.py's other options]

Runs `bench/fairness.py` (every class backlogged, the owners chatting) and then, for each owner
message of the load window, puts the database's times (the message's commit, its delivery's
routing, the turn's admission, the reply's commit) beside Temporal's event times from the
entity's and the turn's histories (the deliver Signal, the workflow tasks, the child's start,
the activities). Printed: each stage's p50, p90 and p99 over the sample, and the slowest
messages stage by stage.
`bench/fairness.py --trace` prints the same after its own report.
"""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime

from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from eventos import names
from eventos.db import Conn

# The owner messages of the load window with their database times.
MESSAGES = """
SELECT m.created_at AS sent, d.created_at AS routed, d.seq, s.entity_id,
       t.id AS turn_id, t.started_at AS admitted,
       (SELECT min(e.created_at) FROM chat_events e
        WHERE e.kind = 'reply' AND e.turn_id = t.id) AS replied
FROM chat_messages m
JOIN turns t ON t.id = m.turn_id
JOIN bus_deliveries d ON d.ingress_id = m.ingress_id AND d.stream_key = t.stream_key
JOIN bus_streams s ON s.stream_key = d.stream_key
WHERE t.thread = 'main' AND t.class = 1 AND m.created_at >= %s
ORDER BY m.created_at
"""

# Stages in order: (name, from point, to point). A point missing leaves its stages out.
STAGES = (
    ("route (router pass)", "sent", "routed"),
    ("relay (its pass, Signal-With-Start)", "routed", "signaled"),
    ("entity: task scheduled", "signaled", "entity_scheduled"),
    ("entity: task queued", "entity_scheduled", "entity_started"),
    ("entity: admission", "entity_started", "admitted"),
    ("entity: child initiated", "admitted", "child_initiated"),
    ("child started", "child_initiated", "turn_started"),
    ("turn: task queued", "turn_started", "turn_task_started"),
    ("turn: to the LLM step", "turn_task_started", "llm_scheduled"),
    ("LLM: queued (llm-c1)", "llm_scheduled", "llm_started"),
    ("LLM: step (less --delay)", "llm_started", "llm_completed"),
    ("LLM done → reply", "llm_completed", "replied"),
)
TOTALS = (("message → turn start", "sent", "admitted"),
          ("message → reply (less --delay)", "sent", "replied"))  # fmt: skip


def at(event: HistoryEvent) -> float:
    return event.event_time.ToDatetime(tzinfo=UTC).timestamp()


async def histories(client: Client, workflow_id: str) -> list[HistoryEvent]:
    """Every run's events of `workflow_id`, oldest run first (entities continue as new)."""
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    events: list[HistoryEvent] = []
    for run in sorted(runs, key=lambda w: w.start_time):
        handle = client.get_workflow_handle(workflow_id, run_id=run.run_id)
        events += (await handle.fetch_history()).events
    return events


def signal_seqs(event: HistoryEvent) -> list[int]:
    attrs = event.workflow_execution_signaled_event_attributes
    if attrs.signal_name != names.SIGNAL_DELIVER or not attrs.input.payloads:
        return []
    return [int(i["seq"]) for i in json.loads(attrs.input.payloads[0].data).get("items", [])]


def entity_points(events: list[HistoryEvent], seq: int, turn_id: str) -> dict[str, float]:
    points: dict[str, float] = {}
    signaled = next((i for i, e in enumerate(events)
                     if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
                     and seq in signal_seqs(e)), None)  # fmt: skip
    if signaled is None:
        return points
    points["signaled"] = at(events[signaled])
    for e in events[signaled + 1 :]:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            points.setdefault("entity_scheduled", at(e))
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            points.setdefault("entity_started", at(e))
        elif e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED and (
            e.start_child_workflow_execution_initiated_event_attributes.workflow_id == turn_id
        ):
            points["child_initiated"] = at(e)
            break
    return points


def turn_points(events: list[HistoryEvent]) -> dict[str, float]:
    points: dict[str, float] = {}
    llm: set[int] = set()
    for e in events:
        kind = e.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            points["turn_started"] = at(e)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            points.setdefault("turn_task_started", at(e))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if e.activity_task_scheduled_event_attributes.activity_type.name == names.ACT_LLM_STEP:
                llm.add(e.event_id)
                points.setdefault("llm_scheduled", at(e))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            if e.activity_task_started_event_attributes.scheduled_event_id in llm:
                points.setdefault("llm_started", at(e))
        elif (
            kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and e.activity_task_completed_event_attributes.scheduled_event_id in llm
        ):
            points.setdefault("llm_completed", at(e))
    return points


def event_name(event: HistoryEvent) -> str:
    return EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").lower()


async def slow_turns(client: Client, turns: list[tuple[str, float, float]]) -> None:
    """Where the given turns' time went, summed over them: (turn id, admitted, saved) with the
    database's times, from its admission to the child's start, each step between two events of
    the turn's history, and from the last event before its save to the save."""
    took: dict[str, list[float]] = {}
    total = 0.0
    for turn_id, admitted, saved in turns:
        events = await histories(client, turn_id)
        if not events:
            continue
        total += saved - admitted
        steps = [("admitted → " + event_name(events[0]), at(events[0]) - admitted)]
        steps += [(f"{event_name(a)} → {event_name(b)}", at(b) - at(a))
                  for a, b in itertools.pairwise(events) if at(b) <= saved]  # fmt: skip
        last = max((e for e in events if at(e) <= saved), key=at)
        steps.append((f"{event_name(last)} → saved", saved - at(last)))
        for step, s in steps:
            took.setdefault(step, []).append(s)
    print(f"the {len(turns)} slowest turns: {total:.1f} s from admission to save in all; "
          "by step between their events (ms)")  # fmt: skip
    print(f"{'step':<64} {'n':>4} {'share':>6} {'p50':>7} {'max':>7}")
    for step, spans in sorted(took.items(), key=lambda kv: -sum(kv[1]))[:12]:
        ms = [x * 1000 for x in spans]
        print(f"{step:<64} {len(ms):>4} {sum(spans) / total:>6.0%} {pct(ms, 0.5):>7.0f} "
              f"{max(ms):>7.0f}")  # fmt: skip


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def trace(pool: AsyncConnectionPool[Conn], client: Client, since: datetime,
                delay: float) -> None:  # fmt: skip
    """Print the per-stage table of the owner messages sent since `since`."""
    async with pool.connection() as conn:
        rows = await (await conn.execute(MESSAGES, (since,))).fetchall()
    cache: dict[str, list[HistoryEvent]] = {}
    samples: list[dict[str, float]] = []
    for r in rows:
        points = {k: r[k].timestamp() for k in ("sent", "routed", "admitted", "replied") if r[k]}
        entity = str(r["entity_id"])
        if entity not in cache:
            cache[entity] = await histories(client, entity)
        points |= entity_points(cache[entity], int(r["seq"]), str(r["turn_id"]))
        points |= turn_points(await histories(client, str(r["turn_id"])))
        for key in ("llm_completed", "replied"):  # the step's scripted time is not a wait
            if key in points:
                points[key] -= delay
        samples.append(points)
    print(f"owner messages traced: {len(samples)} (times in ms; the step's {delay:g} s left out)")
    print(f"{'stage':<36} {'n':>4} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7}")
    for name, a, b in STAGES + TOTALS:
        spans = [(s[b] - s[a]) * 1000 for s in samples if a in s and b in s]
        if spans:
            print(f"{name:<36} {len(spans):>4} {pct(spans, 0.5):>7.0f} {pct(spans, 0.9):>7.0f} "
                  f"{pct(spans, 0.99):>7.0f} {max(spans):>7.0f}")  # fmt: skip
    for what, end in (("start", "admitted"), ("reply", "replied")):
        slowest = sorted(samples, key=lambda s: s.get(end, 0) - s["sent"], reverse=True)[:3]
        for s in slowest:
            parts = [f"{n.split(' (')[0]} {(s[b] - s[a]) * 1000:.0f}"
                     for n, a, b in STAGES if a in s and b in s]  # fmt: skip
            sent = datetime.fromtimestamp(s["sent"], UTC).strftime("%H:%M:%S.%f")[:-3]
            print(f"slow {what} {(s.get(end, s['sent']) - s['sent']) * 1000:.0f} ms (sent "
                  f"{sent}): " + ", ".join(parts))  # fmt: skip


def main() -> int:
    import sys

    import fairness

    return fairness.main([*sys.argv[1:], "--trace"])


if __name__ == "__main__":
    raise SystemExit(main())
