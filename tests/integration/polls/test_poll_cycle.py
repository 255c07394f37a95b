"""One poll cycle at a time (the code each PollWorkflow attempt runs), on real PostgreSQL against
a real HTTP endpoint on loopback: paging and the cursor, dedupe, the failure backoff and
"driver down", the unrouted bound, credentials and the fetch's bounds."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from conftest import PURPOSES, PURPOSES_VAR, apply_and_start
from poll_endpoint import PollEndpoint, items, page_body
from psycopg_pool import AsyncConnectionPool
from test_router import query, route_until_done

from eventos import names
from eventos.bus.inbox import append
from eventos.contracts import PollTrigger
from eventos.db import Conn
from eventos.polls.cycle import PollEnded, Poller, Verdict, backoff_s, item_record
from eventos.polls.fetch import http_client
from eventos.settings import OutboundSettings, SecretStore

INTERVAL_S = 30
SECRETS = SecretStore(env={PURPOSES_VAR: PURPOSES, "EVENTOS_SECRET_FEED_TOKEN": "feed-token-value"})


def poll_spec(name: str, url: str, extra: str = "") -> str:
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}}}]
  triggers:
    - {{kind: poll, name: feed, interval_s: {INTERVAL_S}, url: '{url}', cursor_param: after,
        items_path: data.items, cursor_path: meta.next, id_path: id{extra}}}
"""


@pytest.fixture
def endpoint() -> Iterator[PollEndpoint]:
    server = PollEndpoint().start()
    yield server
    server.stop()


@pytest.fixture
async def poller(pool: AsyncConnectionPool[Conn]) -> AsyncIterator[Poller]:
    async with http_client(OutboundSettings(allow_private=True)) as http:
        yield Poller(pool, http, SECRETS)


async def employee(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, extra: str = "", query: str = ""
) -> PollTrigger:
    name = f"p{uuid.uuid4().hex[:8]}"
    await apply_and_start(pool, poll_spec(name, endpoint.url + query, extra))
    return PollTrigger(name, 1, "feed")


async def cursor_row(pool: AsyncConnectionPool[Conn], req: PollTrigger) -> dict[str, Any]:
    (row,) = await query(pool, "SELECT * FROM poll_cursors WHERE employee = %s", req.employee)
    return row


async def item_ids(pool: AsyncConnectionPool[Conn], req: PollTrigger) -> list[str]:
    rows = await query(pool, "SELECT dedupe_key, dup_count FROM bus_ingress WHERE source_key = %s "
                       "ORDER BY id", f"poll:{req.employee}/feed")  # fmt: skip
    assert all(r["dup_count"] == 0 for r in rows)
    return [r["dedupe_key"] for r in rows]


async def attention(pool: AsyncConnectionPool[Conn], req: PollTrigger) -> list[dict[str, Any]]:
    return await query(pool, "SELECT state, count, detail FROM attention_items WHERE kind = %s "
                       "AND ref = %s", names.ATTENTION_DRIVER_DOWN,
                       names.poll_id(req.employee, 1, "feed"))  # fmt: skip


def jittered(verdict: Verdict, interval_s: float) -> bool:
    return interval_s <= verdict.delay_s <= interval_s + min(0.1 * interval_s, 30)


async def test_pages_advance_the_cursor_and_repeated_items_are_appended_once(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller
) -> None:
    req = await employee(pool, endpoint, query="?kind=all")
    endpoint.page(None, items("a", 50), "p2")
    endpoint.page("p2", items("a", 5, start=45) + items("b", 20), "p3")  # a-45..49 again
    endpoint.page("p3", items("b", 10, start=15), None)  # b-15..19 again, and 5 new
    first = await poller.cycle(req)
    assert (first.outcome, first.appended) == ("appended", 50)
    assert first.delay_s == names.POLL_FULL_PAGE_DELAY_S  # a full page: the next comes soon
    assert (await cursor_row(pool, req))["cursor"] == "p2"
    second = await poller.cycle(req)
    assert second.appended == 20 and jittered(second, INTERVAL_S)
    third = await poller.cycle(req)
    assert third.appended == 5
    # The last page names no next cursor: the same one is polled again, and nothing repeats.
    again = await poller.cycle(req)
    assert again.appended == 0
    assert endpoint.cursors() == [None, "p2", "p3", "p3"]
    assert [r.path for r in endpoint.requests[:2]] == [
        "/items?kind=all",
        "/items?kind=all&after=p2",
    ]
    expected = [f"a-{i}" for i in range(50)] + [f"b-{i}" for i in range(25)]
    assert await item_ids(pool, req) == expected
    row = await cursor_row(pool, req)
    assert (row["cursor"], row["appended"], row["failures"], row["revision"]) == ("p3", 75, 0, 4)
    # Each item is an ingress record of the trigger's source, a CloudEvents-like envelope, C4.
    (rec,) = await query(
        pool, "SELECT type, class, envelope FROM bus_ingress WHERE dedupe_key = 'a-3'"
    )
    assert (rec["type"], rec["class"]) == (names.TYPE_POLL_ITEM, names.C4_BACKGROUND)
    env = rec["envelope"]
    assert (env["specversion"], env["source"], env["subject"]) == (
        "1.0", f"/employees/{req.employee}/feed", "feed")  # fmt: skip
    assert env["data"] == {"trigger": "feed", "id": "a-3", "item": {"id": "a-3", "n": 3}}


async def test_a_page_larger_than_fifty_items_is_taken_fifty_at_a_time_under_one_cursor(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller
) -> None:
    req = await employee(pool, endpoint)
    endpoint.page(None, items("c", 120), "next")
    got = [await poller.cycle(req) for _ in range(3)]
    assert [v.appended for v in got] == [50, 50, 20]
    assert [v.delay_s for v in got[:2]] == [names.POLL_FULL_PAGE_DELAY_S] * 2
    assert endpoint.cursors() == [None, None, None]  # the cursor moves once the page is in
    assert (await cursor_row(pool, req))["cursor"] == "next"
    assert await item_ids(pool, req) == [f"c-{i}" for i in range(120)]


async def test_a_page_stops_at_512_kb(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller
) -> None:
    req = await employee(pool, endpoint)
    big = [{"id": f"big-{i}", "pad": "x" * 60_000} for i in range(12)]  # 12 of 60 KB
    endpoint.page(None, big, "next")
    first = await poller.cycle(req)
    assert first.appended == 8 and first.delay_s == names.POLL_FULL_PAGE_DELAY_S
    assert (await cursor_row(pool, req))["cursor"] is None
    assert (await poller.cycle(req)).appended == 4
    assert (await cursor_row(pool, req))["cursor"] == "next"


async def test_failures_double_the_interval_raise_driver_down_after_five_and_a_success_resolves_it(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller
) -> None:
    req = await employee(pool, endpoint)
    endpoint.answer = (503, b"busy", {})
    for failures in range(1, 6):
        verdict = await poller.cycle(req)
        interval = INTERVAL_S * 2**failures
        assert (verdict.outcome, verdict.failures, verdict.error) == (
            "failed",
            failures,
            "outage: PollFailed: HTTP 503",  # its cause's category first (eventos.failures)
        )
        assert jittered(verdict, interval), (verdict, interval)
        row = await cursor_row(pool, req)
        assert (row["failures"], row["interval_s"], row["last_error"]) == (
            failures,
            interval,
            "outage: PollFailed: HTTP 503",
        )
        assert len(await attention(pool, req)) == (1 if failures == 5 else 0)
    (item,) = await attention(pool, req)
    assert (
        item["state"] == "open"
        and "failed 5 times in a row; last: outage: PollFailed: HTTP 503" in item["detail"]
    )
    # The interval stops doubling at an hour.
    for _ in range(3):
        verdict = await poller.cycle(req)
    assert jittered(verdict, 3600) and (await cursor_row(pool, req))["interval_s"] == 3600
    assert backoff_s(INTERVAL_S, 100) == 3600
    endpoint.answer = None
    endpoint.page(None, items("ok", 2), None)
    ok = await poller.cycle(req)
    assert ok.appended == 2 and jittered(ok, INTERVAL_S)
    row = await cursor_row(pool, req)
    assert (row["failures"], row["interval_s"], row["last_error"]) == (0, INTERVAL_S, None)
    assert [a["state"] for a in await attention(pool, req)] == ["resolved"]


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (200, b"{not json", "invalid_request: PollFailed: the response is not JSON: Expecting property name"),
        (200, b'{"data": {}}', "invalid_request: PollFailed: no 'data.items' in the response"),
        (200, b'{"data": {"items": {"a": 1}}}', "invalid_request: PollFailed: 'data.items' is dict, not a list"),
        (200, b'{"data": {"items": [{"id": "x"}, {"n": 2}]}}', "invalid_request: PollFailed: item 1 has no 'id'"),
        (200, b'{"data": {"items": []}, "meta": {"next": {"a": 1}}}', "invalid_request: PollFailed: 'meta.next' is dict, not a cursor"),
        (404, b"", "invalid_request: PollFailed: HTTP 404"),
        (401, b"", "auth: PollFailed: HTTP 401"),
        (502, b"", "outage: PollFailed: HTTP 502"),
    ],
)  # fmt: skip
async def test_bad_answers_are_failures_with_a_clear_error_and_nothing_is_appended(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller,
    status: int, body: bytes, error: str,
) -> None:  # fmt: skip
    req = await employee(pool, endpoint)
    endpoint.answer = (status, body, {})
    verdict = await poller.cycle(req)
    assert verdict.outcome == "failed" and jittered(verdict, 2 * INTERVAL_S)
    row = await cursor_row(pool, req)
    assert str(row["last_error"]).startswith(error), row["last_error"]
    assert (row["cursor"], row["failures"]) == (None, 1)
    assert await item_ids(pool, req) == []


async def test_a_rate_limit_waits_its_retry_after_when_longer_than_the_backoff(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller
) -> None:
    req = await employee(pool, endpoint)
    endpoint.answer = (429, b"", {"Retry-After": "600"})
    limited = await poller.cycle(req)
    assert (limited.error, limited.failures, limited.delay_s) == (
        "rate: PollFailed: HTTP 429",
        1,
        600.0,
    )
    endpoint.answer = (429, b"", {"Retry-After": "99999"})
    assert (await poller.cycle(req)).delay_s == 3600.0  # at most an hour
    endpoint.answer = (429, b"", {"Retry-After": "1"})
    assert jittered(await poller.cycle(req), 8 * INTERVAL_S)  # shorter: the backoff stands


async def test_the_fetch_is_bounded_in_size_and_follows_no_redirect_to_another_host(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller
) -> None:
    req = await employee(pool, endpoint)
    huge = page_body([{"id": str(i), "pad": "y" * 1000} for i in range(2500)], None)  # 2.5 MB
    endpoint.answer = (200, huge, {})
    bad = "invalid_request: PollFailed: "
    assert (
        await poller.cycle(req)
    ).error == f"{bad}response over {names.POLL_RESPONSE_MAX_BYTES} bytes"
    endpoint.answer = (302, b"", {"Location": "http://localhost:9/elsewhere"})
    assert (await poller.cycle(req)).error == f"{bad}HTTP 302: redirect to another origin"
    endpoint.answer = (307, b"", {"Location": "/items"})
    assert (await poller.cycle(req)).error == f"{bad}more than 3 redirects"
    # A redirect within the origin is followed.
    endpoint.answer = None
    endpoint.redirects[None] = "/items?after=moved"
    endpoint.page("moved", items("moved", 1), None)
    assert (await poller.cycle(req)).appended == 1
    assert endpoint.cursors()[-2:] == [None, "moved"]


async def test_credentials_come_from_the_secret_reference(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller
) -> None:
    bearer = await employee(pool, endpoint, ", auth: {scheme: bearer, secret: feed-token}")
    await poller.cycle(bearer)
    assert endpoint.requests[-1].headers["Authorization"] == "Bearer feed-token-value"
    header = await employee(pool, endpoint,
                            ", auth: {scheme: header, secret: feed-token, header: X-Api-Key}")  # fmt: skip
    await poller.cycle(header)
    assert endpoint.requests[-1].headers["X-Api-Key"] == "feed-token-value"
    missing = await employee(pool, endpoint, ", auth: {scheme: bearer, secret: not-there}")
    asked = len(endpoint.requests)
    verdict = await poller.cycle(missing)
    assert verdict.error == "auth: SecretUnavailable: secret 'not-there' is not available"
    assert len(endpoint.requests) == asked  # no request without its credential


async def test_with_a_thousand_unrouted_items_the_cycle_is_skipped_and_the_cursor_stays(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller
) -> None:
    req = await employee(pool, endpoint)
    endpoint.page(None, items("first", 1), "p2")
    await poller.cycle(req)
    backlog = [item_record(req, f"old-{i}", {"i": i}) for i in range(names.POLL_UNROUTED_MAX)]
    async with pool.connection() as conn:
        await append(conn, backlog)  # the router is not running: all stay accepted
    asked = len(endpoint.requests)
    skipped = await poller.cycle(req)
    assert skipped.outcome == "skipped" and jittered(skipped, INTERVAL_S)
    assert len(endpoint.requests) == asked  # not even fetched
    row = await cursor_row(pool, req)
    assert (row["cursor"], row["skipped"], row["failures"]) == ("p2", 1, 0)
    await route_until_done(pool)
    endpoint.page("p2", items("second", 1), None)
    assert (await poller.cycle(req)).appended == 1


async def test_an_item_over_64_kb_is_a_dead_row_with_its_reason(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller
) -> None:
    req = await employee(pool, endpoint)
    endpoint.page(None, [{"id": "huge", "pad": "z" * 70_000}, {"id": "nul", "t": "a\u0000b"},
                         {"id": "fine"}], None)  # fmt: skip
    assert (await poller.cycle(req)).appended == 3
    rows = await query(pool, "SELECT dedupe_key, status, error FROM bus_ingress WHERE source_key = %s "
                       "ORDER BY id", f"poll:{req.employee}/feed")  # fmt: skip
    got = {r["dedupe_key"]: (r["status"], r["error"]) for r in rows}
    assert got["huge"] == (names.INGRESS_DEAD, "poll item over 65536 bytes")
    assert got["nul"][0] == names.INGRESS_DEAD and got["nul"][1].startswith("unstorable")
    assert got["fine"][0] == names.INGRESS_ACCEPTED


async def test_a_generation_that_does_not_run_ends_the_poll(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller
) -> None:
    req = await employee(pool, endpoint)
    await query(pool, "UPDATE generations SET state = 'paused' WHERE employee = %s RETURNING 1",
                req.employee)  # fmt: skip
    with pytest.raises(PollEnded, match="is paused"):
        await poller.cycle(req)
    assert endpoint.requests == []
    with pytest.raises(PollEnded):
        await poller.cycle(PollTrigger(req.employee, 7, "feed"))


async def test_a_budget_held_or_degraded_employee_fetches_nothing_until_released(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller
) -> None:
    """SPEC §9, §15: what a poll appends would wait behind the hold, so the poll does not fetch
    while the budget is past normal or the employee is degraded; the cursor stays."""
    req = await employee(pool, endpoint)
    endpoint.page(None, items("a", 1), "p2")
    await poller.cycle(req)
    endpoint.page("p2", items("b", 1), None)
    await query(pool, "INSERT INTO employee_budgets (employee, timezone, offset_s, period_start, "
                "period_end, state) VALUES (%s, 'UTC', 0, now(), now() + interval '1 day', "
                "'high') RETURNING 1", req.employee)  # fmt: skip
    asked = len(endpoint.requests)
    held = await poller.cycle(req)
    assert (held.outcome, held.error) == ("held", "budget") and jittered(held, INTERVAL_S)
    await query(pool, "UPDATE employee_budgets SET state = 'normal' WHERE employee = %s "
                "RETURNING 1", req.employee)  # fmt: skip
    await query(pool, "INSERT INTO employee_health (employee, degraded_since) VALUES (%s, now()) "
                "RETURNING 1", req.employee)  # fmt: skip
    assert (await poller.cycle(req)).error == "degraded"
    assert len(endpoint.requests) == asked  # not even fetched
    row = await cursor_row(pool, req)
    assert (row["cursor"], row["skipped"], row["failures"]) == ("p2", 2, 0)
    await query(pool, "UPDATE employee_health SET degraded_since = NULL WHERE employee = %s "
                "RETURNING 1", req.employee)  # fmt: skip
    assert (await poller.cycle(req)).appended == 1


async def test_an_attempt_that_read_an_older_row_writes_nothing(
    pool: AsyncConnectionPool[Conn], endpoint: PollEndpoint, poller: Poller
) -> None:
    """A retry racing a slow predecessor: whichever writes second finds the revision moved."""
    req = await employee(pool, endpoint)
    endpoint.page(None, items("s", 2), "p2")
    await poller.cycle(req)  # revision 1, cursor p2
    endpoint.page("p2", items("t", 2), "p3")
    endpoint.hold_cursor = "p2"
    slow = asyncio.create_task(poller.cycle(req))
    await asyncio.to_thread(endpoint.held.wait, 30)  # the slow attempt has fetched p2 …
    endpoint.hold_cursor = None
    fast = await poller.cycle(req)  # … and a retry appends p2 first
    assert (fast.outcome, fast.appended) == ("appended", 2)
    endpoint.release.set()
    assert (await slow).outcome == "stale"
    assert await item_ids(pool, req) == ["s-0", "s-1", "t-0", "t-1"]
    row = await cursor_row(pool, req)
    assert (row["cursor"], row["revision"], row["appended"]) == ("p3", 2, 4)
    # The same for a failure: only the first of two attempts from one revision counts.
    endpoint.release.clear()
    endpoint.held.clear()
    endpoint.answer = (200, b"not json", {})  # a failure read from the (held) body
    endpoint.hold_cursor = "p3"
    slow = asyncio.create_task(poller.cycle(req))
    await asyncio.to_thread(endpoint.held.wait, 30)
    endpoint.hold_cursor = None
    assert (await poller.cycle(req)).outcome == "failed"
    endpoint.release.set()
    assert (await slow).outcome == "stale"
    assert (await cursor_row(pool, req))["failures"] == 1
