"""The ingress stays within its memory limit while many large bodies arrive slowly at once
(issue 11: bodies streamed, never buffered whole). The figures are bench/soak.py's; this checks
the bound holds and every upload is stored whole."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from conftest import ADMIN_TOKEN, E2E_TIMEOUT_S, SECRETS
from processes import Running

from eventos.settings import DatabaseSettings

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]
UPLOADS = 40
SIZE = 8 * 1024 * 1024
PIECE = 64 * 1024
LIMIT_MIB = 512  # the chart's memory limit of an ingress pod (size small)
# Half the limit: 40 x 8 MiB = 320 MiB arrive at once, so a body buffered whole anywhere fails.
BOUND_MIB = LIMIT_MIB / 2
SPEC = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: uploads}
spec:
  agents: [{name: main, model: {provider: local, name: scripted}}]
  triggers:
""" + "".join(
    f"    - {{kind: webhook, path: up{i}, verify: {{scheme: none}}, dedupe_header: X-Event-Id,"
    f" max_body: 10485760}}\n"
    for i in range(UPLOADS // 10)
)


@pytest.fixture
def ingress(db_settings: DatabaseSettings, tmp_path: Path) -> Iterator[Running]:
    env = {"EVENTOS_DATABASE_URL": db_settings.url, "EVENTOS_ADMIN_TOKEN": ADMIN_TOKEN,
           "EVENTOS_INGRESS_SPOOL_DIR": str(tmp_path / "spool"), **SECRETS}  # fmt: skip
    proc = Running.of("ingress", env, tmp_path)
    proc.start()
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert httpx.post(f"{proc.url}/v1/employees", content=SPEC, headers=auth).status_code == 200
    assert httpx.post(f"{proc.url}/v1/employees/uploads:start", headers=auth).status_code == 202
    yield proc
    proc.terminate()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def upload(port: int, i: int, body: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (f"POST /hooks/up{i % (UPLOADS // 10)} HTTP/1.1\r\nHost: x\r\nX-Event-Id: u{i}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    writer.write(head.encode())
    pieces = range(0, len(body), PIECE)
    for start in pieces:
        writer.write(body[start : start + PIECE])
        await writer.drain()  # the server's reading paces the client
    line = await asyncio.wait_for(reader.readline(), 120)
    writer.close()
    return int(line.split(b" ", 2)[1])


def test_slow_large_uploads_stay_within_the_memory_limit_and_are_stored_whole(
    ingress: Running, db_settings: DatabaseSettings
) -> None:
    body = bytes(range(256)) * (SIZE // 256)
    pid = ingress.proc.process.pid if ingress.proc.process else 0
    peak = [rss_mib(pid)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            peak.append(rss_mib(pid))

    sampler = threading.Thread(target=sample)
    sampler.start()

    async def all_uploads() -> list[int]:
        return await asyncio.gather(*[upload(ingress.proc.http_port, i, body)
                                      for i in range(UPLOADS)])  # fmt: skip

    try:
        codes = asyncio.run(all_uploads())
    finally:
        done.set()
        sampler.join()
    assert codes == [200] * UPLOADS
    assert max(peak) < BOUND_MIB, f"peak RSS {max(peak):.0f} MiB"
    with psycopg.connect(db_settings.url) as conn:
        rows = conn.execute(
            "SELECT b.sha256, b.size FROM bus_ingress i JOIN event_blobs b ON b.id = i.body_ref"
            " WHERE i.source_key LIKE 'webhook:up%%'"
        ).fetchall()
    assert len(rows) == UPLOADS
    assert {r for r in rows} == {(hashlib.sha256(body).hexdigest(), SIZE)}
