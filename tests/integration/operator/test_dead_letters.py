"""Dead letters and replay on real PostgreSQL over real HTTP (SPEC §5 `replay(selector)`):
the list with its filters and pages, and replay's confirm-then-replay, where nothing is ever
replayed twice and a tampered, expired or foreign confirmation replays nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from conftest import ADMIN_TOKEN, apply_and_start
from psycopg_pool import AsyncConnectionPool
from test_router import append_all, driver_event, query

from eventos.db import Conn
from eventos.delivery.routing import route_pass
from eventos.employees import lifecycle
from eventos.operator import replay

PROBLEM = "application/problem+json"


def filtered(name: str, tag: str) -> str:
    """A webhook whose filter raises on a flat `x` (filter_error), a plain webhook, and a gRPC
    driver another employee listens to as well (`shared-<tag>`)."""
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}}}]
  triggers:
    - {{kind: chat}}
    - {{kind: webhook, name: orders, path: f-{tag}, verify: {{scheme: none}},
       dedupe_header: X-Event-Id, filter: {{data.body.x.y: 1}}}}
    - {{kind: webhook, name: plain, path: p-{tag}, verify: {{scheme: none}},
       dedupe_header: X-Event-Id}}
    - {{kind: grpc, driver: shared-{tag}}}
"""


def listener(name: str, tag: str) -> str:
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}}}]
  triggers:
    - {{kind: grpc, driver: shared-{tag}}}
"""


@dataclass
class Letters:
    api: httpx.AsyncClient
    pool: AsyncConnectionPool[Conn]
    a: str  # the employee with the failing filter, reset after two gRPC events
    b: str  # another listener of the same gRPC source
    tag: str

    async def route(self) -> None:
        async with self.pool.connection() as conn:
            while (await route_pass(conn)).rows:
                pass

    async def hook(self, path: str, body: bytes) -> None:
        headers = {"X-Event-Id": uuid.uuid4().hex, "Content-Type": "application/json"}
        r = await self.api.post(f"/hooks/{path}", content=body, headers=headers)
        assert r.status_code == 200, r.text

    async def listed(self, **params: str) -> list[dict[str, Any]]:
        r = await self.api.get("/v1/dead-letters", params=params)
        assert r.status_code == 200, r.text
        return list(r.json()["dead_letters"])

    async def preview(self, selector: dict[str, Any]) -> dict[str, Any]:
        r = await self.api.post("/v1/replay", json={"selector": selector})
        assert r.status_code == 200, r.text
        return dict(r.json())

    async def confirm(self, selector: dict[str, Any], token: object,
                      status: int = 202) -> dict[str, Any]:  # fmt: skip
        r = await self.api.post("/v1/replay", json={"selector": selector, "confirmation": token})
        assert r.status_code == status, r.text
        if status >= 400:
            assert r.headers["content-type"] == PROBLEM
        return dict(r.json())


@pytest.fixture
async def letters(pool: AsyncConnectionPool[Conn], ingress_url: str) -> AsyncIterator[Letters]:
    """Six dead letters: three `filter_error` and one `malformed` ingress rows, and two
    deliveries `reset` (employee a's; employee b keeps its own of the same two events)."""
    tag = uuid.uuid4().hex[:8]
    a, b = f"a-{tag}", f"b-{tag}"
    await apply_and_start(pool, filtered(a, tag) + "---" + listener(b, tag))
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=ingress_url, headers=headers, timeout=10) as api:
        s = Letters(api, pool, a, b, tag)
        for n in range(3):
            await s.hook(f"f-{tag}", json.dumps({"x": "flat-secret-value", "n": n}).encode())
        await s.hook(f"p-{tag}", b'{"broken json')
        await append_all(pool, [driver_event("s", n, f"grpc:shared-{tag}") for n in (1, 2)])
        await s.route()
        async with pool.connection() as conn:
            await lifecycle.reset(conn, a)
        yield s


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [r["id"] for r in rows]


async def test_dead_letters_list_every_kind_newest_first_without_content(
    letters: Letters,
) -> None:
    rows = await letters.listed()
    assert [r["reason"] for r in rows] == ["reset"] * 2 + ["filter_error"] * 3 + ["malformed"]
    assert [r["at"] for r in rows] == sorted((r["at"] for r in rows), reverse=True)
    reset, filter_error, malformed = rows[0], rows[2], rows[-1]
    assert reset["kind"] == "delivery" and reset["id"].startswith("delivery-")
    assert (reset["employee"], reset["source"]) == (letters.a, f"grpc:shared-{letters.tag}")
    assert reset["stream"].startswith(f"{letters.a}/g1/")
    assert filter_error["kind"] == "ingress" and filter_error["employee"] == letters.a
    assert filter_error["detail"].startswith("filter_error: data.body.x.y")
    assert filter_error["preview"] == (f"eventos.webhook.received, {filter_error['size']} bytes, "
                                       "data: n, x")  # fmt: skip
    assert malformed["source"] == f"webhook:p-{letters.tag}" and malformed["stream"] is None
    assert all(r["replayed_at"] is None and r["replayed_as"] is None for r in rows)
    assert "flat-secret-value" not in json.dumps(rows)  # key names only, never values


async def test_dead_letters_filter_by_reason_source_employee_and_time(letters: Letters) -> None:
    tag = letters.tag
    assert len(await letters.listed(reason="filter_error")) == 3
    assert [r["reason"] for r in await letters.listed(source="webhook")] == [
        "filter_error"] * 3 + ["malformed"]  # fmt: skip
    assert len(await letters.listed(source=f"webhook:p-{tag}")) == 1
    assert len(await letters.listed(source=f"grpc:shared-{tag}", reason="reset")) == 2
    assert len(await letters.listed(employee=letters.a)) == 6
    assert await letters.listed(employee=letters.b) == []
    later = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    assert await letters.listed(since=later) == []
    assert len(await letters.listed(until=later, replayed="false")) == 6
    assert await letters.listed(replayed="true") == []
    for bad in ({"reason": "nope"}, {"since": "yesterday"}, {"since": "2025-01-01T00:00:00"},
                {"replayed": "maybe"}, {"limit": "0"}, {"limit": "201"}, {"cursor": "x"}):  # fmt: skip
        r = await letters.api.get("/v1/dead-letters", params=bad)
        assert r.status_code == 400, (bad, r.text)
        assert r.headers["content-type"] == PROBLEM
        assert r.json()["errors"][0]["path"] == next(iter(bad))


async def test_dead_letters_page_with_a_cursor_and_are_the_admins_alone(
    letters: Letters, ingress_url: str
) -> None:
    everything = ids(await letters.listed())
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(3):
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await letters.api.get("/v1/dead-letters", params=params)).json()
        seen += ids(page["dead_letters"])
        cursor = page["next_cursor"]
    assert seen == everything and cursor is None
    r = await letters.api.post("/v1/users", json={"name": f"u{letters.tag}"})
    user = {"Authorization": f"Bearer {r.json()['token']}"}
    async with httpx.AsyncClient(base_url=ingress_url, headers=user) as other:
        for answer in (await other.get("/v1/dead-letters"),
                       await other.post("/v1/replay", json={"selector": {"reason": "reset"}})):  # fmt: skip
            assert answer.status_code == 403 and answer.headers["content-type"] == PROBLEM


async def deliveries_of(pool: AsyncConnectionPool[Conn], employee: str) -> list[dict[str, Any]]:
    q = ("SELECT d.stream_key, d.status, i.replay_of FROM bus_deliveries d "
         "JOIN bus_streams s ON s.stream_key = d.stream_key "
         "JOIN bus_ingress i ON i.id = d.ingress_id WHERE s.employee = %s ORDER BY d.id")  # fmt: skip
    return await query(pool, q, employee)


async def test_replay_confirms_then_replays_each_letter_once_to_its_own_trigger(
    letters: Letters,
) -> None:
    selector = {"reason": "reset"}
    seen = await letters.preview(selector)
    assert seen["count"] == 2 and seen["already_replayed"] == 0
    assert [r["reason"] for r in seen["sample"]] == ["reset", "reset"]
    token = seen["confirmation"]
    # Nothing moves before the confirmation; a wrong one is refused and replays nothing.
    assert await letters.listed(replayed="true") == []
    version, issued, expires, mac = token.split(".")
    later = f"{version}.{issued}.{int(expires) + 10**9}.{mac}"
    for bad in (later, token[:-2] + ("AA" if token[-2:] != "AA" else "BB")):
        done = await letters.confirm(selector, bad, status=409)
        assert "does not match" in done["detail"]
    foreign = await letters.confirm({"reason": "filter_error"}, token, status=409)
    assert "does not match" in foreign["detail"]
    garbled = await letters.confirm(selector, "not-a-token", status=400)
    assert garbled["errors"][0]["path"] == "confirmation"
    assert await letters.listed(replayed="true") == []

    async with letters.pool.connection() as conn:  # a's next generation takes the replays
        await lifecycle.start(conn, letters.a)
        await lifecycle.activate(conn, letters.a)
    done = await letters.confirm(selector, token)
    assert (done["replayed"], done["already_replayed"]) == (2, 0)
    assert sorted(r["id"] for r in done["replays"]) == sorted(r["id"] for r in seen["sample"])
    await letters.route()
    # Each went back to a's gRPC trigger only, in a's new generation; b had its own delivery
    # of both events and gets no second one.
    replayed = [d for d in await deliveries_of(letters.pool, letters.a) if d["replay_of"]]
    assert sorted(d["replay_of"] for d in replayed) == sorted(r["id"] for r in done["replays"])
    assert all(d["stream_key"].startswith(f"{letters.a}/g2/") for d in replayed)
    assert len(await deliveries_of(letters.pool, letters.b)) == 2

    again = await letters.confirm(selector, token)  # the same confirmation twice
    assert (again["replayed"], again["already_replayed"]) == (0, 2)
    assert sorted(again["already"]) == sorted(r["id"] for r in done["replays"])
    overlapping = await letters.preview({"source": "grpc"})  # a later, wider selector
    assert (overlapping["count"], overlapping["already_replayed"]) == (0, 2)
    assert overlapping["confirmation"] is None
    marked = await letters.listed(replayed="true")
    assert sorted(ids(marked)) == sorted(r["id"] for r in done["replays"])
    assert {r["replayed_as"] for r in marked} == {r["as"] for r in done["replays"]}
    await letters.route()
    assert len([d for d in await deliveries_of(letters.pool, letters.a) if d["replay_of"]]) == 2


async def test_a_replay_that_dies_again_is_a_new_letter_naming_the_first(
    letters: Letters,
) -> None:
    (first, *_) = await letters.listed(reason="filter_error")
    selector = {"ids": [first["id"]]}
    seen = await letters.preview(selector)
    assert (seen["count"], ids(seen["sample"])) == (1, [first["id"]])
    async with letters.pool.connection() as conn:  # a's next generation has the same filter
        await lifecycle.start(conn, letters.a)
        await lifecycle.activate(conn, letters.a)
    done = await letters.confirm(selector, seen["confirmation"])
    await letters.route()  # the filter still raises: it dies once more
    newest = (await letters.listed(reason="filter_error"))[0]
    assert newest["replay_of"] == first["id"]
    assert newest["id"] == f"ingress-{done['replays'][0]['as']}"
    rows = await query(letters.pool, "SELECT dedupe_key, source_key FROM bus_ingress "
                       "WHERE id = %s", done["replays"][0]["as"])  # fmt: skip
    assert rows == [{"dedupe_key": f"replay:{first['id']}", "source_key": first["source"]}]


async def test_an_expired_confirmation_and_a_selector_too_wide_are_refused(
    letters: Letters, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay, "CONFIRM_TTL", timedelta(0))
    selector = {"reason": "malformed"}
    token = (await letters.preview(selector))["confirmation"]
    expired = await letters.confirm(selector, token, status=409)
    assert "expired" in expired["detail"]
    monkeypatch.setattr(replay, "SELECT_MAX", 2)
    r = await letters.api.post("/v1/replay", json={"selector": {"reason": "filter_error"}})
    assert r.status_code == 400 and r.headers["content-type"] == PROBLEM
    assert r.json()["errors"][0]["path"] == "selector" and "more than 2" in r.json()["detail"]
    assert await letters.listed(replayed="true") == []


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({}, "selector"),
        ({"selector": {}}, "selector"),
        ({"selector": []}, "selector"),
        ({"selector": {"colour": "red"}}, "selector.colour"),
        ({"selector": {"ids": []}}, "selector.ids"),
        ({"selector": {"ids": ["letter-1"]}}, "selector.ids"),
        ({"selector": {"ids": ["ingress-1"] * 1001}}, "selector.ids"),
        ({"selector": {"reason": "nope"}}, "selector.reason"),
        ({"selector": {"since": "soon"}}, "selector.since"),
        ({"selector": {"source": 3}}, "selector.source"),
        ({"selector": {"reason": "reset"}, "extra": 1}, "extra"),
    ],
)
async def test_a_bad_selector_is_a_problem_naming_the_field(
    letters: Letters, body: dict[str, Any], path: str
) -> None:
    r = await letters.api.post("/v1/replay", json=body)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == PROBLEM and r.json()["errors"][0]["path"] == path
