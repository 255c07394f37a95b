"""EG2 on the real stack: under a steady stream of owner messages with tool calls, the flag
`concurrent_read_only_tools` is turned on, then back off. Each change makes a new generation
that drains the old one (its turn stopped at its checkpoint, its pending inputs and its
conversation carried over, a notice to the owner), and every input appended is consumed exactly
once, none dropped, across the three generations."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator

import pytest
from conftest import apply_and_start
from loopback_http import Answer, Loopback, http_employee, loopback
from test_router import query
from test_turns import Instance, instance, transcript  # noqa: F401 (the in-process stack fixture)

from eventos import names
from eventos.testing import wait_for

FLAG_ON = "spec:\n  flags: {concurrent_read_only_tools: true}\n"
YAML = {"Content-Type": "application/yaml"}


@pytest.fixture
def server() -> Iterator[Loopback]:
    with loopback() as s:
        yield s


class Stream:
    """The owner's messages, each with a batch of two read-only calls (or one held call)."""

    def __init__(self, stack: Instance, name: str, server: Loopback) -> None:
        self.stack, self.name, self.server = stack, name, server
        self.texts: list[str] = []
        self.ingress: list[int] = []

    async def send(self, path: str = "/t", calls: int = 2) -> None:
        i = len(self.texts)
        get = json.dumps({"method": "GET", "url": f"{self.server.base_url}{path}"})
        text = f"m{i:03d}\n" + "\n".join(f"call: http_request {get}" for _ in range(calls))
        r = await self.stack.api.post(f"/v1/employees/{self.name}/chat",
                                      json={"client_message_id": uuid.uuid4().hex,
                                            "text": text})  # fmt: skip
        assert r.status_code == 202, r.text
        (row,) = await query(self.stack.pool, "SELECT ingress_id FROM chat_messages WHERE id = %s",
                             int(r.json()["message_id"]))  # fmt: skip
        self.texts.append(f"m{i:03d}")
        self.ingress.append(int(row["ingress_id"]))

    async def many(self, n: int) -> None:
        for _ in range(n):
            await self.send()


async def generation(stack: Instance, name: str, n: int) -> dict[str, object] | None:
    rows = await query(stack.pool, "SELECT state, pause_reason, spec -> 'spec' -> 'flags' AS flags "
                                   "FROM generations WHERE employee = %s AND generation = %s",
                       name, n)  # fmt: skip
    return rows[0] if rows else None


async def running(stack: Instance, name: str, n: int) -> None:
    async def runs() -> bool:
        gen = await generation(stack, name, n)
        return gen is not None and gen["state"] == names.GEN_RUNNING

    await wait_for(runs, timeout=90, what=f"generation {n} running")


async def apply(stack: Instance, text: str, draining: int) -> None:
    r = await stack.api.post("/v1/employees", content=text, headers=YAML)
    assert r.status_code == 200, r.text
    (item,) = r.json()["applied"]
    assert item["changed"] and item["draining"] == draining


async def test_turning_a_flag_on_and_off_under_load_consumes_every_input_once(
    instance: Instance,  # noqa: F811 (the fixture imported above)
    server: Loopback,
) -> None:
    name = f"f{uuid.uuid4().hex[:8]}"
    flag_off = http_employee(name, "[127.0.0.1]")
    flag_on = flag_off.replace("spec:\n", FLAG_ON)
    held = threading.Event()
    server.answer("/held", Answer(gate=held))
    server.answer("/t", Answer(body=b'{"ok": 1}'))
    await apply_and_start(instance.pool, flag_off)
    stream = Stream(instance, name, server)

    # Generation 1 is in a turn whose tool call the server holds when the flag turns on.
    await stream.send("/held", calls=1)

    async def at_server() -> bool:
        return bool(server.requests("/held"))

    await wait_for(at_server, timeout=60, what="the held call at the server")
    await stream.many(3)
    await apply(instance, flag_on, draining=1)
    await stream.many(10)  # appended while generation 1 drains

    async def waiting() -> bool:  # the drain waits for the held turn's merge point
        rows = await query(instance.pool, "SELECT outcome FROM intents WHERE employee = %s "
                                          "AND state = 'applying'", name)  # fmt: skip
        return any("waiting for 1 turn" in str(r["outcome"]) for r in rows)

    await wait_for(waiting, timeout=60, what="the drain waiting for the running turn")
    assert await generation(instance, name, 2) is None
    held.set()
    await running(instance, name, 2)
    await stream.many(10)

    async def consumed_in_g2() -> bool:  # turns of generation 2 (the flag on) consume inputs
        rows = await query(instance.pool, "SELECT count(*) AS n FROM bus_deliveries WHERE "
                                          "stream_key LIKE %s AND status = 'done'",
                           f"{name}/g2/%")  # fmt: skip
        return int(rows[0]["n"]) > 0

    await wait_for(consumed_in_g2, timeout=60, what="inputs consumed by generation 2")
    await apply(instance, flag_off, draining=2)
    await stream.many(10)  # appended while generation 2 drains
    await running(instance, name, 3)
    await stream.many(5)

    async def all_consumed() -> list[dict[str, object]] | None:
        rows = await query(instance.pool, "SELECT ingress_id, status, stream_key "
                                          "FROM bus_deliveries WHERE ingress_id = ANY(%s)",
                           stream.ingress)  # fmt: skip
        return rows if sum(r["status"] == "done" for r in rows) == len(stream.ingress) else None

    rows = await wait_for(all_consumed, timeout=180, interval=0.5, what="every input consumed")
    assert sorted(int(r["ingress_id"]) for r in rows) == sorted(stream.ingress)  # one row each
    assert {r["status"] for r in rows} == {"done"}
    dead = await query(instance.pool, "SELECT count(*) AS n FROM bus_deliveries d JOIN bus_streams"
                                      " s USING (stream_key) WHERE s.employee = %s AND "
                                      "d.status IN ('dead', 'failed')", name)  # fmt: skip
    assert dead[0]["n"] == 0

    # The conversation carried over: generation 3's transcript holds every message once, in order.
    users = [m["content"].split("\n", 1)[0] for m in await transcript(instance.pool, employee=name)
             if m["role"] == "user"]  # fmt: skip
    g3 = await query(instance.pool, "SELECT message FROM transcript_messages WHERE employee = %s "
                                    "AND generation = 3 AND message ->> 'role' = 'user' ORDER BY n",
                     name)  # fmt: skip
    firsts = [str(r["message"]["content"]).split("\n", 1)[0] for r in g3]
    assert sorted(firsts) == stream.texts, users
    # The flags were frozen per generation; the owner was told of each drain.
    flags = [(await generation(instance, name, n) or {})["flags"] for n in (1, 2, 3)]
    assert flags == [None, {"concurrent_read_only_tools": True}, None]
    states = [(await generation(instance, name, n) or {})["state"] for n in (1, 2, 3)]
    assert states == [names.GEN_RETIRED, names.GEN_RETIRED, names.GEN_RUNNING]
    notices = await query(instance.pool, "SELECT ref, severity, detail FROM attention_items "
                                         "WHERE employee = %s AND kind = %s ORDER BY id",
                          name, names.ATTENTION_GENERATION_DRAINED)  # fmt: skip
    assert [n["ref"] for n in notices] == [f"emp-{name}-g2", f"emp-{name}-g3"]
    assert "concurrent_read_only_tools: false → true" in str(notices[0]["detail"])
    assert "concurrent_read_only_tools: true → false" in str(notices[1]["detail"])
    outcomes = await query(instance.pool, "SELECT outcome FROM intents WHERE employee = %s AND "
                                          "kind = 'stop' ORDER BY id", name)  # fmt: skip
    assert [str(o["outcome"]).split(":")[0] for o in outcomes] == [
        "generation 1 drained into generation 2",
        "generation 2 drained into generation 3",
    ]


async def test_a_paused_generation_drains_into_a_paused_one(
    instance: Instance,  # noqa: F811 (the fixture imported above)
    server: Loopback,
) -> None:
    name = f"p{uuid.uuid4().hex[:8]}"
    flag_off = http_employee(name, "[127.0.0.1]")
    server.answer("/t", Answer(body=b'{"ok": 1}'))
    await apply_and_start(instance.pool, flag_off)
    await running(instance, name, 1)
    stopped = await instance.api.post(f"/v1/employees/{name}:stop")
    assert stopped.status_code == 202, stopped.text
    stream = Stream(instance, name, server)
    await stream.many(3)  # they wait while the owner keeps it paused
    await apply(instance, flag_off.replace("spec:\n", FLAG_ON), draining=1)

    async def paused_again() -> dict[str, object] | None:
        gen = await generation(instance, name, 2)
        intents = await query(instance.pool, "SELECT 1 FROM intents WHERE employee = %s AND "
                                             "state = 'applying'", name)  # fmt: skip
        return gen if gen is not None and gen["state"] == names.GEN_PAUSED and not intents else None

    gen = await wait_for(paused_again, timeout=60, what="generation 2 paused again")
    assert gen["pause_reason"] == names.PAUSE_OWNER
    rows = await query(instance.pool, "SELECT stream_key, status FROM bus_deliveries "
                                      "WHERE ingress_id = ANY(%s)", stream.ingress)  # fmt: skip
    assert {(str(r["stream_key"]).split("/")[1], r["status"]) for r in rows} == {("g2", "pending")}
    resumed = await instance.api.post(f"/v1/employees/{name}:resume")
    assert resumed.status_code == 202, resumed.text

    async def consumed() -> bool:
        rows = await query(instance.pool, "SELECT status FROM bus_deliveries "
                                          "WHERE ingress_id = ANY(%s)", stream.ingress)  # fmt: skip
        return [r["status"] for r in rows] == ["done"] * len(stream.ingress)

    await wait_for(consumed, timeout=90, what="the carried inputs consumed after Resume")


async def test_a_resume_before_the_drain_keeps_the_generation_and_its_flags(
    instance: Instance,  # noqa: F811 (the fixture imported above)
    server: Loopback,
) -> None:
    name = f"r{uuid.uuid4().hex[:8]}"
    flag_off = http_employee(name, "[127.0.0.1]")
    held = threading.Event()
    server.answer("/held", Answer(gate=held))
    await apply_and_start(instance.pool, flag_off)
    stream = Stream(instance, name, server)
    await stream.send("/held", calls=1)

    async def at_server() -> bool:
        return bool(server.requests("/held"))

    await wait_for(at_server, timeout=60, what="the held call at the server")
    await apply(instance, flag_off.replace("spec:\n", FLAG_ON), draining=1)
    resumed = await instance.api.post(f"/v1/employees/{name}:resume")
    assert resumed.status_code == 202, resumed.text  # the owner changed their mind
    held.set()

    async def settled() -> list[dict[str, object]] | None:
        rows = await query(instance.pool, "SELECT kind, state, outcome FROM intents "
                                          "WHERE employee = %s ORDER BY id", name)  # fmt: skip
        return rows if rows and all(r["state"] == "applied" for r in rows) else None

    rows = await wait_for(settled, timeout=60, what="the intents applied")
    assert [r["kind"] for r in rows] == ["stop", "resume"]
    assert "nothing to drain" in str(rows[0]["outcome"])
    assert await generation(instance, name, 2) is None
    gen = await generation(instance, name, 1)
    assert gen is not None and gen["state"] == names.GEN_RUNNING and gen["flags"] is None

    async def consumed() -> bool:
        rows = await query(instance.pool, "SELECT status FROM bus_deliveries "
                                          "WHERE ingress_id = ANY(%s)", stream.ingress)  # fmt: skip
        return [r["status"] for r in rows] == ["done"]

    await wait_for(consumed, timeout=60, what="the stopped turn's input consumed in generation 1")
