"""What a webhook turn, a start-trigger turn and an owner chat turn leave on the timeline, on
the real stack (router, relay, dev server, workers, egress), read through the API and through
`eventosctl timeline`: accepted → routed → delivered → turn with steps and cost → the reply,
in words, and never a word of the messages themselves."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from typing import Any

import pytest
from conftest import ADMIN_TOKEN
from test_router import query
from test_supervision import applied, new_employee
from test_turns import Instance, instance, local_spec  # noqa: F401 (`instance` is a fixture)

from eventos.cli import main, watch
from eventos.testing import wait_for

pytestmark = pytest.mark.temporal

SECRETS = ("CUSTOMER-SECRET-7731", "good morning sunshine", "hello timeline 4242")
TURN_DONE = re.compile(r"^turn \d+ done: \d+ steps?, [\d,]+ tokens, \$\d+\.\d{4}$")


def hooked(name: str) -> str:
    """Owner chat, a start trigger and a generic webhook."""
    return local_spec(
        name,
        f"""    - {{kind: chat}}
    - {{kind: start, text: {SECRETS[1]}}}
    - {{kind: webhook, path: pay-{name}, verify: {{scheme: none}}, dedupe_header: X-Event-Id}}
""",
    )


async def chain_of(instance: Instance, source: str) -> str:
    async def found() -> str | None:
        rows = await query(instance.pool, "SELECT chain_id FROM bus_ingress WHERE source_key = %s",
                           source)  # fmt: skip
        return str(rows[0]["chain_id"]) if rows else None

    return await wait_for(found, timeout=30, what=f"an input of {source}")


async def story(instance: Instance, name: str, chain: str, last: str) -> list[dict[str, Any]]:
    """The chain's entries, oldest first, once its `last` kind is there."""

    async def told() -> list[dict[str, Any]] | None:
        r = await instance.api.get(f"/v1/employees/{name}/timeline",
                                   params={"chain": chain, "order": "oldest"})  # fmt: skip
        assert r.status_code == 200, r.text
        entries: list[dict[str, Any]] = r.json()["timeline"]
        return entries if any(e["kind"] == last for e in entries) else None

    return await wait_for(told, timeout=90, interval=0.2, what=f"{last} of chain {chain}")


def assert_turn(entries: list[dict[str, Any]]) -> None:
    kinds = [e["kind"] for e in entries]
    assert kinds[:3] == ["input.accepted", "input.routed", "input.delivered"], kinds
    assert kinds.index("turn.started") < kinds.index("turn.done")
    done = next(e for e in entries if e["kind"] == "turn.done")
    assert TURN_DONE.match(done["summary"]), done["summary"]
    assert done["detail"]["steps"] >= 1 and done["detail"]["tokens"] > 0
    assert done["detail"]["usd"] > 0  # the test prices: local models cost something
    times = [e["at"] for e in entries]
    assert times == sorted(times)


async def test_a_webhook_a_start_and_a_chat_turn_are_told_in_full(instance: Instance) -> None:
    name = await new_employee(instance, hooked)
    await applied(instance, name, "start")
    start = await story(instance, name, await chain_of(instance, f"start:{name}/start"),
                        "turn.done")  # fmt: skip
    assert_turn(start)
    assert start[0]["summary"] == "start trigger fired"

    r = await instance.api.post(f"/hooks/pay-{name}", json={"note": SECRETS[0]},
                                headers={"X-Event-Id": uuid.uuid4().hex})  # fmt: skip
    assert r.status_code == 200, r.text
    hook = await story(instance, name, await chain_of(instance, f"webhook:pay-{name}"),
                       "turn.done")  # fmt: skip
    assert_turn(hook)
    assert hook[0]["summary"] == f"webhook pay-{name} accepted"
    assert hook[1]["summary"].startswith("routed to its conversation as C4 input #")

    r = await instance.api.post(f"/v1/employees/{name}/chat",
                                json={"client_message_id": "m1", "text": SECRETS[2]})  # fmt: skip
    assert r.status_code == 202
    chat = await story(instance, name, await chain_of(instance, f"chat:{name}"), "reply.sent")
    assert_turn(chat)
    assert chat[0]["summary"] == "chat message accepted"
    assert [e["summary"] for e in chat[-2:]] == ["reply queued (chat)", "reply sent"]
    turn = next(e for e in chat if e["kind"] == "turn.done")
    assert turn["ref"] == chat[-1]["detail"]["turn"]  # the reply links its turn by id

    everything = await instance.api.get(f"/v1/employees/{name}/timeline", params={"limit": 200})
    for secret in SECRETS:
        assert secret not in everything.text
    outbox = await query(instance.pool, "SELECT body FROM outbound_messages WHERE employee = %s",
                         name)  # fmt: skip
    assert outbox and all(o["body"] not in everything.text for o in outbox)


async def ctl(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


async def test_eventosctl_timeline_prints_reads_back_and_follows(
    instance: Instance, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = await new_employee(instance, hooked)
    await applied(instance, name, "start")
    chain = await chain_of(instance, f"start:{name}/start")
    await story(instance, name, chain, "turn.done")
    url = str(instance.api.base_url)
    where = ["--url", url, "--token", ADMIN_TOKEN]
    capsys.readouterr()

    assert await ctl("timeline", name, "--chain", chain, "-o", "json", *where) == 0
    page = json.loads(capsys.readouterr().out)
    r = await instance.api.get(f"/v1/employees/{name}/timeline", params={"chain": chain})
    assert [e["id"] for e in page["timeline"]] == [e["id"] for e in r.json()["timeline"]]

    assert await ctl("timeline", name, "--kind", "turn", *where) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "turn.started" in lines[0] and "turn.done" in lines[1]

    # --follow: the latest page, then each new entry once, over the event stream, until
    # interrupted (here: once the reply to a chat sent as the stream opened was printed).
    loop = asyncio.get_running_loop()
    out: list[str] = []
    blocks = 0
    deadline = time.monotonic() + 180

    async def send() -> None:
        r = await instance.api.post(f"/v1/employees/{name}/chat",
                                    json={"client_message_id": "follow", "text": "follow me"})  # fmt: skip
        assert r.status_code == 202

    def on_block() -> None:
        nonlocal blocks
        blocks += 1
        out.extend(capsys.readouterr().out.splitlines())
        if blocks == 1:
            asyncio.run_coroutine_threadsafe(send(), loop).result(timeout=30)
        elif any('"reply.sent"' in ln for ln in out) or time.monotonic() > deadline:
            raise KeyboardInterrupt

    monkeypatch.setattr(watch, "on_block", on_block)
    assert await ctl("timeline", name, "--follow", "-o", "json", *where) == 0
    out.extend(capsys.readouterr().out.splitlines())
    entries = [json.loads(ln) for ln in out]
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids))  # nothing printed twice
    rows = await query(instance.pool, "SELECT id FROM employee_timeline WHERE employee = %s "
                       "ORDER BY at, id", name)  # fmt: skip
    assert ids == [r["id"] for r in rows][: len(ids)]  # every entry, in order, none skipped
    assert any(e["kind"] == "reply.sent" for e in entries)
