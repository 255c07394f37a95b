"""Messages and delegation between employees on real PostgreSQL (SPEC §10, §15): the tools
write `ipc_tasks` and the inbox in the sender's transaction, the router places each wake, only
the assignee completes a task, a task's deadline (an alarm fired by `fire_due`) turns into
`timed_out` once, a result in time cancels it, and the bounds hold."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from messaging_helpers import call, landed, run, team
from psycopg_pool import AsyncConnectionPool
from test_router import query

from eventos import names
from eventos.alarms import store
from eventos.bus.inbox import IngressRecord, append
from eventos.db import Conn
from eventos.delivery.routing import route_pass
from eventos.employees import lifecycle
from eventos.messaging import ipc


async def route(pool: AsyncConnectionPool[Conn], now: datetime | None = None) -> None:
    async with pool.connection() as conn:
        while (await route_pass(conn, now=now)).rows:
            pass


async def deliveries(pool: AsyncConnectionPool[Conn], employee: str) -> list[dict[str, object]]:
    return await query(pool, "SELECT stream_key, thread, type, route, hop, payload, class "
                             "FROM bus_deliveries WHERE stream_key LIKE %s ORDER BY id",
                       f"{employee}/%")  # fmt: skip


async def test_a_message_lands_in_the_peer_thread_with_no_reply_route(
    pool: AsyncConnectionPool[Conn],
) -> None:
    a, b = await team(pool, "a", "b")
    c = call(a, "send_to_employee", {"to": b, "text": "the report is ready"}, hop=2, path=["x"])
    outcome, out = await run(pool, c)
    assert outcome == names.TOOL_OK and out["message_id"].startswith("msg_")
    assert await run(pool, c) == (outcome, out)  # a retried attempt reads the stored result
    await route(pool)
    (d,) = await deliveries(pool, b)
    peer = landed(a)["thread"]  # a's owner chat's own thread of b
    assert (d["stream_key"], d["thread"], d["type"]) == (f"{b}/g1/worker/{peer}", peer,
                                                         names.TYPE_IPC_MESSAGE)  # fmt: skip
    assert d["route"]["reply"] is False and d["route"]["kind"] == "ipc"
    assert d["class"] == names.C3_INTERNAL and d["hop"] == 3
    assert d["payload"][names.ATTR_PATH] == ["x", a]
    assert d["payload"]["data"]["text"].endswith("\nthe report is ready")
    assert a in d["payload"]["data"]["text"]  # the reader sees who wrote


async def test_refusals_name_the_employee(pool: AsyncConnectionPool[Conn]) -> None:
    a, b = await team(pool, "a", "b")
    (idle,) = await team(pool, "i", activate=False)
    cases = [
        ({"to": "nobody", "text": "hi"}, "no employee named 'nobody' in this instance"),
        ({"to": a, "text": "hi"}, "an employee cannot message itself"),
        ({"to": idle, "text": "hi"}, f"employee {idle!r} is not running (starting)"),
        ({"to": b, "text": ""}, "invalid arguments at text"),
    ]
    for args, error in cases:
        outcome, out = await run(pool, call(a, "send_to_employee", args))
        assert outcome == names.TOOL_REFUSED and error in out["error"], out
        task = {"to": args["to"], "task": args["text"]}
        outcome, out = await run(pool, call(a, "delegate_to_employee", task))
        assert outcome == names.TOOL_REFUSED and error.replace("text", "task") in out["error"], out
    assert await query(pool, "SELECT 1 FROM bus_ingress WHERE source_key LIKE 'ipc:%'") == []
    assert await query(pool, "SELECT 1 FROM ipc_tasks") == []


async def test_delegation_result_goes_back_to_the_delegating_thread_and_route(
    pool: AsyncConnectionPool[Conn],
) -> None:
    a, b, c = await team(pool, "a", "b", "c")
    outcome, out = await run(pool, call(a, "delegate_to_employee", {"to": b, "task": "count"}))
    assert outcome == names.TOOL_OK
    task_id = out["task_id"]
    (task,) = await query(pool, "SELECT * FROM ipc_tasks")
    assert (task["from_employee"], task["to_employee"], task["status"]) == (a, b, "open")
    assert task["reply_to"] == {"thread": "main", "lane": "talk", "route": call(a, "x", {}).route}
    await route(pool)
    (d,) = await deliveries(pool, b)
    assert d["type"] == names.TYPE_IPC_TASK and d["payload"]["data"]["task_id"] == task_id
    # Only the assignee completes it.
    in_b = {**landed(a), "route": d["route"], "hop": 1, "path": [a]}
    outcome, out = await run(pool, call(c, "complete_task", {"task_id": task_id, "result": "1"}))
    assert outcome == names.TOOL_REFUSED and out["error"] == (
        f"task {task_id} is {b}'s: only the assignee completes it"
    )
    done = call(b, "complete_task", {"result": "42"}, woken_tasks=[task_id], **in_b)
    assert await run(pool, done) == (names.TOOL_OK, {"task_id": task_id, "status": "done"})
    again = call(b, "complete_task", {"task_id": task_id, "result": "43"}, **in_b)
    outcome, out = await run(pool, again)
    assert outcome == names.TOOL_REFUSED and out["error"] == f"task {task_id} is already done"
    await route(pool)
    (r,) = await deliveries(pool, a)
    assert (r["stream_key"], r["type"]) == (f"{a}/g1/talk/main", names.TYPE_IPC_RESULT)
    assert r["route"]["kind"] == "chat" and r["route"]["reply"] is True  # the owner's reply route
    assert r["route"]["session"] == "owner" and r["hop"] == 2
    assert r["payload"][names.ATTR_PATH] == []  # the delegation returned like a call
    assert r["payload"]["data"]["text"].endswith("\n42")
    (task,) = await query(pool, "SELECT status, result FROM ipc_tasks")
    assert (task["status"], task["result"]) == ("done", "42")


async def test_only_the_thread_a_task_landed_in_completes_it(
    pool: AsyncConnectionPool[Conn],
) -> None:
    """EG17: a task from one of A's conversations is B's to complete in the thread it landed
    in; B's thread for another conversation of A (or any other thread) is answered as for an
    unknown task, and the result returns to the delegating conversation alone."""
    a, b = await team(pool, "a", "b")
    alice, bob = "t_" + "a" * 16, "t_" + "b" * 16  # two customers' conversations of A
    customer = {"kind": "grpc", "trigger": "grpc", "reply": True}
    _, out = await run(pool, call(a, "delegate_to_employee", {"to": b, "task": "alice's refund"},
                                  lane="customer", thread=alice, route=customer))  # fmt: skip
    task_id = out["task_id"]
    await run(pool, call(a, "send_to_employee", {"to": b, "text": "bob's address"},
                         lane="customer", thread=bob, route=customer))  # fmt: skip
    await route(pool)
    by_thread = {str(d["thread"]): d for d in await deliveries(pool, b)}
    assert set(by_thread) == {landed(a, "customer", alice)["thread"],
                              landed(a, "customer", bob)["thread"]}  # fmt: skip
    unknown = "task_" + "0" * 16
    for elsewhere in (landed(a, "customer", bob), landed(a), {"lane": "talk", "thread": "main"}):
        refused = await run(pool, call(b, "complete_task", {"task_id": task_id,
                                                            "result": "bob's address"},
                                       **elsewhere))  # fmt: skip
        as_unknown = await run(pool, call(b, "complete_task", {"task_id": unknown, "result": "x"},
                                          **elsewhere))  # fmt: skip
        assert refused[0] == as_unknown[0] == names.TOOL_REFUSED
        assert refused[1]["error"] == as_unknown[1]["error"].replace(unknown, task_id)
    (task,) = await query(pool, "SELECT status FROM ipc_tasks")
    assert task["status"] == "open"
    done = call(b, "complete_task", {"result": "refunded"}, woken_tasks=[task_id],
                **landed(a, "customer", alice))  # fmt: skip
    assert (await run(pool, done))[0] == names.TOOL_OK
    await route(pool)
    (r,) = await deliveries(pool, a)
    assert r["stream_key"] == f"{a}/g1/customer/{alice}"
    assert r["payload"]["data"]["text"].endswith("\nrefunded")


async def fire(pool: AsyncConnectionPool[Conn], employee: str, *,
               due: bool = True) -> store.Fired:  # fmt: skip
    """What the supervisor's timer does for `employee` (its deadlines made due first)."""
    async with pool.connection() as conn:
        if due:
            await conn.execute("UPDATE alarms SET due_at = now() - interval '1 second' "
                               "WHERE employee = %s", (employee,))  # fmt: skip
            await conn.commit()
        return await store.fire_due(conn, employee, 1, "UTC")


async def deadline_of(pool: AsyncConnectionPool[Conn], task_id: str) -> dict[str, object]:
    (alarm,) = await query(pool, "SELECT * FROM alarms WHERE ref = %s", f"task:{task_id}")
    return alarm


async def test_a_deadline_turns_into_timed_out_in_the_origin_thread(
    pool: AsyncConnectionPool[Conn],
) -> None:
    a, b = await team(pool, "a", "b")
    outcome, out = await run(pool, call(a, "delegate_to_employee",
                                        {"to": b, "task": "slow", "deadline_s": 30},
                                        hop=3, path=["x"]))  # fmt: skip
    assert outcome == names.TOOL_OK
    task_id = out["task_id"]
    (task,) = await query(pool, "SELECT created_at, deadline_at FROM ipc_tasks")
    assert task["deadline_at"] == task["created_at"] + timedelta(seconds=30)
    # The deadline is an alarm of the delegating generation, in the delegating thread.
    alarm = await deadline_of(pool, task_id)
    assert (alarm["employee"], alarm["generation"], alarm["kind"],
            alarm["status"]) == (a, 1, "deadline", "scheduled")  # fmt: skip
    assert (alarm["lane"], alarm["thread"], alarm["due_at"]) == ("talk", "main",
                                                                task["deadline_at"])  # fmt: skip
    assert (alarm["chain_id"], alarm["hop"], alarm["path"]) == ("chain-1", 4, ["x"])
    assert await fire(pool, a, due=False) == store.Fired()  # not due yet
    fired = await fire(pool, a)
    assert (fired.fired, fired.cancelled) == (1, 0)
    assert await fire(pool, a) == store.Fired()  # once
    assert (await deadline_of(pool, task_id))["status"] == "fired"
    await route(pool)
    (r,) = await deliveries(pool, a)
    assert (r["stream_key"], r["type"]) == (f"{a}/g1/talk/main", names.TYPE_IPC_TIMED_OUT)
    assert r["payload"]["data"]["text"] == (
        f"[task {task_id} for {b} timed out at {task['deadline_at'].isoformat()}; no result came]"
    )
    assert r["route"]["reply"] is True and r["hop"] == 4 and r["class"] == names.C3_INTERNAL
    late = call(b, "complete_task", {"task_id": task_id, "result": "finally"}, **landed(a))
    outcome, refused = await run(pool, late)
    assert outcome == names.TOOL_REFUSED and "already timed_out" in refused["error"]
    (task,) = await query(pool, "SELECT status FROM ipc_tasks")
    assert task["status"] == "timed_out"


async def test_a_result_in_time_cancels_the_deadline(pool: AsyncConnectionPool[Conn]) -> None:
    a, b = await team(pool, "a", "b")
    _, out = await run(pool, call(a, "delegate_to_employee",
                                  {"to": b, "task": "quick", "deadline_s": 30}))  # fmt: skip
    done = call(b, "complete_task", {"task_id": out["task_id"], "result": "ok"}, **landed(a))
    assert (await run(pool, done))[0] == names.TOOL_OK
    assert (await deadline_of(pool, out["task_id"]))["status"] == "cancelled"
    assert await fire(pool, a) == store.Fired()
    await route(pool)
    assert [d["type"] for d in await deliveries(pool, a)] == [names.TYPE_IPC_RESULT]


async def test_a_result_while_the_deadline_fires_is_not_blocked_and_wins(
    pool: AsyncConnectionPool[Conn],
) -> None:
    a, b = await team(pool, "a", "b")
    _, out = await run(pool, call(a, "delegate_to_employee",
                                  {"to": b, "task": "close call", "deadline_s": 30}))  # fmt: skip
    done = call(b, "complete_task", {"task_id": out["task_id"], "result": "just in time"},
                **landed(a))  # fmt: skip
    async with pool.connection() as firing, firing.transaction():  # fire_due holds the alarm
        await firing.execute("SELECT 1 FROM alarms WHERE ref = %s FOR UPDATE",
                             (f"task:{out['task_id']}",))  # fmt: skip
        assert (await asyncio.wait_for(run(pool, done), timeout=10))[0] == names.TOOL_OK
    fired = await fire(pool, a)  # the deadline the result could not cancel finds it done
    assert (fired.fired, fired.cancelled) == (0, 1)
    await route(pool)
    assert [d["type"] for d in await deliveries(pool, a)] == [names.TYPE_IPC_RESULT]


async def test_a_deadline_of_a_task_settled_meanwhile_delivers_nothing(
    pool: AsyncConnectionPool[Conn],
) -> None:
    a, b = await team(pool, "a", "b")
    _, out = await run(pool, call(a, "delegate_to_employee",
                                  {"to": b, "task": "raced", "deadline_s": 30}))  # fmt: skip
    async with pool.connection() as conn:  # settled without its deadline (a race, an old row)
        await conn.execute("UPDATE ipc_tasks SET status = 'cancelled'")
        await conn.commit()
    fired = await fire(pool, a)
    assert (fired.fired, fired.cancelled) == (0, 1)
    assert (await deadline_of(pool, out["task_id"]))["status"] == "cancelled"
    assert await query(pool, "SELECT 1 FROM bus_ingress WHERE source_key = %s", f"ipc:{a}") == []
    (task,) = await query(pool, "SELECT status FROM ipc_tasks")
    assert task["status"] == "cancelled"


async def test_at_most_200_open_tasks_per_delegator(pool: AsyncConnectionPool[Conn]) -> None:
    a, b = await team(pool, "a", "b")
    async with pool.connection() as conn:  # 199 open tasks already
        await conn.execute(
            "INSERT INTO ipc_tasks (id, from_employee, from_generation, to_employee, task, "
            "reply_to, chain_id, hop, created_at, to_thread) SELECT 'old_' || n, %s, 1, %s, "
            "'t', '{}', 'c', 1, now(), 'peer_x' FROM generate_series(1, 199) n",
            (a, b))  # fmt: skip
        await conn.commit()
    ok, _ = await run(pool, call(a, "delegate_to_employee", {"to": b, "task": "200th"}))
    assert ok == names.TOOL_OK
    outcome, out = await run(pool, call(a, "delegate_to_employee", {"to": b, "task": "201st"}))
    assert outcome == names.TOOL_REFUSED and "200 delegated tasks are still open" in out["error"]
    ok, _ = await run(pool, call(b, "delegate_to_employee", {"to": a, "task": "b has room"}))
    assert ok == names.TOOL_OK
    (count,) = await query(pool, "SELECT count(*) AS n FROM ipc_tasks WHERE from_employee = %s", a)
    assert count["n"] == 200


async def test_reset_cancels_the_retired_generations_open_delegations(
    pool: AsyncConnectionPool[Conn],
) -> None:
    a, b = await team(pool, "a", "b")
    ok, _ = await run(
        pool, call(a, "delegate_to_employee", {"to": b, "task": "t", "deadline_s": 60})
    )
    assert ok == names.TOOL_OK
    ok, _ = await run(pool, call(b, "delegate_to_employee", {"to": a, "task": "b's own"}))
    assert ok == names.TOOL_OK
    async with pool.connection() as conn:
        await lifecycle.reset(conn, a)
    rows = await query(pool, "SELECT from_employee, status FROM ipc_tasks ORDER BY from_employee")
    assert [(r["from_employee"], r["status"]) for r in rows] == sorted(
        [(a, "cancelled"), (b, "open")]
    )
    (deadline,) = await query(pool, "SELECT status FROM alarms WHERE employee = %s", a)
    assert deadline["status"] == "cancelled"  # it never fires into the retired generation


def raw_message(sender: str, target: str, n: int, hop: int = 1, path: list[str] | None = None,
                origin: str = "main") -> IngressRecord:  # fmt: skip
    """An ipc message as a tool of the sender's conversation (talk, `origin`) would append it,
    with a hop and path the test chooses."""
    wake = ipc.peer_wake(sender, "talk", origin, target, f"chain-{n}", hop,
                         path if path is not None else [sender])  # fmt: skip
    data = {"text": f"message {n}", "from": sender}
    return ipc.record(wake, names.TYPE_IPC_MESSAGE, f"raw-{sender}-{n}", data)


async def test_past_500_pending_inputs_the_sender_is_refused(
    pool: AsyncConnectionPool[Conn],
) -> None:
    a, b = await team(pool, "a", "b")
    async with pool.connection() as conn:
        # From 25 senders, 20 each: within every edge's burst, so the router delivers them all.
        await append(conn, [raw_message(f"s{n % 25}", b, n) for n in range(499)])
    ok, _ = await run(pool, call(a, "send_to_employee", {"to": b, "text": "500th"}))
    assert ok == names.TOOL_OK
    outcome, out = await run(pool, call(a, "send_to_employee", {"to": b, "text": "501st"}))
    assert outcome == names.TOOL_REFUSED and "500 messages and tasks waiting" in out["error"]
    # Delivered (not yet consumed) inputs still count.
    await route(pool, now=datetime.now(UTC))
    assert len(await deliveries(pool, b)) == 500
    outcome, _ = await run(pool, call(a, "send_to_employee", {"to": b, "text": "still full"}))
    assert outcome == names.TOOL_REFUSED


async def test_a_peer_thread_never_takes_a_reply_route(pool: AsyncConnectionPool[Conn]) -> None:
    a, b = await team(pool, "a", "b")
    wake = ipc.peer_wake(a, "talk", "main", b, "chain-r", 1, [a])
    claims = ipc.Wake(wake.target, wake.lane, wake.thread, {"kind": "chat", "reply": True,
                      "session": "owner"}, "chain-r", 1, [a], a)  # fmt: skip
    async with pool.connection() as conn:
        await append(conn, [ipc.record(claims, names.TYPE_IPC_MESSAGE, "claims-a-reply", {})])
    await route(pool)
    (d,) = await deliveries(pool, b)
    assert d["thread"] == landed(a)["thread"] and d["route"]["reply"] is False


async def test_a_task_cut_as_a_loop_is_cancelled_with_the_reason(
    pool: AsyncConnectionPool[Conn],
) -> None:
    a, b = await team(pool, "a", "b")
    in_b = {**landed(a), "hop": 1, "path": [a]}
    outcome, out = await run(pool, call(b, "delegate_to_employee",
                                        {"to": a, "task": "back", "deadline_s": 60},
                                        **in_b))  # fmt: skip
    assert outcome == names.TOOL_OK
    await route(pool)
    (task,) = await query(pool, "SELECT status, result FROM ipc_tasks WHERE id = %s",
                          out["task_id"])  # fmt: skip
    assert (task["status"], task["result"]) == (
        "cancelled",
        f"loop_suppressed: cycle {a} -> {b} -> {a}",
    )
    assert await deliveries(pool, a) == []
    assert (await deadline_of(pool, out["task_id"]))["status"] == "cancelled"  # with its task
