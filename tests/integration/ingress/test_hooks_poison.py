"""Verified but malformed (SPEC §6.1): 200 once, one `dead(malformed: <why>)` row whose raw bytes
an operator can read, a resend that is a duplicate, and neighbours that never pay for it."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
import signing
from metrics_table import sample
from psycopg_pool import AsyncConnectionPool
from test_hooks import client, rows  # noqa: F401  (a fixture, shared)

from eventos.bus import blobs
from eventos.db import Conn
from eventos.runtime.metrics import DEAD_LETTERS


def evt() -> str:
    return f"evt_{uuid.uuid4().hex}"


POISON = {
    "nul-escape": (lambda i: f'{{"id": "{i}", "note": "a\\u0000b"}}'.encode(), "NUL"),
    "lone-surrogate": (lambda i: f'{{"id": "{i}", "note": "\\ud800"}}'.encode(), "lone surrogate"),
    "deep-1000": (
        lambda i: f'{{"id": "{i}", "x": '.encode() + b"[" * 1000 + b"]" * 1000 + b"}",
        "nested deeper than 64",
    ),
    "deep-65": (
        lambda i: f'{{"id": "{i}", "x": '.encode() + b"[" * 64 + b"]" * 64 + b"}",
        "nested deeper than 64",
    ),
    "nul-key": (lambda i: f'{{"id": "{i}", "a\\u0000": 1}}'.encode(), "NUL"),
}


@pytest.mark.parametrize("case", sorted(POISON))
async def test_a_poisoned_verified_body_is_200_once_dead_with_its_bytes(
    case: str, client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    make, reason = POISON[case]
    body = make(evt())
    first = await client.post("/hooks/stripe", content=body, headers=signing.stripe(body))
    again = await client.post("/hooks/stripe", content=body, headers=signing.stripe(body))
    assert (first.status_code, again.status_code) == (200, 200), first.text
    assert first.json()["status"] == "accepted"
    assert again.json() == {"status": "duplicate", "id": first.json()["id"]}
    (row,) = await rows(pool, "webhook:stripe")
    assert row["status"] == "dead"
    assert row["error"].startswith("malformed: ") and reason in row["error"]
    assert row["body_ref"] and row["envelope"]["data"]["body_ref"] == row["body_ref"]
    async with pool.connection() as conn:
        assert await blobs.read(conn, row["body_ref"]) == body  # raw bytes kept for an operator


async def test_a_nul_byte_in_a_text_body_is_dead_not_an_outage(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    body = b"plain\x00text"
    before = sample(DEAD_LETTERS, reason="malformed")
    r = await client.post("/hooks/internal", content=body, headers={"X-Event-Id": "nul-1"})
    assert r.status_code == 200
    assert sample(DEAD_LETTERS, reason="malformed") == before + 1
    (row,) = await rows(pool, "webhook:internal")
    assert (row["status"], row["error"]) == ("dead", "malformed: holds a NUL character")
    assert "\ufffd" in row["envelope"]["data"]["preview"]


async def test_a_dedupe_key_longer_than_the_index_allows_is_hashed_and_still_dedupes(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    long_key = "k" * 6000
    for _ in range(2):
        r = await client.post("/hooks/internal", content=b"{}", headers={"X-Event-Id": long_key})
        assert r.status_code == 200, r.text
    assert r.json()["status"] == "duplicate"
    (row,) = await rows(pool, "webhook:internal")
    assert row["status"] == "accepted"
    assert row["dedupe_key"].startswith("key-sha256:") and len(row["dedupe_key"]) < 100


async def test_a_whatsapp_batch_of_60_statuses_is_one_event_with_a_hashed_key(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    statuses = [{"id": f"wamid.{uuid.uuid4().hex * 2}", "status": "delivered"} for _ in range(60)]
    body = json.dumps({"entry": [{"changes": [{"value": {"statuses": statuses}}]}]}).encode()
    for expected in ("accepted", "duplicate"):
        r = await client.post("/hooks/meta", content=body, headers=signing.meta(body))
        assert (r.status_code, r.json()["status"]) == (200, expected)
    (row,) = await rows(pool, "webhook:meta")
    assert row["dedupe_key"].startswith("key-sha256:")


async def test_one_bad_record_in_a_batch_leaves_every_neighbour_200_and_stored(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    """Ten valid Stripe hooks and one whose id is 6 KB share group-commit batches."""
    good = [json.dumps({"id": evt(), "type": "invoice.paid"}).encode() for _ in range(10)]
    bad = json.dumps({"id": "evt_" + "x" * 6000, "type": "invoice.paid"}).encode()
    bodies = [*good[:5], bad, *good[5:]]
    answers = await asyncio.gather(
        *[client.post("/hooks/stripe", content=b, headers=signing.stripe(b)) for b in bodies]
    )
    assert [a.status_code for a in answers] == [200] * 11
    assert all(a.json()["status"] == "accepted" for a in answers)
    stored = await rows(pool, "webhook:stripe")
    assert len(stored) == 11
    assert {r["status"] for r in stored} == {"accepted"}
