"""Users on the real stack (SPEC §17, issue 25): the owner's controls are the admin's to lift,
and a user is the owner's guest (its class, its daily cap, its pending bound, its own
conversation even under a re-created name)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from conftest import apply_and_start
from event_streams import listen, now_at
from psycopg_pool import AsyncConnectionPool
from test_owner_api_edges import problem_of
from test_router import query
from test_turns import Instance, instance, local_spec, read_events  # noqa: F401 (a fixture)
from test_users import add_user, admin, as_user, user_thread  # noqa: F401 (a fixture)

from eventos import names
from eventos.contracts import DeadLetter
from eventos.conversations import turns
from eventos.db import Conn
from eventos.testing import mentions, wait_for

Client = httpx.AsyncClient

GUARDED = """  content_rules:
    - {id: no-refunds, kind: keyword, words: [refund], applies_to: [chat]}
    - {id: ask-the-user, kind: keyword, words: [banana], applies_to: [chat], decided_by: user}
  approvals: {tools: [set_alarm]}
"""


def guarded(name: str) -> str:
    """Owner chat with the owner's controls: a rule the admin decides, one handed to users,
    and `set_alarm` gated by `approvals.tools`."""
    spec = local_spec(name, "    - {kind: chat}\n") + GUARDED
    return spec.replace("name: scripted}}]", "name: scripted}, tools: [set_alarm]}]")


async def employee(base: Instance, spec: Any) -> Instance:
    """Another employee on the instance's workers, applied and running."""
    name = f"g{uuid.uuid4().hex[:8]}"
    await apply_and_start(base.pool, spec(name))
    return dataclasses.replace(base, name=name)


async def say(api: Client, emp: str, text: str, session: str | None = None) -> int:
    body: dict[str, Any] = {"client_message_id": uuid.uuid4().hex, "text": text}
    if session is not None:
        body["session"] = session
    r = await api.post(f"/v1/employees/{emp}/chat", json=body)
    assert r.status_code == 202, r.text
    return int(r.json()["message_id"])


async def message(api: Client, emp: str, message_id: int) -> dict[str, Any]:
    r = await api.get(f"/v1/employees/{emp}/chat/{message_id}")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def pending_approval(api: Client, words: str) -> dict[str, Any]:
    """The admin's view of the pending approval whose draft holds `words`."""

    async def found() -> dict[str, Any] | None:
        r = await api.get("/v1/approvals", params={"state": "pending"})
        rows = [a for a in r.json()["approvals"] if words in (a["draft"] or "")]
        return rows[0] if rows else None

    return await wait_for(found, timeout=60, interval=0.1, what=f"the approval of {words!r}")


async def approval_state(pool: AsyncConnectionPool[Conn], ident: str) -> str:
    (row,) = await query(pool, "SELECT state FROM approvals WHERE id = %s", ident)
    return str(row["state"])


async def replied(api: Client, emp: str, message_id: int) -> str:
    async def answered() -> str | None:
        return (await message(api, emp, message_id))["reply"]  # type: ignore[no-any-return]

    return await wait_for(answered, timeout=60, interval=0.1, what=f"reply to {message_id}")


@pytest.fixture
async def guests(
    instance: Instance,  # noqa: F811
    ingress_url: str,
) -> AsyncIterator[tuple[Instance, Client, Client]]:
    """An employee with the owner's controls, and two users, alice and bob."""
    emp = await employee(instance, guarded)
    async with (
        as_user(ingress_url, await add_user(instance.api, "alice")) as alice,
        as_user(ingress_url, await add_user(instance.api, "bob")) as bob,
    ):
        yield emp, alice, bob


async def test_a_user_cannot_release_what_the_owners_rule_held_in_its_own_chat(
    guests: tuple[Instance, Client, Client],
) -> None:
    emp, alice, _ = guests
    stream = await listen(alice, last=await now_at(emp.api))
    asked = await say(alice, emp.name, "I want a refund now")
    ap = await pending_approval(emp.api, "I want a refund now")
    assert ap["kind"] == "send"
    # Alice is told her reply is held for review; she never sees the draft nor the approval.
    held = await message(alice, emp.name, asked)
    assert (held["reply"], held["reply_status"]) == (None, names.REPLY_HELD)
    assert (await alice.get("/v1/approvals")).json()["approvals"] == []
    problem_of(await alice.get(f"/v1/approvals/{ap['id']}"), 404, "not-found")
    problem_of(await alice.post(f"/v1/approvals/{ap['id']}:approve"), 404, "not-found")
    problem_of(await alice.post(f"/v1/approvals/{ap['id']}:decline"), 404, "not-found")
    events = await read_events(emp, until=names.RUN_NOTICE, api=alice)
    assert events[-1][1]["text"] == names.HELD_FOR_REVIEW
    assert "you said" not in json.dumps(events)  # the draft is not on her stream
    (out,) = await query(emp.pool, "SELECT status FROM outbound_messages WHERE approval_id = %s",
                         ap["id"])  # fmt: skip
    assert (out["status"], await approval_state(emp.pool, ap["id"])) == ("held", "pending")
    assert (await message(alice, emp.name, asked))["reply"] is None
    # Her operator stream tells her reply is held, not which of the owner's rules held it.
    held_events = await stream.until("her reply held", lambda es: [
        e for e in es if e[1] == "outbox.held"])  # fmt: skip
    await stream.close()
    assert "no-refunds" not in json.dumps(held_events)
    assert not [e for e in held_events if e[1].startswith("approval.")]

    # The admin lifts it.
    r = await emp.api.post(f"/v1/approvals/{ap['id']}:approve")
    assert r.status_code == 202, r.text
    assert "refund" in await replied(alice, emp.name, asked)


async def test_a_user_cannot_approve_its_own_gated_tool_call(
    guests: tuple[Instance, Client, Client],
) -> None:
    emp, alice, _ = guests
    args = json.dumps({"text": "call the bank", "in_s": 3600})
    asked = await say(alice, emp.name, f"remind me\ncall: set_alarm {args}")
    ap = await pending_approval(emp.api, "call the bank")
    assert ap["kind"] == "tool"
    assert (await alice.get("/v1/approvals")).json()["approvals"] == []
    problem_of(await alice.post(f"/v1/approvals/{ap['id']}:approve"), 404, "not-found")

    async def alarms() -> list[dict[str, Any]]:
        return await query(emp.pool, "SELECT text FROM alarms WHERE employee = %s", emp.name)

    assert await alarms() == [] and await approval_state(emp.pool, ap["id"]) == "pending"
    assert (await message(alice, emp.name, asked))["reply"] is None  # the turn still waits
    r = await emp.api.post(f"/v1/approvals/{ap['id']}:approve")
    assert r.status_code == 202, r.text
    await replied(alice, emp.name, asked)
    assert [a["text"] for a in await alarms()] == ["call the bank"]


async def test_a_rule_that_says_decided_by_user_is_that_users_to_decide(
    guests: tuple[Instance, Client, Client],
) -> None:
    emp, alice, bob = guests
    asked = await say(alice, emp.name, "a banana please")
    ap = await pending_approval(emp.api, "a banana please")
    mine = (await alice.get("/v1/approvals", params={"state": "pending"})).json()["approvals"]
    assert [a["id"] for a in mine] == [ap["id"]]
    assert (await bob.get("/v1/approvals")).json()["approvals"] == []
    problem_of(await bob.post(f"/v1/approvals/{ap['id']}:approve"), 404, "not-found")
    assert await approval_state(emp.pool, ap["id"]) == "pending"
    r = await alice.post(f"/v1/approvals/{ap['id']}:approve")
    assert r.status_code == 202, r.text
    assert "banana" in await replied(alice, emp.name, asked)

    # A message both rules hold is the admin's: the user cannot release it.
    both = await say(alice, emp.name, "a banana refund")
    ap = await pending_approval(emp.api, "a banana refund")
    problem_of(await alice.post(f"/v1/approvals/{ap['id']}:approve"), 404, "not-found")
    r = await emp.api.post(f"/v1/approvals/{ap['id']}:decline")
    assert r.status_code == 202, r.text

    async def failed() -> bool:
        q = "SELECT status FROM outbound_messages WHERE approval_id = %s"
        return (await query(emp.pool, q, ap["id"])) == [{"status": "failed"}]

    await wait_for(failed, timeout=30, what="the declined reply settled")
    assert (await message(alice, emp.name, both))["reply"] is None


async def lease_while_running(pool: AsyncConnectionPool[Conn], thread: str) -> dict[str, Any]:
    """The lease of the turn running on `thread` (the turn sleeps in its step)."""

    async def leased() -> dict[str, Any] | None:
        q = ("SELECT l.class, l.reserved FROM sched_leases l JOIN turns t ON t.id = l.turn_id "
             "WHERE t.thread = %s")  # fmt: skip
        rows = await query(pool, q, thread)
        return rows[0] if rows else None

    return await wait_for(leased, timeout=30, interval=0.05, what=f"a lease of {thread}")


async def test_a_users_chat_runs_at_c2_unless_granted_c1_and_never_in_the_owner_slot(
    instance: Instance,  # noqa: F811
    ingress_url: str,
) -> None:
    problem_of(await instance.api.post("/v1/users", json={"name": "x", "class": "c0"}), 400,
               "invalid-request")  # fmt: skip
    r = await instance.api.post("/v1/users", json={"name": "eli"})
    assert (r.json()["class"], r.json()["daily_usd"]) == ("c2", None)
    eli_token = r.json()["token"]
    r = await instance.api.post("/v1/users", json={"name": "dana", "class": "c1"})
    assert r.status_code == 201 and r.json()["class"] == "c1"
    dana_token = r.json()["token"]
    listed = {u["name"]: u["class"] for u in (await instance.api.get("/v1/users")).json()["users"]}
    assert listed == {"dana": "c1", "eli": "c2"}
    async with as_user(ingress_url, eli_token) as eli, as_user(ingress_url, dana_token) as dana:
        for api, user, klass in [(eli, "eli", 2), (dana, "dana", 1)]:
            asked = await say(api, instance.name, "slow please\nsleep: 1")
            lease = await lease_while_running(instance.pool, await user_thread(instance.pool, user))
            assert lease == {"class": klass, "reserved": False}  # never the owner's slot
            assert "slow please" in await replied(api, instance.name, asked)
    # The admin's own chat still runs at C1 in its reserved slot.
    asked = await instance.chat("owner here\nsleep: 1")
    assert await lease_while_running(instance.pool, names.THREAD_MAIN) == {
        "class": 1, "reserved": True
    }  # fmt: skip
    await instance.reply(asked)
    classes = await query(instance.pool, "SELECT thread, class FROM turns ORDER BY started_at")
    dana_thread = await user_thread(instance.pool, "dana")
    assert [c["class"] for c in classes] == [2, 1, 1]
    assert classes[1]["thread"] == dana_thread


def budgeted(name: str) -> str:
    return local_spec(name, "    - {kind: chat}\n  budget: {daily_usd: 1}\n")


async def test_a_user_past_its_daily_cap_gets_429_while_the_owner_is_answered(
    instance: Instance,  # noqa: F811
    ingress_url: str,
) -> None:
    emp = await employee(instance, budgeted)
    problem_of(await emp.api.post("/v1/users", json={"name": "x", "daily_usd": -1}), 400,
               "invalid-request")  # fmt: skip
    r = await emp.api.post("/v1/users", json={"name": "fay", "daily_usd": 0.5})
    assert r.json()["daily_usd"] == 0.5
    fay_token = r.json()["token"]
    async with (
        as_user(ingress_url, await add_user(emp.api, "erin")) as erin,
        as_user(ingress_url, fay_token) as fay,
    ):
        first = await say(erin, emp.name, "hello")
        await replied(erin, emp.name, first)
        # Erin's turn turned out dear: 0.30 USD, past her default cap (a quarter of 1 USD).
        thread = await user_thread(emp.pool, "erin")
        async with emp.pool.connection() as conn:
            await conn.execute(
                "UPDATE spend_events e SET actual_usd = 0.30 FROM turns t "
                "WHERE t.id = e.turn_id AND t.thread = %s",
                (thread,),
            )
            await conn.execute("UPDATE employee_spend SET spent_usd = %s WHERE employee = %s",
                               (Decimal("0.30"), emp.name))  # fmt: skip
        r = await erin.post(f"/v1/employees/{emp.name}/chat",
                            json={"client_message_id": "over", "text": "more"})  # fmt: skip
        doc = problem_of(r, 429, "queue-full")
        assert "spend_cap" in str(doc["detail"])
        assert 0 < int(r.headers["Retry-After"]) <= 25 * 3600
        # Fay's own cap (0.50 USD) is not reached; the owner chats and is answered.
        await replied(fay, emp.name, await say(fay, emp.name, "fay here"))
        assert "owner here" in await emp.reply(await emp.chat("owner here"))
        (gen,) = await query(emp.pool, "SELECT state FROM generations WHERE employee = %s",
                             emp.name)  # fmt: skip
        assert gen["state"] == names.GEN_RUNNING
        q = "SELECT 1 FROM chat_messages WHERE client_message_id = 'over'"
        assert await query(emp.pool, q) == []

        # A user's step that would pass the employee's budget waits; it never pauses the
        # employee (the owner's step would: that is the owner's to spend).
        async with emp.pool.connection() as conn:
            await conn.execute("UPDATE employee_spend SET spent_usd = %s WHERE employee = %s",
                               (Decimal("0.995"), emp.name))  # fmt: skip
        await say(fay, emp.name, "one more from fay")
        fay_thread = await user_thread(emp.pool, "fay")

        async def suspended() -> bool:
            q = ("SELECT l.state FROM sched_leases l JOIN turns t ON t.id = l.turn_id "
                 "WHERE t.thread = %s")  # fmt: skip
            return await query(emp.pool, q, fay_thread) == [{"state": "suspended"}]

        await wait_for(suspended, timeout=30, what="fay's turn waiting for the budget")
    (gen,) = await query(emp.pool, "SELECT state FROM generations WHERE employee = %s", emp.name)
    assert gen["state"] == names.GEN_RUNNING
    q = "SELECT state FROM employee_budgets WHERE employee = %s"
    assert (await query(emp.pool, q, emp.name))[0]["state"] != names.BUDGET_MAX
    q = "SELECT 1 FROM intents WHERE employee = %s AND kind = 'stop'"
    assert await query(emp.pool, q, emp.name) == []


async def test_the_pending_bound_counts_every_session_of_a_user(
    started: str,
    admin: Client,  # noqa: F811
    ingress_url: str,
) -> None:
    async with (
        as_user(ingress_url, await add_user(admin, "gil")) as gil,
        as_user(ingress_url, await add_user(admin, "hal")) as hal,
    ):
        # Nothing consumes them here: 100 pending over ten sessions reach gil's bound.
        for i in range(names.OWNER_CHAT_PENDING_MAX):
            await say(gil, started, f"m{i}", session=f"s{i % 10}")
        r = await gil.post(f"/v1/employees/{started}/chat",
                           json={"client_message_id": "one-more", "text": "x",
                                 "session": "fresh"})  # fmt: skip
        assert "queue_full" in str(problem_of(r, 429, "queue-full")["detail"])
        assert int(r.headers["Retry-After"]) > 0
        # Another user and the admin are untouched.
        await say(hal, started, "hal here")
        await say(admin, started, "admin here")


async def test_a_recreated_name_starts_a_new_conversation(
    instance: Instance,  # noqa: F811
    ingress_url: str,
) -> None:
    emp = instance
    async with as_user(ingress_url, await add_user(emp.api, "ivy")) as old:
        r = await old.post(f"/v1/employees/{emp.name}/chat",
                           json={"client_message_id": "c-1", "text": "my locker code is 4711"})  # fmt: skip
        said = int(r.json()["message_id"])
        assert "4711" in await replied(old, emp.name, said)
    old_thread = await user_thread(emp.pool, "ivy")
    # An attention item about the old holder's chat (its turn failed twice).
    stream = names.stream_key(emp.name, 1, names.LANE_TALK, old_thread)
    async with emp.pool.connection() as conn:
        await turns.dead_letter(conn, DeadLetter(emp.name, stream, "turn-x", [1], [0], "boom"))
    (item,) = await query(emp.pool, "SELECT id, audience FROM attention_items")
    assert item["audience"] == "ivy"
    assert (await emp.api.delete("/v1/users/ivy")).status_code == 204
    async with as_user(ingress_url, await add_user(emp.api, "ivy")) as new:
        new_thread = await user_thread(emp.pool, "ivy")
        assert new_thread != old_thread
        problem_of(await new.get(f"/v1/employees/{emp.name}/chat/{said}"), 404, "not-found")
        history = (await new.get(f"/v1/employees/{emp.name}/chat")).json()["messages"]
        assert history == []
        assert (await new.get("/v1/attention")).json()["attention"] == []
        problem_of(await new.get(f"/v1/attention/{item['id']}"), 404, "not-found")
        # The same client id is the new holder's own message, not the old holder's.
        r = await new.post(f"/v1/employees/{emp.name}/chat",
                           json={"client_message_id": "c-1", "text": "what did I tell you?"})  # fmt: skip
        assert r.status_code == 202, r.text
        assert r.json()["duplicate"] is False and r.json()["message_id"] != said
        asked = int(r.json()["message_id"])
        await replied(new, emp.name, asked)
        events = await read_events(emp, until=names.RUN_REPLY, api=new)
        assert not mentions("4711", events)
        assert [doc.get("message_ids") for _, doc in events[:1]] == [[asked]]
    rows = await query(emp.pool, "SELECT thread, message FROM transcript_messages "
                       "WHERE employee = %s", emp.name)  # fmt: skip
    mine = [json.dumps(r["message"]) for r in rows if r["thread"] == new_thread]
    assert mine and not [m for m in mine if "4711" in m]
