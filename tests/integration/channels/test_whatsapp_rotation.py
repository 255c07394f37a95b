"""A WhatsApp account's credential rotates under a running ingress (issue 29 point 6): Meta
notifications signed with the app secret it replaced are accepted for the overlap window, and
refused after it; the new secret is accepted at once."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import PURPOSES, apply_and_start, ingress_config, run_service
from eventos_ingress.app import build
from fake_whatsapp import FakeWhatsApp, Number
from metrics_table import sample
from psycopg_pool import AsyncConnectionPool
from test_router import query
from test_turns import local_spec

from eventos.db import Conn
from eventos.runtime.metrics import WEBHOOK_PREVIOUS_SECRET
from eventos.runtime.service import Service
from eventos.secret_purposes import VAR as PURPOSES_VAR
from eventos.settings import DatabaseSettings, SecretStore
from eventos.testing import wait_for

OLD, NEW = "app-secret-old-0123456789", "app-secret-new-9876543210"
OVERLAP_S = 2  # the window starts when ingress first sees the new file: at the first request
CUSTOMER = "16505550000"


def write_credential(folder: Path, account: str, fake: FakeWhatsApp, number: Number,
                     app_secret: str) -> None:  # fmt: skip
    doc = {"phone_number_id": number.phone_number_id, "access_token": number.token,
           "app_secret": app_secret, "verify_token": "verify-me", "graph_api": fake.base_url,
           "graph_version": "v21.0"}  # fmt: skip
    staged = folder / f".{account}.new"
    staged.write_text(json.dumps(doc))
    os.replace(staged, folder / account)  # in one step, as the kubelet swaps a Secret's files


@pytest.fixture
async def fake() -> AsyncIterator[FakeWhatsApp]:
    running = FakeWhatsApp()
    await running.start()
    yield running
    await running.stop()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "secrets"
    path.mkdir(mode=0o700)
    return path


async def test_the_previous_app_secret_is_accepted_for_the_window_then_refused(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    fake: FakeWhatsApp, folder: Path,
) -> None:  # fmt: skip
    name = f"w{uuid.uuid4().hex[:8]}"
    account = f"wa-{name}"
    number = fake.add_number()
    write_credential(folder, account, fake, number, OLD)
    env = {PURPOSES_VAR: PURPOSES, "EVENTOS_SECRETS_OVERLAP_S": str(OVERLAP_S),
           "EVENTOS_SECRETS_RECHECK_S": "0"}  # fmt: skip
    secrets = SecretStore(env=env, directory=folder)
    await apply_and_start(
        pool, local_spec(name, f"    - {{kind: whatsapp_business, account: {account}}}\n")
    )
    service: Service = await build(ingress_config(db_settings, tmp_path, secrets=secrets))
    task = await run_service(service)
    url = f"http://127.0.0.1:{service.bound_http_port}/channels/whatsapp/{account}"

    async def status(app_secret: str, text: str) -> int:
        sent = await fake.customer_message(url, app_secret, number.phone_number_id, CUSTOMER, text)
        return sent.attempts[-1]

    try:
        assert await status(OLD, "before") == 200
        write_credential(folder, account, fake, number, NEW)
        counted = sample(WEBHOOK_PREVIOUS_SECRET)
        assert await status(OLD, "old, within the window") == 200
        assert sample(WEBHOOK_PREVIOUS_SECRET) == counted + 1
        assert await status(NEW, "new") == 200
        assert await status("some-other-app-secret", "forged") == 401

        async def refused() -> bool:
            return await status(OLD, "old, until refused") == 401

        await wait_for(refused, timeout=OVERLAP_S + 30, interval=0.2, what="old secret refused")
        assert await status(NEW, "new again") == 200
    finally:
        service.stop()
        await task
    texts = [r["envelope"]["data"]["text"] for r in await query(
        pool, f"SELECT envelope FROM bus_ingress WHERE source_key = 'whatsapp_business:{account}' "
        "ORDER BY id")]  # fmt: skip
    # What the polling sent while the window lasted was accepted: nothing else is stored.
    assert texts[:3] == ["before", "old, within the window", "new"], texts
    assert texts[-1] == "new again" and set(texts[3:-1]) <= {"old, until refused"}, texts
