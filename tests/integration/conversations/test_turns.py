"""Owner chat through the whole path in one process, on the real dev server and PostgreSQL:
router → relay → ConversationWorkflow → admission → TurnWorkflow → llm_step (local provider)
→ consuming save → outbox → egress → the owner's reply."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from conftest import ADMIN_TOKEN, PURPOSES, PURPOSES_VAR, apply_and_start
from metrics_table import sample
from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.service import RPCError
from test_router import append_all, driver_event, query
from test_users import user_thread

from eventos import names
from eventos.contracts import EntityStatus, InterruptTurn
from eventos.control.intent_deliverer import Deliverer
from eventos.db import Conn
from eventos.delivery.relay import Relay
from eventos.delivery.routing import route_pass
from eventos.errors import NotFound
from eventos.llm.activity import LlmActivities
from eventos.llm.endpoints import LlmEndpoints
from eventos.llm.prices import PriceTable
from eventos.llm.worker import llm_worker
from eventos.outbox.egress import Egress
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.metrics import DEAD_LETTERS, RUN_HISTORY_BYTES, RUN_SIGNALS, TURN_DURATION
from eventos.runtime.payload_guard import connect
from eventos.runtime.service import cancel_and_wait
from eventos.runtime.temporal import TemporalConnection
from eventos.settings import SecretStore, SupervisionSettings, TemporalSettings
from eventos.testing import wait_for
from eventos.workers.activities import DbActivities
from eventos.workers.roles import egress_worker, workflow_worker

pytestmark = pytest.mark.temporal


def local_spec(name: str, triggers: str, system: str = "") -> str:
    """An employee whose one agent `front` runs on the local provider."""
    prompt = f", system: {system}" if system else ""
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}{prompt}}}]
  triggers:
{triggers}"""


def owner_and_driver(name: str) -> str:
    """Owner chat, and a gRPC driver threaded by subject (one conversation per subject)."""
    return local_spec(
        name,
        f"""    - {{kind: chat}}
    - {{kind: grpc, driver: drv-{name}, thread_by: subject}}
""",
        system="You help.",
    )


def customer(name: str) -> str:
    return local_spec(name, f"    - {{kind: telegram, account: tg-{name}}}\n")


def two_classes(name: str) -> str:
    """Two gRPC drivers into one conversation: `low` is C4, `high` is C1."""
    return local_spec(
        name,
        f"""    - {{kind: grpc, name: low, driver: low-{name}, class: C4}}
    - {{kind: grpc, name: high, driver: high-{name}, class: C1}}
""",
    )


PUMP_STOP_S = 30.0
ROLL_AFTER = 60  # tests make entities continue-as-new early
IDLE_S = 3.0  # … and passivate after 3 s idle
# The local model's price: a step with max_tokens 1024 reserves about 0.01 USD.
PRICES = PriceTable.from_doc({"local/*": {"input_per_mtok": 1.0, "output_per_mtok": 10.0}})


@dataclass
class Instance:
    name: str
    client: Client
    api: httpx.AsyncClient
    pool: AsyncConnectionPool[Conn]
    relay: Relay
    llm: LlmActivities
    deliverer: Deliverer

    async def chat(self, text: str) -> int:
        r = await self.api.post(f"/v1/employees/{self.name}/chat",
                                json={"client_message_id": uuid.uuid4().hex, "text": text})  # fmt: skip
        assert r.status_code == 202, r.text
        return int(r.json()["message_id"])

    async def reply(self, message_id: int, timeout: float = 30, name: str | None = None) -> str:
        """The reply to an owner message (of this instance's employee unless `name`)."""

        async def answered() -> str | None:
            r = await self.api.get(f"/v1/employees/{name or self.name}/chat/{message_id}")
            return r.json()["reply"]  # type: ignore[no-any-return]

        return await wait_for(
            answered, timeout=timeout, interval=0.1, what=f"reply to {message_id}"
        )


async def pump(pool: AsyncConnectionPool[Conn], relay: Relay, deliverer: Deliverer,
               upkeep: Callable[[Conn], Awaitable[object]] | None = None) -> None:  # fmt: skip
    """The router's (with its `upkeep`), the relay's and the intent deliverer's loops,
    tightened for tests."""
    while True:
        async with pool.connection() as conn:
            await route_pass(conn)
            if upkeep is not None:
                await upkeep(conn)
        await relay.pass_once()
        await deliverer.pass_once()
        await asyncio.sleep(0.05)


@pytest.fixture
async def instance(
    pool: AsyncConnectionPool[Conn],
    ingress_url: str,
    temporal_settings: TemporalSettings,
    outbox_keys: OutboxKeys,
    llm_endpoints: LlmEndpoints,
    supervision_settings: SupervisionSettings,
) -> AsyncIterator[Instance]:
    name = f"t{uuid.uuid4().hex[:8]}"
    await apply_and_start(pool, owner_and_driver(name))
    client = await connect(temporal_settings.address, temporal_settings.namespace)
    queue = f"wf-{uuid.uuid4().hex[:8]}"
    db = DbActivities(pool, outbox=outbox_keys, supervision=supervision_settings)
    async with httpx.AsyncClient() as http:
        # The test operator's purposes; a test adds its keys to this env later.
        secrets = SecretStore(env={PURPOSES_VAR: PURPOSES})
        llm = LlmActivities(http, secrets, pool, PRICES, endpoints=llm_endpoints)
        workers = [workflow_worker(client, queue, db), egress_worker(client, db, queue)]
        workers += [llm_worker(client, k, 4, llm, workflow_queue=queue) for k in (1, 2, 3, 4)]
        relay = Relay(pool, TemporalConnection(temporal_settings), "relay-t", task_queue=queue,
                      entity_roll_after=ROLL_AFTER, entity_idle_s=IDLE_S)  # fmt: skip
        deliverer = Deliverer(pool, TemporalConnection(temporal_settings), workflow_queue=queue,
                              outbox=outbox_keys)  # fmt: skip
        async with contextlib.AsyncExitStack() as stack:
            for w in workers:
                await stack.enter_async_context(w)
            pumping = asyncio.create_task(pump(pool, relay, deliverer))
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=10) as api:
                try:
                    yield Instance(name, client, api, pool, relay, llm, deliverer)
                finally:
                    await cancel_and_wait([pumping], PUMP_STOP_S)
                    assert pumping.done(), "the pump did not stop"


async def step_started(instance: Instance, turn_id: str) -> None:
    """The turn's LLM step is running on an LLM worker."""
    turn = instance.client.get_workflow_handle(turn_id)

    async def started() -> bool:
        try:
            pending = (await turn.describe()).raw_description.pending_activities
        except RPCError:  # admitted (the turn row exists) but the child is not started yet
            return False
        return any(a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED for a in pending)

    await wait_for(started, timeout=15, what="the LLM step started")


async def slots_given_back(instance: Instance, employee: str) -> None:
    """The turns' admission slots are released (just after the turns end)."""

    async def none_held() -> bool:
        q = f"SELECT 1 FROM sched_leases WHERE employee = '{employee}'"
        return await query(instance.pool, q) == []

    await wait_for(none_held, timeout=10, what=f"{employee}'s slots released")


async def read_events(
    instance: Instance, until: str, session: str = "owner", api: httpx.AsyncClient | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """Server-sent events of a chat session from the start, up to the first `until` event
    (as the admin unless `api` is another caller's client)."""
    events: list[tuple[str, dict[str, Any]]] = []
    url = f"/v1/employees/{instance.name}/chat/events"
    client = api or instance.api
    async with client.stream("GET", url, params={"session": session, "after": 0}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        kind = ""
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((kind, json.loads(line.removeprefix("data: "))))
                if kind == until:
                    return events
    raise AssertionError(f"the stream ended before a {until!r} event: {events}")


async def transcripts(
    pool: AsyncConnectionPool[Conn], employee: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Every stored transcript (of `employee`, else of all) by thread, in order."""
    rows = await query(pool, "SELECT thread, message FROM transcript_messages "
                             "WHERE %s::text IS NULL OR employee = %s ORDER BY thread, n",
                       employee, employee)  # fmt: skip
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["thread"], []).append(row["message"])
    return out


async def transcript(
    pool: AsyncConnectionPool[Conn], thread: str = "main", employee: str | None = None
) -> list[dict[str, Any]]:
    return (await transcripts(pool, employee)).get(thread, [])


async def test_owner_chat_gets_one_reply_and_consumes_once(instance: Instance) -> None:
    mid = await instance.chat("hello there")
    reply = await instance.reply(mid)
    assert reply.startswith("[local]") and "hello there" in reply
    pool = instance.pool
    (stream,) = await query(
        pool, "SELECT delivered_seq, consumed_seq, hold_reason FROM bus_streams"
    )
    assert (stream["delivered_seq"], stream["consumed_seq"]) == (1, 1)
    (turn,) = await query(pool, "SELECT id, status, consumed_seq FROM turns")
    assert (turn["status"], turn["consumed_seq"]) == ("done", 1)
    (out,) = await query(pool, "SELECT status, body, kind FROM outbound_messages")
    assert (out["status"], out["body"], out["kind"]) == ("sent", reply, "chat")

    await slots_given_back(instance, instance.name)
    roles = [m["role"] for m in await transcript(pool)]
    assert roles == ["user", "assistant"]
    (msg,) = await query(pool, "SELECT status, turn_id FROM chat_messages")
    assert (msg["status"], msg["turn_id"]) == ("answered", turn["id"])


async def test_owner_chat_is_sent_in_the_workflow_task_that_saved(instance: Instance) -> None:
    """Owner chat's send is a local activity of the turn, after the save in the same task:
    no egress activity task, one reply row, and the turn closes without another task."""
    await instance.reply(await instance.chat("quick one"))
    (turn,) = await query(instance.pool, "SELECT id FROM turns")
    handle = instance.client.get_workflow_handle(turn["id"])
    await asyncio.wait_for(handle.result(), timeout=15)
    history = await handle.fetch_history()
    kinds = [EventType.Name(e.event_type) for e in history.events]
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert names.ACT_SEND not in scheduled and names.ACT_LLM_STEP in scheduled
    # After the step's result: one workflow task (markers for save and send), then the close.
    after_step = kinds[kinds.index("EVENT_TYPE_ACTIVITY_TASK_COMPLETED") :]
    assert after_step.count("EVENT_TYPE_WORKFLOW_TASK_COMPLETED") == 1, after_step
    assert after_step[-1] == "EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED", after_step
    q = "SELECT outbound_id FROM chat_events WHERE kind = 'reply'"
    replies = await query(instance.pool, q)
    (out,) = await query(instance.pool, "SELECT id, status FROM outbound_messages")
    assert replies == [{"outbound_id": out["id"]}] and out["status"] == "sent"
    await slots_given_back(instance, instance.name)


async def test_a_turn_costs_its_entity_no_signal_and_no_timer_while_it_runs(
    instance: Instance,
) -> None:
    """Issue 27 / EG7: the turn tells its entity nothing by Signal (its result says what it
    consumed), and the entity sets no timer while it follows the turn: one `deliver` Signal and
    one timer, the idle one set after the turn."""
    await instance.reply(await instance.chat("count my commands"))
    (stream,) = await query(instance.pool, "SELECT entity_id FROM bus_streams")
    (turn,) = await query(instance.pool, "SELECT id FROM turns")
    entity = instance.client.get_workflow_handle(stream["entity_id"])

    async def after_the_turn() -> list[Any] | None:
        events = list((await entity.fetch_history()).events)
        kinds = [EventType.Name(e.event_type) for e in events]
        done = "EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED"
        return events if done in kinds and kinds[-1] == "EVENT_TYPE_TIMER_STARTED" else None

    events = await wait_for(after_the_turn, timeout=15, what="the entity idle after the turn")
    signals = [e.workflow_execution_signaled_event_attributes.signal_name for e in events
               if e.HasField("workflow_execution_signaled_event_attributes")]  # fmt: skip
    timers = [e for e in events if e.HasField("timer_started_event_attributes")]
    assert (signals, len(timers)) == ([names.SIGNAL_DELIVER], 1)
    turn_events = (await instance.client.get_workflow_handle(turn["id"]).fetch_history()).events
    assert not [e for e in turn_events
                if e.HasField("signal_external_workflow_execution_initiated_event_attributes")]  # fmt: skip


async def test_a_tool_batch_is_answered_whole_before_the_next_step(instance: Instance) -> None:
    mid = await instance.chat(
        'look these up\ncall: lookup {"q": 1}\ncall: weather {"city": "Berlin"}'
    )
    await instance.reply(mid)
    messages = await transcript(instance.pool)
    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]
    calls = messages[1]["tool_calls"]
    assert [c["name"] for c in calls] == ["lookup", "weather"]
    assert [m["tool_call_id"] for m in messages[2:4]] == [c["id"] for c in calls]


async def test_an_owner_message_during_a_turn_merges_at_the_next_step(instance: Instance) -> None:
    first = await instance.chat("slow one\nsleep: 2\ncall: lookup {}")

    async def turn_running() -> bool:
        return bool(await query(instance.pool, "SELECT 1 FROM turns WHERE status = 'running'"))

    await wait_for(turn_running, timeout=15, what="first turn running")
    second = await instance.chat("and also this")
    assert await instance.reply(first) == await instance.reply(second)  # one turn answered both
    messages = await transcript(instance.pool)
    users = [m["content"] for m in messages if m["role"] == "user"]
    assert users[1] == "and also this"
    # B1: the merged message is in the model input of the step after the tool results.
    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant", "tool", "user", "assistant"]
    turns = await query(instance.pool, "SELECT id, consumed_seq FROM turns")
    assert [t["consumed_seq"] for t in turns] == [2]
    # The session's event stream shows the run's start, the merge and the reply, in order.
    events = await read_events(instance, until=names.RUN_REPLY)
    assert [kind for kind, _ in events] == [names.RUN_START, names.RUN_INPUT_MERGED,
                                            names.RUN_REPLY]  # fmt: skip
    assert [doc.get("message_ids") for _, doc in events[:2]] == [[first], [second]]
    assert {doc["turn_id"] for _, doc in events} == {turns[0]["id"]}
    assert events[2][1]["text"] == await instance.reply(first)


async def test_two_customers_never_share_a_history(instance: Instance) -> None:
    """EG17."""
    source = f"grpc:drv-{instance.name}"
    await append_all(instance.pool, [driver_event("alice", 1, source, text="alice here"),
                                     driver_event("bob", 2, source, text="bob here")])  # fmt: skip

    async def both_done() -> bool:
        rows = await query(instance.pool, "SELECT count(*) AS n FROM turns WHERE status = 'done'")
        return rows[0]["n"] == 2

    await wait_for(both_done, timeout=30, what="two turns done")
    stored = await transcripts(instance.pool)
    assert len(stored) == 2
    for messages, own, other in zip(stored.values(), ["alice", "bob"], ["bob", "alice"],
                                    strict=True):  # fmt: skip
        text = str(messages)
        assert (own in text) != (other in text)


async def test_two_users_never_share_a_history_or_a_stream(
    instance: Instance, ingress_url: str
) -> None:
    """EG3, EG17: each user's owner chat is its own conversation and its own event stream;
    the admin's stays on `main`."""
    own: dict[str, tuple[httpx.AsyncClient, int]] = {}
    async with contextlib.AsyncExitStack() as stack:
        for name in ("alice", "bob"):
            r = await instance.api.post("/v1/users", json={"name": name})
            headers = {"Authorization": f"Bearer {r.json()['token']}"}
            api = await stack.enter_async_context(
                httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=10)
            )
            r = await api.post(f"/v1/employees/{instance.name}/chat",
                               json={"client_message_id": "same", "text": f"I am {name}"})  # fmt: skip
            own[name] = (api, int(r.json()["message_id"]))
        own["owner"] = (instance.api, await instance.chat("I am owner"))
        for name, (api, message_id) in own.items():
            as_caller = dataclasses.replace(instance, api=api)
            assert f"I am {name}" in await as_caller.reply(message_id)
            for other, (_, other_id) in own.items():
                if other != name:
                    r = await api.get(f"/v1/employees/{instance.name}/chat/{other_id}")
                    assert r.status_code == 404
            events = await read_events(instance, until=names.RUN_REPLY, api=api)
            assert [doc.get("message_ids") for _, doc in events[:1]] == [[message_id]]
            text = json.dumps(events)
            assert f"I am {name}" in text
            assert not [o for o in own if o != name and f"I am {o}" in text]
        histories = {t: json.dumps(m) for t, m in (await transcripts(instance.pool)).items()}
        threads = {"alice": await user_thread(instance.pool, "alice"),
                   "bob": await user_thread(instance.pool, "bob"),
                   "owner": names.THREAD_MAIN}  # fmt: skip
        assert set(histories) == set(threads.values())
        for name, thread in threads.items():
            assert [o for o in own if f"I am {o}" in histories[thread]] == [name]


async def test_consecutive_messages_each_get_a_reply(instance: Instance) -> None:
    """One at a time, so some arrive just as the previous turn closes (offers that miss)."""
    for i in range(8):
        mid = await instance.chat(f"message {i}")
        assert f"message {i}" in await instance.reply(mid, timeout=15)
    rows = await query(instance.pool, "SELECT consumed_seq, delivered_seq FROM bus_streams")
    assert (rows[0]["consumed_seq"], rows[0]["delivered_seq"]) == (8, 8)


async def test_five_customer_messages_in_the_debounce_window_make_one_turn(
    instance: Instance,
) -> None:
    """EG5: a customer's burst within 2 s of each other (and 8 s in all) is one turn."""
    name = f"c{uuid.uuid4().hex[:8]}"
    await apply_and_start(instance.pool, customer(name))
    source = f"telegram:tg-{name}"
    for n in range(5):
        event = driver_event("+4915100000", n, source, text=f"part {n}", reply_to="+4915100000")
        await append_all(instance.pool, [event])
        await asyncio.sleep(0.4)  # the customer typing: each lands on its own before the next

    async def consumed() -> bool:
        rows = await query(
            instance.pool, f"SELECT consumed_seq FROM bus_streams WHERE employee = '{name}'"
        )
        return bool(rows) and rows[0]["consumed_seq"] == 5

    await wait_for(consumed, timeout=30, what="the burst consumed")
    turns = await query(instance.pool, f"SELECT consumed_seq FROM turns WHERE employee = '{name}'")
    assert [t["consumed_seq"] for t in turns] == [5]
    (stream,) = await query(
        instance.pool, f"SELECT entity_id FROM bus_streams WHERE employee = '{name}'"
    )
    handle = instance.client.get_workflow_handle(stream["entity_id"])
    status = await handle.query(names.QUERY_STATUS, result_type=EntityStatus)
    assert status.signals >= 2  # the parts arrived separately, yet made one turn
    (out,) = await query(
        instance.pool,
        f"SELECT status, kind, account, recipient FROM outbound_messages WHERE employee = '{name}'",
    )
    # One reply through the account the burst came in on; this instance's egress has no
    # Telegram sender, so it waits queued. The customer's number is sealed, never stored.
    assert (out["status"], out["kind"], out["account"]) == ("queued", "telegram", source)
    assert b"+4915100000" not in bytes(out["recipient"])


async def test_a_failing_turn_is_retried_once_then_dead_lettered_with_attention(
    instance: Instance,
) -> None:
    dead_before = sample(DEAD_LETTERS, reason="turn_failed")
    failed_before = sample(TURN_DURATION, "_count", llm_class="c1", outcome="failed")
    bad = await instance.chat("this one breaks\nfail: 400")
    pool = instance.pool

    async def dead() -> bool:
        rows = await query(pool, f"SELECT status FROM chat_messages WHERE id = {bad}")
        return rows[0]["status"] == "dead"

    await wait_for(dead, timeout=40, what="the failing message dead-lettered")
    turns = await query(pool, "SELECT status FROM turns ORDER BY n")
    assert [t["status"] for t in turns] == ["failed", "failed"]  # the first try and one retry
    (delivery,) = await query(pool, "SELECT status, reason FROM bus_deliveries")
    assert delivery["status"] == "dead" and delivery["reason"].startswith("turn_failed")
    assert sample(DEAD_LETTERS, reason="turn_failed") == dead_before + 1
    assert sample(TURN_DURATION, "_count", llm_class="c1", outcome="failed") == failed_before + 2
    (item,) = await query(pool, "SELECT kind, severity, detail, count FROM attention_items")
    assert (item["kind"], item["severity"], item["count"]) == ("dead_input", "error", 1)
    (stream,) = await query(pool, "SELECT consumed_seq FROM bus_streams")
    assert stream["consumed_seq"] == 1
    good = await instance.chat("and now a normal one")  # the stream goes on
    assert "a normal one" in await instance.reply(good)


async def test_a_turn_that_fails_after_its_save_never_runs_its_inputs_again(
    instance: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn tells its entity nothing by Signal: when its send fails after the consuming
    save, the entity reads from the database that the input is settled, and the next message
    starts a turn of its own instead of running the consumed one a second time."""
    send = Egress.send
    failed: list[int] = []

    async def first_send_fails(self: Egress, outbound_id: int, claim_ttl_s: float) -> str:
        q = "SELECT employee FROM outbound_messages WHERE id = %s"
        (row,) = await query(instance.pool, q, outbound_id)
        if not failed and row["employee"] == instance.name:  # not another test's late send
            failed.append(outbound_id)
            raise NotFound("the chat table went away")  # non-retryable: the turn fails
        return await send(self, outbound_id, claim_ttl_s)

    monkeypatch.setattr(Egress, "send", first_send_fails)
    await instance.chat("saved but never sent")

    first = await wait_for(lambda: query(instance.pool, "SELECT id FROM turns"), timeout=30,
                           what="the first turn admitted")  # fmt: skip
    handle = instance.client.get_workflow_handle(first[0]["id"])

    async def first_failed() -> bool:
        try:
            return (await handle.describe()).status == WorkflowExecutionStatus.FAILED
        except RPCError:  # admitted (the turn row exists) but the child is not started yet
            return False

    await wait_for(first_failed, timeout=30, what="the first turn failed after its save")
    await slots_given_back(instance, instance.name)  # the entity took in the turn's end
    second = await instance.chat("the next one")
    assert "the next one" in await instance.reply(second)
    turns = await query(instance.pool, "SELECT id FROM turns ORDER BY n")
    assert len(turns) == 2, "the consumed input started a turn again"
    users = [m["content"] for m in await transcript(instance.pool) if m["role"] == "user"]
    assert users == ["saved but never sent", "the next one"], "an input ran twice"
    (stream,) = await query(instance.pool, "SELECT consumed_seq FROM bus_streams")
    assert stream["consumed_seq"] == 2


async def test_a_long_conversation_continues_as_new_and_consumes_everything_once(
    instance: Instance,
) -> None:
    source = f"grpc:drv-{instance.name}"
    rolled_before = sample(RUN_SIGNALS, "_count", end="rolled")
    for batch in range(40):  # slow steps, so inputs keep arriving while turns run
        events = [driver_event("one", batch * 3 + n, source, text=f"part {batch * 3 + n}\nsleep: 0.4")
                  for n in range(3)]  # fmt: skip
        await append_all(instance.pool, events)
        await asyncio.sleep(0.1)

    async def all_consumed() -> bool:
        rows = await query(
            instance.pool, "SELECT consumed_seq FROM bus_streams WHERE thread <> 'main'"
        )
        return bool(rows) and rows[0]["consumed_seq"] == 120

    await wait_for(all_consumed, timeout=90, interval=0.2, what="120 inputs consumed")
    turns = await query(
        instance.pool, "SELECT n, consumed_seq FROM turns WHERE status = 'done' ORDER BY n"
    )
    ends = [t["consumed_seq"] for t in turns]
    assert ends == sorted(ends) and ends[-1] == 120 and len(set(ends)) == len(ends)
    rows = await query(instance.pool, "SELECT status, count(*) AS n FROM bus_deliveries GROUP BY 1")
    assert {r["status"]: r["n"] for r in rows} == {"done": 120}
    (stream,) = await query(
        instance.pool, "SELECT entity_id, thread FROM bus_streams WHERE thread <> 'main'"
    )
    runs = [
        w async for w in instance.client.list_workflows(f"WorkflowId = '{stream['entity_id']}'")
    ]
    assert len(runs) >= 2  # it continued as new at least once
    # Each run that rolled reported its Signals and history size as it ended.
    assert sample(RUN_SIGNALS, "_count", end="rolled") >= rolled_before + len(runs) - 1
    assert sample(RUN_HISTORY_BYTES, "_sum", end="rolled") > 0
    messages = await transcript(instance.pool, stream["thread"])
    users = [m for m in messages if m["role"] == "user"]
    assert len(users) == 120  # every input reached the model exactly once


async def test_an_idle_entity_passivates_and_restarts_from_the_cursor(instance: Instance) -> None:
    first = await instance.chat("before the nap")
    await instance.reply(first)
    (stream,) = await query(instance.pool, "SELECT entity_id FROM bus_streams")
    handle = instance.client.get_workflow_handle(stream["entity_id"], result_type=EntityStatus)

    async def closed() -> bool:
        return (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED

    await wait_for(closed, timeout=20, interval=0.2, what="the entity passivated")
    done = await handle.result()
    assert (done.applied_seq, done.pending) == (1, 0)
    second = await instance.chat("after the nap")  # Signal-With-Start makes a new run
    assert "after the nap" in await instance.reply(second)
    restarted = await handle.query(names.QUERY_STATUS, result_type=EntityStatus)
    assert (restarted.applied_seq, restarted.received, restarted.dropped) == (2, 1, 0)
    runs = [
        w async for w in instance.client.list_workflows(f"WorkflowId = '{stream['entity_id']}'")
    ]
    assert len(runs) == 2


async def entity_of(instance: Instance, employee: str) -> Any:
    async def known() -> str | None:
        rows = await query(
            instance.pool, f"SELECT entity_id FROM bus_streams WHERE employee = '{employee}'"
        )
        return rows[0]["entity_id"] if rows else None

    entity_id = await wait_for(known, timeout=15, what="the stream")
    return instance.client.get_workflow_handle(entity_id)


async def test_interrupt_stops_a_lower_class_turn_and_the_higher_class_runs_next(
    instance: Instance,
) -> None:
    name = f"i{uuid.uuid4().hex[:8]}"
    await apply_and_start(instance.pool, two_classes(name))
    await append_all(instance.pool, [driver_event("x", 1, f"grpc:low-{name}",
                                                  text="slow chore\nsleep: 4\ncall: lookup {}")])  # fmt: skip
    handle = await entity_of(instance, name)

    async def status() -> EntityStatus:
        return await handle.query(names.QUERY_STATUS, result_type=EntityStatus)  # type: ignore[no-any-return]

    async def running() -> EntityStatus | None:
        try:
            s = await status()
        except RPCError:  # not started by the relay yet
            return None
        return s if s.turn_id else None

    low = await wait_for(running, timeout=15, what="the C4 turn running")
    assert low.turn_class == 4
    await append_all(instance.pool, [driver_event("x", 2, f"grpc:high-{name}", text="urgent")])

    async def both_pending() -> bool:
        return (await status()).pending == 2

    await wait_for(both_pending, timeout=15, what="the C1 input delivered")
    # The validator refuses, without writing history: a turn that is not running here, and a
    # turn that is not below the interrupter's class.
    for wrong, why in [(InterruptTurn("turn-nope"), "not running"),
                       (InterruptTurn(str(low.turn_id), by_class=4), "not below C4")]:  # fmt: skip
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(names.UPDATE_INTERRUPT, wrong)
        assert why in str(refused.value.cause)
    answer = await handle.execute_update(
        names.UPDATE_INTERRUPT, InterruptTurn(str(low.turn_id)), result_type=str
    )
    assert answer == "interrupted"

    async def three_turns() -> list[dict[str, Any]] | None:
        rows = await query(instance.pool, f"SELECT n, class, status, consumed_seq FROM turns "
                                          f"WHERE employee = '{name}' ORDER BY n")  # fmt: skip
        return rows if len(rows) == 3 and rows[2]["status"] == "done" else None

    turns = await wait_for(three_turns, timeout=40, what="the interrupted input run again")
    # The C4 turn stopped at its merge point and saved nothing; the C1 input ran next; then
    # the C4 input ran again, whole.
    assert [(t["class"], t["status"], t["consumed_seq"]) for t in turns] == [
        (4, "interrupted", None), (1, "done", 2), (4, "done", 1)]  # fmt: skip
    (stream,) = await query(instance.pool, f"SELECT consumed_seq FROM bus_streams "
                                           f"WHERE employee = '{name}'")  # fmt: skip
    assert stream["consumed_seq"] == 2
    users = [m["content"] for m in await transcript(instance.pool) if m["role"] == "user"]
    assert users == ["urgent", "slow chore\nsleep: 4\ncall: lookup {}"]
    await slots_given_back(instance, name)


async def test_a_draft_overtaken_on_a_customer_channel_takes_one_more_step(
    instance: Instance,
) -> None:
    """Merge point B2: the unsent final answer stays as a draft, a note, one more step."""
    name = f"c{uuid.uuid4().hex[:8]}"
    await apply_and_start(instance.pool, customer(name))
    source = f"telegram:tg-{name}"
    await append_all(
        instance.pool,
        [driver_event("+4915100001", 1, source, text="hi\nsleep: 3", reply_to="+4915100001")],
    )

    async def running() -> bool:
        rows = await query(instance.pool, f"SELECT 1 FROM turns WHERE employee = '{name}'")
        return bool(rows)

    await wait_for(running, timeout=20, what="the customer turn running")
    await append_all(
        instance.pool,
        [driver_event("+4915100001", 2, source, text="and more", reply_to="+4915100001")],
    )

    async def done() -> list[dict[str, Any]] | None:
        rows = await query(instance.pool, f"SELECT status, consumed_seq FROM turns "
                                          f"WHERE employee = '{name}'")  # fmt: skip
        return rows if rows and rows[0]["status"] == "done" else None

    (turn,) = await wait_for(done, timeout=30, what="the turn done")
    assert turn["consumed_seq"] == 2
    ((_, messages),) = (await transcripts(instance.pool, name)).items()
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "user", "assistant"]
    assert "hi" in messages[1]["content"]  # the draft, kept
    assert "not sent" in messages[2]["content"]  # the one-line note
    assert messages[3]["content"] == "and more"
    (out,) = await query(instance.pool, f"SELECT body FROM outbound_messages "
                                        f"WHERE employee = '{name}'")  # fmt: skip
    assert out["body"] == messages[4]["content"] and "and more" in out["body"]


async def test_a_cancelled_entity_drains_its_turn_and_gives_the_slot_back(
    instance: Instance,
) -> None:
    mid = await instance.chat("a long think\nsleep: 600")

    async def running() -> str | None:
        rows = await query(instance.pool, "SELECT id FROM turns WHERE status = 'running'")
        return rows[0]["id"] if rows else None

    turn_id = await wait_for(running, timeout=15, what="the turn running")
    await step_started(instance, turn_id)
    (stream,) = await query(instance.pool, "SELECT entity_id FROM bus_streams")
    entity = instance.client.get_workflow_handle(stream["entity_id"])
    await entity.cancel()

    async def cancelled() -> bool:
        rows = await query(instance.pool, f"SELECT status FROM turns WHERE id = '{turn_id}'")
        return rows[0]["status"] == "cancelled"

    # The step heartbeats every 10 s and the cancel comes back on a heartbeat.
    await wait_for(cancelled, timeout=60, interval=0.2, what="the turn cancelled")
    turn = instance.client.get_workflow_handle(turn_id)
    assert (await turn.describe()).status == WorkflowExecutionStatus.CANCELED
    events = [e async for e in turn.fetch_history_events()]
    assert any(e.HasField("activity_task_canceled_event_attributes") for e in events)
    assert (await entity.describe()).status == WorkflowExecutionStatus.CANCELED
    await slots_given_back(instance, instance.name)
    (msg,) = await query(instance.pool, f"SELECT status FROM chat_messages WHERE id = {mid}")
    assert msg["status"] == "delivered"  # taken by the run, never answered, not lost


async def test_a_customer_group_debounces_longer_than_a_direct_chat(instance: Instance) -> None:
    """Customer groups 3 s / 10 s (SPEC §8): messages 2.5 s apart still make one turn."""
    name = f"g{uuid.uuid4().hex[:8]}"
    await apply_and_start(instance.pool, customer(name))
    source = f"telegram:tg-{name}"
    for n in range(3):
        event = driver_event("group-42", n, source, text=f"part {n}")
        event.envelope[names.GROUP_ATTRIBUTE] = names.GROUP_CHAT  # the driver says: a group
        await append_all(instance.pool, [event])
        if n < 2:
            await asyncio.sleep(2.5)  # longer than a direct chat's 2 s window

    async def consumed() -> list[dict[str, Any]] | None:
        q = f"SELECT consumed_seq FROM turns WHERE employee = '{name}' AND status = 'done'"
        rows = await query(instance.pool, q)
        return rows if rows and max(r["consumed_seq"] for r in rows) == 3 else None

    turns = await wait_for(consumed, timeout=30, what="the group's messages consumed")
    assert [t["consumed_seq"] for t in turns] == [3]  # one turn took all three
    (delivery,) = await query(instance.pool, f"SELECT DISTINCT route FROM bus_deliveries d "
                                             f"JOIN bus_streams s USING (stream_key) "
                                             f"WHERE s.employee = '{name}'")  # fmt: skip
    assert delivery["route"]["group"] is True


async def test_a_turn_that_does_not_close_within_its_grace_is_terminated(
    instance: Instance,
) -> None:
    """The last resort of cancellation: the step cannot hear the cancel before its first
    heartbeat (30 s here), so the turn outlives the entity's 1 s grace and is terminated."""
    instance.llm.heartbeat_s = 30.0
    instance.relay.entity_cancel_grace_s = 1.0
    await instance.chat("stuck\nsleep: 600")

    async def running() -> str | None:
        rows = await query(instance.pool, "SELECT id FROM turns WHERE status = 'running'")
        return rows[0]["id"] if rows else None

    turn_id = await wait_for(running, timeout=15, what="the turn running")
    turn = instance.client.get_workflow_handle(turn_id)
    await step_started(instance, turn_id)
    (stream,) = await query(instance.pool, "SELECT entity_id FROM bus_streams")
    entity = instance.client.get_workflow_handle(stream["entity_id"])
    await entity.cancel()

    async def entity_closed() -> bool:
        return (await entity.describe()).status == WorkflowExecutionStatus.CANCELED

    await wait_for(entity_closed, timeout=20, interval=0.2, what="the entity cancelled")
    assert (await turn.describe()).status == WorkflowExecutionStatus.TERMINATED
    (row,) = await query(instance.pool, f"SELECT status FROM turns WHERE id = '{turn_id}'")
    assert row["status"] == "cancelled"
    await slots_given_back(instance, instance.name)
