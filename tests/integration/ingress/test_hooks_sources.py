"""Each verification scheme over real HTTP with real signatures; dedupe per source; bodies by
reference; only allowlisted headers kept."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import signing
from psycopg_pool import AsyncConnectionPool
from test_hooks import event_body, rows

from eventos.bus import blobs
from eventos.db import Conn


@pytest.fixture
async def client(started: str, ingress_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=ingress_url, timeout=10) as c:
        yield c


def whatsapp_body(wamid: str) -> bytes:
    value = {"messages": [{"id": wamid, "from": "4915100000000", "text": {"body": "hi"}}]}
    return json.dumps({"object": "whatsapp_business_account",
                       "entry": [{"changes": [{"value": value}]}]}).encode()  # fmt: skip


Signer = Callable[[bytes], dict[str, str]]
SCHEMES: dict[str, tuple[str, Signer]] = {
    "stripe": ("stripe", lambda b: signing.stripe(b)),
    "github": ("github", lambda b: signing.github(b, uuid.uuid4().hex)),
    "standard-webhooks": ("std", lambda b: signing.standard(b, f"msg_{uuid.uuid4().hex}")),
    "whatsapp-business": ("meta", lambda b: signing.meta(b)),
    "hmac-sha256": ("deploys", lambda b: signing.deploy(b)),
    "header": (
        "plain",
        lambda b: {"X-Token": "plain-token-value", "X-Request-Id": uuid.uuid4().hex},
    ),
}


@pytest.mark.parametrize("scheme", list(SCHEMES))
async def test_valid_signature_is_accepted_and_tampered_is_401(
    scheme: str, client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    path, sign = SCHEMES[scheme]
    body = whatsapp_body(f"wamid.{uuid.uuid4().hex}") if path == "meta" else event_body()
    headers = sign(body)
    ok = await client.post(f"/hooks/{path}", content=body, headers=headers)
    assert ok.status_code == 200, ok.text
    assert ok.json()["status"] == "accepted"
    tampered = body.replace(b"}", b', "x": 1}', 1)
    bad = await client.post(f"/hooks/{path}", content=tampered, headers=headers)
    if scheme == "header":  # a shared-secret header does not sign the body
        assert bad.status_code == 200
    else:
        assert bad.status_code == 401
    missing = await client.post(f"/hooks/{path}", content=body)
    assert missing.status_code == 401
    stored = await rows(pool, f"webhook:{path}")
    assert stored[0]["id"] == ok.json()["id"]


async def test_standard_webhooks_stale_timestamp_is_401(client: httpx.AsyncClient) -> None:
    body = event_body()
    headers = signing.standard(body, "msg_stale", ts=int(time.time()) - 3600)
    r = await client.post("/hooks/std", content=body, headers=headers)
    assert r.status_code == 401


async def test_a_replayed_github_body_under_a_new_delivery_id_is_a_duplicate(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    """A captured signed delivery sent again under a new X-GitHub-Delivery is a duplicate
    (200, the first row's id); GitHub's own redelivery (same id, same body) is one as well;
    a new body is a new event."""
    body = event_body()
    first = await client.post("/hooks/github", content=body,
                              headers=signing.github(body, "d-original"))  # fmt: skip
    replayed = await client.post("/hooks/github", content=body,
                                 headers=signing.github(body, "d-forged"))  # fmt: skip
    redelivered = await client.post("/hooks/github", content=body,
                                    headers=signing.github(body, "d-original"))  # fmt: skip
    other = event_body()
    fresh = await client.post("/hooks/github", content=other,
                              headers=signing.github(other, "d-forged"))  # fmt: skip
    assert first.status_code == 200 and first.json()["status"] == "accepted"
    for again in (replayed, redelivered):
        assert again.status_code == 200
        assert again.json() == {"status": "duplicate", "id": first.json()["id"]}
    assert fresh.status_code == 200 and fresh.json()["status"] == "accepted"
    stored = await rows(pool, "webhook:github")
    assert [r["id"] for r in stored] == [first.json()["id"], fresh.json()["id"]]
    assert stored[0]["dup_count"] == 2


async def test_dedupe_uses_each_providers_id(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    # Stripe: the event id in the body, whatever the signature timestamp.
    body = event_body()
    for ts in (int(time.time()), int(time.time()) - 5):
        await client.post("/hooks/stripe", content=body, headers=signing.stripe(body, ts=ts))
    # GitHub: the signed body (X-GitHub-Delivery is not signed), whatever the delivery id.
    gh = event_body()
    for delivery in ("delivery-1", "delivery-2"):
        await client.post("/hooks/github", content=gh, headers=signing.github(gh, delivery))
    # Standard Webhooks: webhook-id.
    for b in (event_body(), event_body()):
        await client.post("/hooks/std", content=b, headers=signing.standard(b, "msg_same"))
    # WhatsApp: the wamid.
    wa = whatsapp_body("wamid.SAME")
    for _ in range(2):
        await client.post("/hooks/meta", content=wa, headers=signing.meta(wa))
    # Generic with a dedupe header.
    for b in (b'{"a":1}', b'{"a":2}'):
        await client.post(
            "/hooks/plain",
            content=b,
            headers={"X-Token": "plain-token-value", "X-Request-Id": "r-1"},
        )
    expected = {
        "webhook:stripe": [json.loads(body)["id"]],
        "webhook:github": ["body:" + hashlib.sha256(gh).hexdigest()],
        "webhook:std": ["msg_same"],
        "webhook:meta": ["wamid.SAME"],
        "webhook:plain": ["h:r-1"],
    }
    for source, keys in expected.items():
        stored = await rows(pool, source)
        assert [r["dedupe_key"] for r in stored] == keys, source
        assert stored[0]["dup_count"] == 1, source


async def test_generic_body_hash_dedupes_for_ten_minutes_only(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    body = event_body()
    first = await client.post("/hooks/deploys", content=body, headers=signing.deploy(body))
    again = await client.post("/hooks/deploys", content=body, headers=signing.deploy(body))
    assert again.json() == {"status": "duplicate", "id": first.json()["id"]}
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT expires_at - received_at AS ttl FROM bus_dedupe WHERE source_key = 'webhook:deploys'"
        )
        (row,) = await cur.fetchall()
        assert row["ttl"].total_seconds() == 600
        # Eleven minutes later the same body is a new event.
        await conn.execute("UPDATE bus_dedupe SET expires_at = now() - interval '1 minute'")
    later = await client.post("/hooks/deploys", content=body, headers=signing.deploy(body))
    assert later.json()["status"] == "accepted"
    assert later.json()["id"] != first.json()["id"]
    assert len(await rows(pool, "webhook:deploys")) == 2


async def test_same_key_on_two_sources_is_two_events(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    for path in ("internal", "big"):
        r = await client.post(f"/hooks/{path}", content=b"{}", headers={"X-Event-Id": "same"})
        assert r.json()["status"] == "accepted"
    assert len(await rows(pool, "webhook:internal")) == 1
    assert len(await rows(pool, "webhook:big")) == 1


async def test_body_over_64kb_travels_by_reference(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn], tmp_path: Path
) -> None:
    payload: dict[str, Any] = {"items": ["x" * 1000] * 100}
    body = json.dumps(payload).encode()
    assert len(body) > 64 * 1024
    r = await client.post(
        "/hooks/big", content=body, headers={"X-Event-Id": "b1", "content-type": "application/json"}
    )
    assert r.status_code == 200
    (row,) = await rows(pool, "webhook:big")
    ref = row["body_ref"]
    assert ref and ref.startswith("blob_")
    data = row["envelope"]["data"]
    assert data["body_ref"] == ref
    assert "body" not in data
    assert len(data["preview"].encode()) <= 4096
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT * FROM event_blobs WHERE id = %s", (ref,))
        blob = await cur.fetchone()
    assert blob is not None
    assert blob["sha256"] == hashlib.sha256(body).hexdigest()
    assert blob["storage_path"] is None  # held in the database, not on a pod's disk
    assert blob["size"] == len(body)
    async with pool.connection() as conn:
        assert await blobs.read(conn, ref) == body
        cur = await conn.execute("SELECT count(*) AS n FROM event_blob_chunks WHERE blob_id = %s",
                                 (ref,))  # fmt: skip
        assert (await cur.fetchone() or {})["n"] == 1  # 100 KB: one chunk of 256 KiB


async def test_a_10_mib_body_is_stored_in_chunks_and_read_back_whole(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    body = json.dumps({"blob": "z" * (10 * 1024 * 1024 - 20)}).encode()

    async def slowly() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 64 * 1024):
            yield body[i : i + 64 * 1024]

    r = await client.post("/hooks/huge", content=slowly(), headers={"X-Event-Id": "huge-1",
                          "content-type": "application/json"})  # fmt: skip
    assert r.status_code == 200, r.text
    (row,) = await rows(pool, "webhook:huge")
    assert row["status"] == "accepted" and row["size"] == len(body)
    async with pool.connection() as conn:
        assert await blobs.read(conn, row["body_ref"]) == body
        cur = await conn.execute("SELECT count(*) AS n FROM event_blob_chunks WHERE blob_id = %s",
                                 (row["body_ref"],))  # fmt: skip
        assert (await cur.fetchone() or {})["n"] == 40
    assert len(json.dumps(row["envelope"]).encode()) < 64 * 1024


async def test_only_allowlisted_headers_are_kept(
    client: httpx.AsyncClient, pool: AsyncConnectionPool[Conn]
) -> None:
    body = event_body()
    headers = {
        **signing.github(body, "d-h"),
        "Authorization": "Bearer s3cret",
        "Cookie": "session=abc",
        "Proxy-Authorization": "Basic xyz",
        "X-Random": "not kept",
    }
    r = await client.post("/hooks/github", content=body, headers=headers)
    assert r.status_code == 200
    (row,) = await rows(pool, "webhook:github")
    kept = row["envelope"]["data"]["headers"]
    assert {"x-github-delivery", "x-github-event", "content-type"} <= set(kept)
    for secret in (
        "authorization",
        "cookie",
        "proxy-authorization",
        "x-hub-signature-256",
        "x-random",
    ):
        assert secret not in kept
    assert "s3cret" not in json.dumps(row["envelope"])
