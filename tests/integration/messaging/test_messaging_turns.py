"""Employees messaging each other through whole turns on the real dev server and PostgreSQL:
the local provider's `call:` scripts drive the tools, the in-process router (with its
messaging upkeep), relay, workers and the delegators' supervisors (whose one timer fires the
task deadlines) do the rest (SPEC §10, scenario (e), EG18)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from conftest import ADMIN_TOKEN
from messaging_helpers import team
from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDReusePolicy
from test_alarms import add_users, user_says
from test_router import query
from test_turns import IDLE_S, PRICES, PUMP_STOP_S, ROLL_AFTER, pump, transcript, transcripts

from eventos import names
from eventos.contracts import Control, SupervisorInput
from eventos.control.intent_deliverer import Deliverer
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.delivery.relay import Relay
from eventos.llm.activity import LlmActivities
from eventos.llm.endpoints import LlmEndpoints
from eventos.llm.worker import llm_worker
from eventos.messaging.storm import flush_due
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.payload_guard import connect
from eventos.runtime.service import cancel_and_wait
from eventos.runtime.temporal import TemporalConnection
from eventos.settings import SecretStore, TemporalSettings
from eventos.testing import mentions, wait_for
from eventos.workers.activities import DbActivities
from eventos.workers.roles import egress_worker, workflow_worker

pytestmark = pytest.mark.temporal


@dataclass
class Team:
    a: str
    b: str
    client: Client
    api: httpx.AsyncClient
    pool: AsyncConnectionPool[Conn]

    async def chat(self, name: str, text: str) -> int:
        r = await self.api.post(f"/v1/employees/{name}/chat",
                                json={"client_message_id": uuid.uuid4().hex, "text": text})  # fmt: skip
        assert r.status_code == 202, r.text
        return int(r.json()["message_id"])

    async def replies(self, name: str, count: int, timeout: float = 45) -> list[str]:
        """The first `count` replies sent to `name`'s owner chat, in order."""

        async def sent() -> list[str] | None:
            rows = await query(self.pool, "SELECT body FROM outbound_messages WHERE employee = %s "
                                          "AND kind = 'chat' AND status = 'sent' ORDER BY id",
                               name)  # fmt: skip
            return [str(r["body"]) for r in rows] if len(rows) >= count else None

        return await wait_for(sent, timeout=timeout, interval=0.1, what=f"{count} replies")


async def digests(conn: Conn) -> None:
    """The router's messaging upkeep: digests that are due."""
    await flush_due(conn, datetime.now(UTC))


async def supervise(pool: AsyncConnectionPool[Conn], client: Client, queue: str,
                    employee: str) -> WorkflowHandle[Any, Any]:  # fmt: skip
    """The running generation's supervisor on the test queue, as a rebuild would start it."""
    async with pool.connection() as conn:
        cur = await conn.execute(Q["generation_control"], {"employee": employee, "generation": 1})
        row = await cur.fetchone()
    assert row is not None
    control = Control.from_row(row)
    return await client.start_workflow(
        names.WF_SUPERVISOR, SupervisorInput(employee, 1, control, continued=True),
        id=names.supervisor_id(employee, 1), task_queue=queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )  # fmt: skip


@pytest.fixture
async def pair(
    pool: AsyncConnectionPool[Conn],
    ingress_url: str,
    temporal_settings: TemporalSettings,
    outbox_keys: OutboxKeys,
    llm_endpoints: LlmEndpoints,
) -> AsyncIterator[Team]:
    a, b = await team(pool, "a", "b")
    client = await connect(temporal_settings.address, temporal_settings.namespace)
    queue = f"wf-{uuid.uuid4().hex[:8]}"
    db = DbActivities(pool, outbox=outbox_keys)
    async with httpx.AsyncClient() as http:
        llm = LlmActivities(http, SecretStore(env={}), pool, PRICES, endpoints=llm_endpoints)
        workers = [workflow_worker(client, queue, db), egress_worker(client, db, queue)]
        workers += [llm_worker(client, k, 4, llm, workflow_queue=queue) for k in (1, 2, 3, 4)]
        relay = Relay(pool, TemporalConnection(temporal_settings), "relay-m", task_queue=queue,
                      entity_roll_after=ROLL_AFTER, entity_idle_s=IDLE_S)  # fmt: skip
        deliverer = Deliverer(pool, TemporalConnection(temporal_settings), workflow_queue=queue,
                              outbox=outbox_keys)  # fmt: skip
        async with contextlib.AsyncExitStack() as stack:
            for w in workers:
                await stack.enter_async_context(w)
            supervisors = [await supervise(pool, client, queue, n) for n in (a, b)]
            pumping = asyncio.create_task(pump(pool, relay, deliverer, digests))
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=10) as api:
                try:
                    yield Team(a, b, client, api, pool)
                finally:
                    await cancel_and_wait([pumping], PUMP_STOP_S)
                    for handle in supervisors:
                        await handle.terminate("test over")


def script(tool: str, **args: object) -> str:
    """A `call:` line for the local provider (one line: JSON escapes any newline)."""
    return f"call: {tool} {json.dumps(args)}"


async def no_reply_from(pool: AsyncConnectionPool[Conn], employee: str) -> None:
    """A turn in a `peer_` thread writes nothing to the outbox (SPEC §8)."""
    assert await query(pool, "SELECT 1 FROM outbound_messages WHERE employee = %s", employee) == []


async def test_a_delegated_result_continues_the_owner_chat_and_reaches_the_owner(
    pair: Team,
) -> None:
    a, b = pair.a, pair.b
    task = "count the apples\n" + script("complete_task", result="42 apples")
    await pair.chat(a, "ask b\n" + script("delegate_to_employee", to=b, task=task))
    first, second = await pair.replies(a, 2)
    assert "delegate_to_employee returned" in first and "task_" in first
    assert "42 apples" in second  # A's next turn read the result, and the owner got the reply
    (done,) = await query(pair.pool, "SELECT status, result FROM ipc_tasks")
    assert (done["status"], done["result"]) == ("done", "42 apples")
    # A's second turn continued the same conversation (thread main of the talk lane).
    turns = await query(pair.pool, "SELECT thread, stream_key FROM turns WHERE employee = %s", a)
    assert {t["stream_key"] for t in turns} == {f"{a}/g1/talk/main"} and len(turns) == 2
    users = [m["content"] for m in await transcript(pair.pool, "main", a) if m["role"] == "user"]
    assert len(users) == 2 and users[1].endswith("\n42 apples")
    # B worked in its thread for A's owner chat: its final text stays there and goes nowhere.
    said = await transcript(pair.pool, names.peer_thread(a, "talk", "main"), b)
    assert [m["role"] for m in said] == ["user", "assistant", "tool", "assistant"]
    assert "complete_task returned" in str(said[-1]["content"])
    await no_reply_from(pair.pool, b)


async def test_a_deadline_delivers_timed_out_to_the_delegating_conversation(pair: Team) -> None:
    a, b = pair.a, pair.b
    await pair.chat(a, script("delegate_to_employee", to=b, task="think forever", deadline_s=2))
    _, second = await pair.replies(a, 2)
    (task,) = await query(pair.pool, "SELECT id, status, deadline_at FROM ipc_tasks")
    assert task["status"] == "timed_out"
    notice = f"[task {task['id']} for {b} timed out at {task['deadline_at'].isoformat()}"
    assert notice in second  # A's next turn read the notice, and the owner got the reply
    # A's supervisor fired the task's deadline (its one timer), once.
    (alarm,) = await query(pair.pool, "SELECT employee, kind, ref, status, fired_at FROM alarms")
    assert (alarm["employee"], alarm["kind"], alarm["ref"],
            alarm["status"]) == (a, "deadline", f"task:{task['id']}", "fired")  # fmt: skip
    assert alarm["fired_at"] >= task["deadline_at"]
    rows = await query(pair.pool, "SELECT dedupe_key FROM bus_ingress WHERE source_key = %s",
                       f"ipc:{a}")  # fmt: skip
    assert [r["dedupe_key"] for r in rows] == [f"timed_out:{task['id']}"]
    turns = await query(pair.pool, "SELECT stream_key FROM turns WHERE employee = %s", a)
    assert {t["stream_key"] for t in turns} == {f"{a}/g1/talk/main"} and len(turns) == 2
    await no_reply_from(pair.pool, b)


async def test_a_message_back_along_the_path_is_suppressed_as_a_cycle(pair: Team) -> None:
    a, b = pair.a, pair.b
    back = script("send_to_employee", to=a, text="ping back")
    await pair.chat(a, script("send_to_employee", to=b, text=back))

    async def cut() -> list[dict[str, object]]:
        return await query(pair.pool, "SELECT status, error, hop FROM bus_ingress "
                                      "WHERE source_key = %s", f"ipc:{a}")  # fmt: skip

    (row,) = await wait_for(cut, timeout=45, what="b's message back to a")
    await wait_for(lambda: _settled(pair.pool, a), timeout=10, what="routed")
    (row,) = await cut()
    assert (row["status"], row["error"], row["hop"]) == (
        "dead",
        f"loop_suppressed: cycle {a} -> {b} -> {a}",
        2,
    )
    said = await wait_for(lambda: transcript(pair.pool, names.peer_thread(a, "talk", "main"), b),
                          timeout=15,
                          what="b's turn saved")  # fmt: skip
    assert "send_to_employee returned" in str(said[-1]["content"])
    await no_reply_from(pair.pool, b)
    (item,) = await query(pair.pool, "SELECT kind, ref FROM attention_items")
    assert (item["kind"], item["ref"]) == ("loop_suppressed", f"edge:{b}->{a}")


async def _settled(pool: AsyncConnectionPool[Conn], a: str) -> bool:
    rows = await query(pool, "SELECT 1 FROM bus_ingress WHERE source_key = %s AND "
                             "status = 'accepted'", f"ipc:{a}")  # fmt: skip
    return rows == []


def ping_pong(b: str, rounds: int) -> str:
    """The owner's script for A: delegate to B; B's task completes with a result that makes A
    delegate again, `rounds` times over (each level's script nested in the one before)."""
    text = "this task never arrives"
    for _ in range(rounds):
        text = script("complete_task", result=script("delegate_to_employee", to=b, task=text))
    return script("delegate_to_employee", to=b, task=text)


async def test_a_delegation_ping_pong_through_real_turns_is_cut_at_8_hops(pair: Team) -> None:
    a, b = pair.a, pair.b
    await pair.chat(a, ping_pong(b, 4))  # hops 1-8 pass; A's fifth delegation would be hop 9
    await pair.replies(a, 5, timeout=90)

    async def cut() -> list[dict[str, object]]:
        return await query(pair.pool, "SELECT hop, status, error FROM bus_ingress WHERE "
                                      "source_key = %s AND status = 'dead'", f"ipc:{b}")  # fmt: skip

    (row,) = await wait_for(cut, timeout=30, what="the ninth hop cut")
    assert (row["hop"], row["error"]) == (9, "loop_suppressed: hop 9")
    hops = await query(pair.pool, "SELECT hop FROM bus_deliveries ORDER BY hop")
    assert [h["hop"] for h in hops if h["hop"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    tasks = await query(pair.pool, "SELECT status, count(*) AS n FROM ipc_tasks GROUP BY 1")
    assert {t["status"]: t["n"] for t in tasks} == {"done": 4, "cancelled": 1}
    await no_reply_from(pair.pool, b)


# --- EG17: one thread of B per conversation of A ---------------------------------------------


async def peer_threads(pool: AsyncConnectionPool[Conn], a: str, b: str,
                       *texts: str) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """B's transcripts of threads holding A's wakes, once each of `texts` is in one of them
    and every turn there has finished."""

    async def answered() -> dict[str, list[dict[str, Any]]] | None:
        said = {t: m for t, m in (await transcripts(pool, b)).items()
                if t.startswith(f"peer_{a}")}  # fmt: skip
        seen = json.dumps(said)
        done = all(m and m[-1]["role"] == "assistant" for m in said.values())
        return said if done and all(t in seen for t in texts) else None

    return await wait_for(answered, timeout=45, what=f"{texts} answered by {b}")


async def test_two_conversations_of_a_land_in_two_threads_of_b(
    pair: Team, ingress_url: str
) -> None:
    a, b = pair.a, pair.b
    ann, ben = await add_users(pair.api, "ann", "ben")
    secrets = {ann: "ann's card ends 1111", ben: "ben's card ends 2222"}
    for token, secret in secrets.items():
        said = await user_says(token, ingress_url, a, script("send_to_employee", to=b, text=secret))
        assert "send_to_employee returned" in said
    threads = await peer_threads(pair.pool, a, b, *secrets.values())
    assert len(threads) == 2  # one thread of B per conversation of A
    texts = {t: json.dumps(m) for t, m in threads.items()}
    (ann_thread,) = [t for t, text in texts.items() if "1111" in text]
    (ben_thread,) = [t for t, text in texts.items() if "2222" in text]
    assert ann_thread != ben_thread
    assert "2222" not in texts[ann_thread] and "1111" not in texts[ben_thread]
    # The thread's name carries no personal data: the sender and a hash of its conversation.
    for thread in threads:
        assert thread.startswith(f"peer_{a}_") and "ann" not in thread and "ben" not in thread
    await no_reply_from(pair.pool, b)


async def test_a_delegated_result_returns_to_the_delegating_conversation_only(
    pair: Team, ingress_url: str
) -> None:
    a, b = pair.a, pair.b
    ann, ben = await add_users(pair.api, "ann", "ben")
    # A's other conversation told B something of ben's first.
    await user_says(ben, ingress_url, a, script("send_to_employee", to=b, text="ben: 2222"))
    await peer_threads(pair.pool, a, b, "ben: 2222")
    task = "look up ann's order\n" + script("complete_task", result="order 4711 shipped")
    said = await user_says(ann, ingress_url, a, script("delegate_to_employee", to=b, task=task))
    assert "delegate_to_employee returned" in said

    async def result_replied() -> list[dict[str, Any]] | None:
        rows = await query(pair.pool, "SELECT thread, audience, body FROM outbound_messages "
                                      "WHERE employee = %s AND body LIKE %s", a,
                           "%order 4711 shipped%")  # fmt: skip
        return rows or None

    (reply,) = await wait_for(result_replied, timeout=45, what="A's reply on the task's result")
    ann_thread = str(reply["thread"]).rsplit("/", 1)[1]  # the outbox names the stream
    said_by_a = await transcripts(pair.pool, a)
    with_result = [t for t, m in said_by_a.items() if "order 4711 shipped" in json.dumps(m)]
    assert with_result == [ann_thread]  # only the delegating conversation holds it
    ben_thread = next(t for t, m in said_by_a.items() if "ben: 2222" in json.dumps(m))
    assert ben_thread != ann_thread and reply["audience"] not in (None, "owner")
    assert not mentions("2222", said_by_a[ann_thread])
    (task_row,) = await query(pair.pool, "SELECT reply_to, to_thread, status FROM ipc_tasks")
    assert task_row["status"] == "done" and task_row["reply_to"]["thread"] == ann_thread
    # B worked on ann's task in a thread that never held ben's message (EG17 by composition).
    threads = await peer_threads(pair.pool, a, b, "order 4711")
    assert "order 4711" in json.dumps(threads[task_row["to_thread"]])
    assert not mentions("2222", threads[task_row["to_thread"]])
    await no_reply_from(pair.pool, b)
