"""SIGKILL of workers-workflow while a tool call is at the outside server (SPEC §11, I9): an
unsafe call ends `unknown` (the employee is told, an attention item offers Retry) and is not
made again; a read-only call is simply made again.

The six services run as processes; the outside world is a real HTTP server on loopback that
holds the first request of each path open, so the call is surely mid-flight when the worker
dies. Temporal notices the dead attempt by the tool's heartbeat timeout (10 s).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import E2E_TIMEOUT_S
from loopback_http import Answer, Loopback, http_employee, loopback
from stack import Owner, Stack, base_env, rows, until

from eventos.settings import DatabaseSettings, TemporalSettings

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

RETRY_S = 120.0  # heartbeat timeout (10 s) + a worker's boot + the rest of the turn, when busy


@pytest.fixture
def server() -> Iterator[Loopback]:
    with loopback() as s:
        yield s


@pytest.fixture
def stack(db_settings: DatabaseSettings, temporal_settings: TemporalSettings,
          tmp_path: Path) -> Iterator[Stack]:  # fmt: skip
    env = base_env(db_settings.url, temporal_settings.address, temporal_settings.namespace,
                   tmp_path / "blobs")  # fmt: skip
    with Stack(env, tmp_path) as running:
        yield running


def killed_mid_call(stack: Stack, owner: Owner, server: Loopback, name: str, path: str,
                    args: dict[str, Any]) -> str:  # fmt: skip
    """Ask for the call, kill workers-workflow while the server holds it, start a new one;
    the reply the owner gets."""
    server.release.clear()
    message_id = owner.chat(name, f"call: http_request {json.dumps(args)}")
    until(lambda: server.requests(path), 60, f"the call at the server ({path})", stack)
    stack["workers-workflow"].kill()
    server.release.set()  # the held request is answered to nobody
    stack["workers-workflow"].start()
    reply: str = until(lambda: owner.message(name, message_id)["reply"], RETRY_S,
                       "the reply after the retried call", stack)  # fmt: skip
    return reply


def test_sigkill_mid_call_makes_an_unsafe_call_unknown_and_repeats_a_read_only_one(
    stack: Stack, server: Loopback, db_settings: DatabaseSettings
) -> None:
    url, name = db_settings.url, f"k{uuid.uuid4().hex[:8]}"
    owner = Owner(stack.ingress_url)
    owner.apply_and_start(http_employee(name, "[127.0.0.1]"), name)
    server.answer("/pay", Answer(body=b'{"paid": true}', hold_first=1))
    server.answer("/stock", Answer(body=b'{"stock": 7}', hold_first=1))

    pay = {"method": "POST", "url": f"{server.base_url}/pay", "body": {"eur": 5}}
    reply = killed_mid_call(stack, owner, server, name, "/pay", pay)
    assert "unknown" in reply and "will not be repeated" in reply
    assert len(server.requests("/pay")) == 1  # never made again on its own
    (paid,) = rows(url, "SELECT id, effect, status, attempts FROM tool_calls")
    assert (paid["effect"], paid["status"], paid["attempts"]) == ("unsafe", "unknown", 2)
    (item,) = rows(url, "SELECT kind, ref, action, state FROM attention_items")
    assert item == {"kind": "tool_unknown", "ref": paid["id"], "action": "retry", "state": "open"}

    stock = {"method": "GET", "url": f"{server.base_url}/stock"}
    reply = killed_mid_call(stack, owner, server, name, "/stock", stock)
    assert '{\\"stock\\": 7}' in reply or '{"stock": 7}' in reply, reply
    assert len(server.requests("/stock")) == 2  # a read-only call is made again
    (looked,) = rows(
        url, "SELECT effect, status, outcome FROM tool_calls WHERE effect = 'read_only'"
    )
    assert (looked["effect"], looked["status"], looked["outcome"]) == ("read_only", "done", "ok")
    assert len(rows(url, "SELECT 1 FROM attention_items")) == 1
