"""The Temporal dev server stops for 30 s while webhooks and owner messages keep arriving:
every request is still answered at once (I2), nothing acknowledged is lost, and once the
server is back the backlog drains with the owner's class first (SPEC §8 step 3, §9).

The test runs its own dev server (its own SQLite file and ports), because it stops it; the
restarted server reuses both, so the workflows running before the outage carry on.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from conftest import E2E_TIMEOUT_S, SECRETS
from signing import stripe
from stack import Owner, Stack, base_env, one, own_dev_server, reply_rows, rows, run_async, until
from temporalio.client import Client, WorkflowExecutionStatus

from eventos import names
from eventos.local.temporal_dev import TemporalDevServer
from eventos.settings import DatabaseSettings

# Whole stacks of processes on a small shared machine: a longer hang limit than the default.
pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

NAME = "ops"
OUTAGE_S = 30.0
HOOK_EVERY_S = 1.0
CHAT_EVERY = 3  # one owner message every third webhook
CUSTOMERS = 8  # webhooks thread by customer: eight lower-class conversations
DRAIN_S = 150.0

SPEC = f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {NAME}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}, system: You help.}}]
  triggers:
    - {{kind: chat}}
    - {{kind: webhook, path: stripe, verify: {{scheme: stripe, secret: stripe-whsec}},
       thread_by: data.body.customer}}
"""


@pytest.fixture
def temporal(tmp_path: Path) -> Iterator[TemporalDevServer]:
    """A dev server of this test's own: the test stops it."""
    with own_dev_server(tmp_path / "temporal") as server:
        yield server


@pytest.fixture
def stack(
    db_settings: DatabaseSettings, temporal: TemporalDevServer, tmp_path: Path
) -> Iterator[Stack]:
    env = base_env(db_settings.url, temporal.address, temporal.namespace, tmp_path / "blobs")
    env.update(SECRETS)
    with Stack(env, tmp_path) as running:
        yield running


@dataclass
class Sender:
    """Sends signed webhooks and owner messages, asserting each is answered at once."""

    owner: Owner
    hooks: list[str] = field(default_factory=list)
    messages: list[int] = field(default_factory=list)

    def hook(self) -> None:
        n = len(self.hooks)
        event_id = f"evt_{uuid.uuid4().hex[:12]}"
        body = json.dumps({"id": event_id, "object": "event", "type": "invoice.paid",
                           "customer": f"cus_{n % CUSTOMERS}"}).encode()  # fmt: skip
        answer = httpx.post(f"{self.owner.url}/hooks/stripe", content=body, headers=stripe(body),
                            timeout=5)  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "accepted"
        self.hooks.append(event_id)

    def chat(self, text: str) -> int:
        self.messages.append(self.owner.chat(NAME, text))
        return self.messages[-1]


async def entity_run(server: TemporalDevServer, workflow_id: str) -> tuple[str, bool]:
    """The entity's current run id, and whether it is running."""
    client = await Client.connect(server.address, namespace=server.namespace)
    found = await client.get_workflow_handle(workflow_id).describe()
    return found.run_id, found.status == WorkflowExecutionStatus.RUNNING


def answered(owner: Owner, message_ids: list[int]) -> bool:
    return all(owner.message(NAME, m)["reply"] is not None for m in message_ids)


def all_done(url: str) -> bool:
    """Every delivery consumed, and every turn's slot given back (the entity releases it
    after the turn's consuming save)."""
    consumed = one(url, "SELECT bool_and(status = 'done') FROM bus_deliveries")
    return bool(consumed) and one(url, "SELECT count(*) FROM sched_leases") == 0


def test_a_30_s_dev_server_outage_loses_nothing_and_serves_the_owner_first(
    stack: Stack, temporal: TemporalDevServer, db_settings: DatabaseSettings
) -> None:
    url = db_settings.url
    owner = Owner(stack.ingress_url)
    owner.apply_and_start(SPEC, NAME)
    send = Sender(owner)
    warm = send.chat("before the outage")
    send.hook()
    until(lambda: answered(owner, [warm]) and all_done(url), 60, "warm-up served", stack)
    turns_before = one(url, "SELECT count(*) FROM turns")
    owner_entity = one(url, "SELECT entity_id FROM bus_streams WHERE lane = 'talk'")
    owner_run, running = run_async(entity_run(temporal, owner_entity))
    assert running

    temporal.stop()
    # Owner intents written while Temporal is down answer at once and wait, `applying`.
    limits = [owner.call("POST", f"/v1/employees/{NAME}/limits", json={"daily_usd": usd})
              for usd in (9, 10)]  # fmt: skip
    assert [(r.status_code, r.json()["intent"]["state"]) for r in limits] == [(202, "applying")] * 2
    keep_sending(send, OUTAGE_S)  # every answer 200 or 202, asserted as they come
    sent = len(send.hooks) + len(send.messages) - 2
    assert len(send.hooks) > 20 and len(send.messages) > 7
    # Routing needs no Temporal: every event has its delivery, and none went any further.
    until(lambda: one(url, "SELECT count(*) FROM bus_ingress WHERE status = 'accepted'") == 0,
          30, "every accepted event routed", stack)  # fmt: skip
    held = rows(url, "SELECT status, count(*) AS n FROM bus_deliveries "
                     "WHERE status <> 'done' GROUP BY 1")  # fmt: skip
    assert held == [{"status": "pending", "n": sent}]
    assert one(url, "SELECT count(*) FROM turns") == turns_before
    for m in send.messages[1:]:
        answer = owner.message(NAME, m)
        assert {k: answer[k] for k in ("message_id", "status", "reply")} == {
            "message_id": m, "status": "queued", "reply": None}  # fmt: skip
        assert answer["gate"]["code"], answer  # the admin's answer names what holds it

    restarted_at = one(url, "SELECT now()")
    temporal.start()  # the same SQLite file and ports
    until(lambda: all_done(url) and answered(owner, send.messages), DRAIN_S,
          "the backlog drained", stack)  # fmt: skip

    assert_consumed_once(url, send)
    # The intents applied once the server was back, in the order they were written.
    ids = [r.json()["intent"]["id"] for r in limits]
    until(lambda: [r["state"] for r in rows(url, "SELECT state FROM intents WHERE id = ANY(%(i)s)",
                                            {"i": ids})] == ["applied"] * 2,
          60, "the intents applied", stack)  # fmt: skip
    applied = rows(url, "SELECT id FROM intents WHERE id = ANY(%(i)s) ORDER BY applied_at",
                   {"i": ids})  # fmt: skip
    assert [r["id"] for r in applied] == ids
    assert owner.call("GET", f"/v1/employees/{NAME}").json()["limits"] == {"daily_usd": 10.0}
    assert_owner_served_first(url, restarted_at)
    # The server came back with its state: the owner's entity run from before carries on.
    assert run_async(entity_run(temporal, owner_entity)) == (owner_run, True)
    for proc in stack.procs.values():
        assert proc.proc.exit_code() is None, proc.proc.tail()


def keep_sending(send: Sender, seconds: float) -> None:
    """One webhook a second and an owner message every third second, for `seconds`, and as
    many as `seconds` holds even where the sends themselves are slow (a busy machine: each
    took over a second and the count asserted after the outage fell short)."""
    began = time.monotonic()
    tick = 0
    while time.monotonic() - began < seconds or tick < seconds / HOOK_EVERY_S:
        send.hook()
        if tick % CHAT_EVERY == CHAT_EVERY - 1:  # the first one after older webhooks
            send.chat(f"during the outage, message {tick // CHAT_EVERY}")
        tick += 1
        # Paces the sender; nothing here waits for background work.
        time.sleep(max(0.0, began + tick * HOOK_EVERY_S - time.monotonic()))


def assert_consumed_once(url: str, send: Sender) -> None:
    """Every accepted event routed once and consumed (contiguous seq, cursors at the end);
    every owner message answered by its turn's one reply; no turn or slot left open."""
    ingress = rows(url, "SELECT id, status FROM bus_ingress ORDER BY id")
    assert len(ingress) == len(send.hooks) + len(send.messages)
    assert {r["status"] for r in ingress} == {"routed"}
    deliveries = rows(url, "SELECT ingress_id FROM bus_deliveries ORDER BY ingress_id")
    assert [d["ingress_id"] for d in deliveries] == [r["id"] for r in ingress]
    streams = rows(url, "SELECT stream_key, next_seq, delivered_seq, consumed_seq, hold_reason "
                        "FROM bus_streams")  # fmt: skip
    assert len(streams) == 1 + CUSTOMERS
    for s in streams:
        assert s["consumed_seq"] == s["delivered_seq"] == s["next_seq"] - 1, s
        assert s["hold_reason"] is None, s
    turns = rows(url, "SELECT id, class, status FROM turns")
    assert {t["status"] for t in turns} == {"done"}
    owner_turns = sorted(t["id"] for t in turns if t["class"] == 1)
    messages = rows(url, "SELECT id, status, turn_id FROM chat_messages ORDER BY id")
    assert [m["id"] for m in messages] == send.messages
    assert {m["status"] for m in messages} == {"answered"}
    assert sorted({m["turn_id"] for m in messages}) == owner_turns
    outbox = rows(url, "SELECT turn_id, status FROM outbound_messages")
    assert sorted(o["turn_id"] for o in outbox) == owner_turns
    assert {o["status"] for o in outbox} == {"sent"}
    assert sorted(r["turn_id"] for r in reply_rows(url)) == owner_turns
    assert rows(url, "SELECT * FROM sched_leases") == []


def assert_owner_served_first(url: str, restarted_at: datetime) -> None:
    """Within a relay pass every claimed stream is served at once, so after the restart the
    owner's entity and the lower-class ones ask for slots together. The owner must not queue
    behind the lower-class backlog: its turn is admitted in the first wave (at most the
    per-employee cap of lower-class turns before it, while the rest wait for a slot), and it
    is answered before that backlog is worked through."""
    after = rows(url, "SELECT class, started_at, ended_at FROM turns WHERE started_at > %(t)s "
                      "ORDER BY started_at", {"t": restarted_at})  # fmt: skip
    order = [t["class"] for t in after]
    assert order.count(3) > names.EMPLOYEE_TURN_CAP, order  # a backlog that had to wait
    assert order.index(1) <= names.EMPLOYEE_TURN_CAP, order
    owner_answered = max(t["ended_at"] for t in after if t["class"] == 1)
    assert owner_answered < max(t["ended_at"] for t in after if t["class"] != 1), after
