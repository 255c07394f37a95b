"""Every state an owner message can be in, read three ways that must agree (issue 26 point 3):
`GET /v1/employees/{name}/waiting` (what the console's "Why waiting" shows as is), the
message's own answer `GET …/chat/{id}`, and `eventosctl chat --wait` (its words and its exit
code), on the real stack (router, relay, dev server, workers): answered; its reply held for
approval by a content rule, and the messages queued behind it; a tool call held by
`approvals.tools`; its reply declined, or expired undecided; stopped (paused); failed twice
(dead-lettered); dead(reset); in a running turn; its turn suspended by the budget; a user's
held reply (the user reads no more than that it is held)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from typing import Any

import pytest
from conftest import ADMIN_TOKEN, apply_and_start
from test_router import query
from test_turns import Instance, instance, local_spec  # noqa: F401 (`instance` is a fixture)

from eventos import names
from eventos.cli import main
from eventos.outbox import approvals
from eventos.scheduling import ledger
from eventos.testing import wait_for

pytestmark = pytest.mark.temporal

EXIT_OK, EXIT_FAILED, EXIT_HELD = 0, 1, 7
GUARDS = """  content_rules:
    - {id: no-refunds, kind: keyword, words: [refund], applies_to: [chat]}
  approvals: {tools: [set_alarm]}
"""
ALARM = json.dumps({"text": "call the bank", "in_s": 3600})
FAILS = "\nfail: 400"  # the local provider refuses the step: the turn fails


def guarded(name: str) -> str:
    """Owner chat whose replies a content rule holds (`refund`), and `set_alarm` gated by
    `approvals.tools`."""
    spec = local_spec(name, "    - {kind: chat}\n") + GUARDS
    return spec.replace("name: scripted}}]", "name: scripted}, tools: [set_alarm]}]")


@pytest.fixture
async def emp(instance: Instance) -> Instance:  # noqa: F811
    """A guarded employee on the instance's workers, applied and running."""
    name = f"m{uuid.uuid4().hex[:8]}"
    await apply_and_start(instance.pool, guarded(name))
    return dataclasses.replace(instance, name=name)


@dataclasses.dataclass
class Ctl:
    """`eventosctl` against the instance, its output captured."""

    emp: Instance
    capsys: pytest.CaptureFixture[str]

    async def __call__(self, *argv: str) -> tuple[int, str, str]:
        where = ["--url", str(self.emp.api.base_url), "--token", ADMIN_TOKEN]
        self.capsys.readouterr()
        code = await asyncio.to_thread(main, [*argv, *where])
        got = self.capsys.readouterr()
        return code, got.out, got.err

    async def chat(self, text: str, timeout: float = 60, ident: str | None = None
                   ) -> tuple[int, str, str]:  # fmt: skip
        ident = ident or uuid.uuid4().hex
        return await self("chat", self.emp.name, text, "--wait", "--timeout", str(timeout),
                          "--id", ident)  # fmt: skip


@pytest.fixture
def ctl(emp: Instance, capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(emp, capsys)


def message_id(out: str) -> int:
    """The id `chat` prints first (`message N queued`)."""
    return int(out.split()[1])


async def message(emp: Instance, ident: int) -> dict[str, Any]:
    r = await emp.api.get(f"/v1/employees/{emp.name}/chat/{ident}")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def history(emp: Instance, ident: int) -> str | None:
    """The message's `reply_status` in the chat's history (the console's chat page reads it)."""
    r = await emp.api.get(f"/v1/employees/{emp.name}/chat", params={"limit": 50})
    assert r.status_code == 200, r.text
    (row,) = [m for m in r.json()["messages"] if m["message_id"] == ident]
    return row["reply_status"]  # type: ignore[no-any-return]


async def waiting(emp: Instance) -> list[dict[str, Any]]:
    r = await emp.api.get(f"/v1/employees/{emp.name}/waiting", params={"limit": 200})
    assert r.status_code == 200, r.text
    return r.json()["waiting"]  # type: ignore[no-any-return]


async def agreed(emp: Instance, ident: int, code: str) -> dict[str, Any]:
    """Once the message's gate is `code`: the gate, the same in `waiting` (its one entry) and
    in the message's answer."""

    async def both() -> dict[str, Any] | None:
        listed = [w["gate"] for w in await waiting(emp)]
        own = (await message(emp, ident)).get("gate")
        if own is None or own["code"] != code or listed != [own]:
            return None
        return own  # type: ignore[no-any-return]

    return await wait_for(both, timeout=60, interval=0.2, what=f"message {ident} at {code}")


async def pending_approval(emp: Instance) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        r = await emp.api.get("/v1/approvals", params={"state": "pending"})
        rows = [a for a in r.json()["approvals"] if a["employee"] == emp.name]
        return rows[0] if rows else None

    return await wait_for(found, timeout=60, interval=0.1, what="the pending approval")


async def lifecycle(emp: Instance, action: str) -> None:
    r = await emp.api.post(f"/v1/employees/{emp.name}:{action}", json={})
    assert r.status_code == 202, r.text
    intent = r.json()["intent"]

    async def applied() -> bool:
        got = await emp.api.get(f"/v1/intents/{intent['id']}")
        return bool(got.json()["state"] == "applied")

    await wait_for(applied, timeout=60, what=f"{action} applied")


async def test_a_held_reply_and_the_messages_behind_it_wait_for_its_approval(ctl: Ctl) -> None:
    emp = ctl.emp
    code, out, err = await ctl.chat("I want a refund")
    assert code == EXIT_HELD, (out, err)
    first = message_id(out)
    ap = await pending_approval(emp)
    held = await message(emp, first)
    assert (held["status"], held["reply"], held["reply_status"]) == (
        "answered", None, names.REPLY_HELD)  # fmt: skip
    gate = held["gate"]
    assert (gate["code"], gate["approval"]) == ("approval", ap["id"])
    assert gate["until"] == ap["expires_at"] and "content rule no-refunds" in gate["text"]
    said = out.splitlines()[-1]
    assert said == f"message {first} held for approval: {gate['text']}"
    assert "answered" not in said
    assert await history(emp, first) == names.REPLY_HELD  # the console's chat reads it too

    # The next message waits for that approval, and every surface says so.
    code, out, err = await ctl.chat("and hello again")
    assert code == EXIT_HELD, (out, err)
    second = message_id(out)
    gate = await agreed(emp, second, "approval")
    assert gate["approval"] == ap["id"] and gate["until"] == ap["expires_at"]
    assert "next turn starts once it is decided" in gate["text"], gate
    assert out.splitlines()[-1] == f"message {second} held for approval: {gate['text']}"
    (entry,) = await waiting(emp)
    assert entry["status"] == "delivered" and "conversation's hands" not in entry["gate"]["text"]

    r = await emp.api.post(f"/v1/approvals/{ap['id']}:approve")
    assert r.status_code == 202, r.text
    await emp.reply(second, timeout=60)
    code, out, err = await ctl.chat("and a last word")  # answered: the reply, exit 0
    assert code == EXIT_OK, (out, err)
    assert "a last word" in out.splitlines()[-1]
    assert await waiting(emp) == []
    first_now = await message(emp, first)
    assert first_now["reply"] is not None and "gate" not in first_now
    assert await history(emp, first) is None


async def test_a_tool_call_held_for_approval_holds_the_message_in_its_turn(ctl: Ctl) -> None:
    emp = ctl.emp
    code, out, err = await ctl.chat(f"remind me\ncall: set_alarm {ALARM}")
    assert code == EXIT_HELD, (out, err)
    ident = message_id(out)
    ap = await pending_approval(emp)
    gate = await agreed(emp, ident, "approval")
    assert gate["approval"] == ap["id"] and gate["until"] == ap["expires_at"]
    assert "its turn's tool call (spec.approvals.tools (set_alarm))" in gate["text"], gate
    assert "call the bank" not in json.dumps(gate)  # never the call's arguments
    assert (await message(emp, ident))["status"] == "delivered"
    assert out.splitlines()[-1] == f"message {ident} held for approval: {gate['text']}"

    r = await emp.api.post(f"/v1/approvals/{ap['id']}:decline")
    assert r.status_code == 202, r.text
    await emp.reply(ident, timeout=60)  # the turn goes on without the call, and answers
    assert await waiting(emp) == []


async def test_a_declined_reply_and_an_expired_one_are_never_answered(ctl: Ctl) -> None:
    emp = ctl.emp
    for verdict, words in [("decline", "was declined"), ("expire", "expired undecided")]:
        ident = uuid.uuid4().hex
        code, out, err = await ctl.chat(f"a refund, {verdict} it", ident=ident)
        assert code == EXIT_HELD, (out, err)
        ap = await pending_approval(emp)
        if verdict == "decline":
            r = await emp.api.post(f"/v1/approvals/{ap['id']}:decline")
            assert r.status_code == 202, r.text
        else:  # the deadline the workflow reads, moved to now
            async with emp.pool.connection() as conn:
                await conn.execute("UPDATE approvals SET expires_at = now() WHERE id = %s",
                                   (ap["id"],))  # fmt: skip
            # One nudge: a workflow it does not find has either not started yet (it reads the
            # row as it starts) or already read the new deadline and closed. (Nudging until one
            # was taken failed on a busy machine when the workflow started and expired between
            # two tries: then no nudge could ever be taken.)
            await approvals.nudge(emp.client, ap["id"])
        state = {"decline": names.REPLY_DECLINED, "expire": names.REPLY_EXPIRED}[verdict]

        async def settled(m: int = message_id(out), s: str = state) -> dict[str, Any] | None:
            got = await message(emp, m)
            return got if got.get("reply_status") == s else None

        got = await wait_for(settled, timeout=60, what=f"the reply {state}")
        assert (got["status"], got["reply"], got.get("gate")) == ("answered", None, None)
        assert await history(emp, got["message_id"]) == state
        code, out, err = await ctl.chat("resent", ident=ident)  # the same message, again
        assert code == EXIT_FAILED, (out, err)
        assert f"message {got['message_id']} was answered, but its reply {words}" in err
        assert "held for approval" not in out


async def test_a_stopped_employee_holds_its_messages_paused(ctl: Ctl) -> None:
    emp = ctl.emp
    await lifecycle(emp, "stop")
    ident = uuid.uuid4().hex
    code, out, err = await ctl.chat("are you there", timeout=0, ident=ident)
    assert code == EXIT_FAILED and "no reply within 0s" in err, (out, err)
    gate = await agreed(emp, message_id(out), "paused")
    code, out, err = await ctl.chat("are you there", timeout=0.5, ident=ident)
    assert code == EXIT_FAILED, (out, err)
    assert err.strip() == (f"error: no reply within 0.5s: message {message_id(out)} is queued; "
                           f"it waits at paused: {gate['text']}")  # fmt: skip


async def test_a_message_a_reset_retired_is_dead_reset(ctl: Ctl) -> None:
    emp = ctl.emp
    await lifecycle(emp, "stop")
    ident = uuid.uuid4().hex
    code, out, _ = await ctl.chat("lost in the reset", timeout=0, ident=ident)
    await agreed(emp, message_id(out), "paused")
    await lifecycle(emp, "reset")
    await lifecycle(emp, "start")  # a chat (resent with its id, too) needs a started one
    code, out, err = await ctl.chat("lost in the reset", timeout=30, ident=ident)
    assert code == EXIT_FAILED and out, (out, err)
    assert f"message {message_id(out)} is dead (reset): no turn will answer it" in err, err
    got = await message(emp, message_id(out))
    assert (got["status"], got["reason"], got.get("gate")) == ("dead", "reset", None)


async def test_a_message_whose_turn_fails_twice_is_dead_with_the_reason(ctl: Ctl) -> None:
    code, out, err = await ctl.chat("this breaks" + FAILS, timeout=120)
    assert code == EXIT_FAILED, (out, err)
    got = await message(ctl.emp, message_id(out))
    assert got["status"] == "dead" and got["reason"], got
    assert f"message {got['message_id']} is dead ({got['reason']})" in err
    rows = await query(ctl.emp.pool, "SELECT d.status FROM bus_deliveries d JOIN chat_messages m "
                       "ON m.ingress_id = d.ingress_id WHERE m.id = %s", got["message_id"])  # fmt: skip
    assert [r["status"] for r in rows] == ["dead"]


async def test_a_message_in_a_running_turn_names_it_at_the_deadline(ctl: Ctl) -> None:
    ident = uuid.uuid4().hex
    code, out, err = await ctl.chat("take your time\nsleep: 15", timeout=0, ident=ident)
    assert code == EXIT_FAILED, (out, err)
    gate = await agreed(ctl.emp, message_id(out), "in_turn")
    code, out, err = await ctl.chat("take your time", timeout=0.2, ident=ident)
    assert code == EXIT_FAILED, (out, err)
    assert f"message {message_id(out)} is delivered; it waits at in_turn: " in err
    assert gate["text"].split(":")[0] in err  # `turn N runs since …`, as waiting says
    await ctl.emp.reply(message_id(out), timeout=60)


async def test_a_user_learns_only_that_its_reply_is_held_for_review(ctl: Ctl) -> None:
    emp = ctl.emp
    r = await emp.api.post("/v1/users", json={"name": f"u{uuid.uuid4().hex[:8]}"})
    assert r.status_code == 201, r.text
    where = ["--url", str(emp.api.base_url), "--token", r.json()["token"]]
    ctl.capsys.readouterr()
    argv = ["chat", emp.name, "a refund for me", "--wait", "--timeout", "60", *where]
    code = await asyncio.to_thread(main, argv)
    out = ctl.capsys.readouterr().out
    assert code == EXIT_HELD, out
    ident = message_id(out)
    assert (
        out.splitlines()[-1] == f"message {ident} held for approval: its reply is held for review"
    )
    ap = await pending_approval(emp)
    mine = await emp.api.get(f"/v1/employees/{emp.name}/chat/{ident}",
                             headers={"Authorization": f"Bearer {r.json()['token']}"})  # fmt: skip
    assert mine.json() == {"message_id": ident, "status": "answered", "reply": None,
                           "reply_status": names.REPLY_HELD}  # fmt: skip
    assert ap["id"] not in out and "no-refunds" not in out
    # Its next message waits behind that reply: the user is told so, and no more.
    ctl.capsys.readouterr()
    argv = ["chat", emp.name, "anyone there?", "--wait", "--timeout", "60", *where]
    code = await asyncio.to_thread(main, argv)
    out = ctl.capsys.readouterr().out
    assert code == EXIT_HELD, out
    assert out.splitlines()[-1] == (f"message {message_id(out)} held for approval: it waits "
                                    "behind a reply of this conversation held for review")  # fmt: skip


async def test_a_message_whose_turn_the_budget_suspends_names_the_budget(
    instance: Instance,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = f"b{uuid.uuid4().hex[:8]}"
    spec = local_spec(name, "    - {kind: chat}\n") + "  budget: {daily_usd: 1}\n"
    await apply_and_start(instance.pool, spec)
    emp = dataclasses.replace(instance, name=name)
    async with emp.pool.connection() as conn:
        await ledger.refresh(conn, name)  # the budget's row and the period's spend row
        await conn.execute("UPDATE employee_spend SET spent_usd = 0.995 WHERE employee = %s",
                           (name,))  # fmt: skip
    ctl, ident = Ctl(emp, capsys), uuid.uuid4().hex
    code, out, err = await ctl.chat("one step too many", timeout=0, ident=ident)
    assert code == EXIT_FAILED, (out, err)
    gate = await agreed(emp, message_id(out), "budget_hold")  # the step refused: it suspends
    turn = gate["text"].split(":")[0]
    assert turn.endswith("waits for the budget") and "1.00 of 1.00 USD" in gate["text"], gate
    code, out, err = await ctl.chat("one step too many", timeout=0.2, ident=ident)
    assert code == EXIT_FAILED, (out, err)
    # (the budget's state in the words may move from `high` to `max` meanwhile)
    assert err.startswith(f"error: no reply within 0.2s: message {message_id(out)} is "
                          f"delivered; it waits at budget_hold: {turn}: budget "), err  # fmt: skip
