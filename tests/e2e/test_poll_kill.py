"""SIGKILL of workers-workflow while a poll is between its fetch and its append: the poll loses
and doubles nothing (issue 13 point 6, SPEC §7 PollWorkflow, I9).

The six services run as processes on the session's dev server. The polled endpoint is a real
HTTP server on loopback that sends its second page all but the last byte and holds it there, so
the worker surely has the page in hand and has appended nothing when it dies. Temporal notices
the dead attempt by its heartbeat timeout (10 s) and retries it on the restarted worker; the
cursor never moved, so the page is fetched again and appended once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import E2E_TIMEOUT_S
from poll_endpoint import PollEndpoint, items
from stack import Owner, Stack, base_env, rows, run_async, until
from temporalio.client import Client

from eventos import names
from eventos.settings import DatabaseSettings, TemporalSettings

# Whole stacks of processes on a small shared machine: a longer hang limit than the default.
pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

RETRY_S = (
    150.0  # heartbeat timeout (10 s) + the retry interval (10 s) + two pages, on a busy machine
)

SPEC = """
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}}}]
  triggers:
    - {{kind: chat}}
    - {{kind: poll, name: feed, interval_s: 30, url: '{url}', cursor_param: after,
        items_path: data.items, cursor_path: meta.next, id_path: id}}
"""


@pytest.fixture
def endpoint() -> Iterator[PollEndpoint]:
    server = PollEndpoint().start()
    yield server
    server.stop()


@pytest.fixture
def stack(
    db_settings: DatabaseSettings, temporal_settings: TemporalSettings, tmp_path: Path
) -> Iterator[Stack]:
    env = base_env(db_settings.url, temporal_settings.address, temporal_settings.namespace,
                   tmp_path / "blobs")  # fmt: skip
    with Stack(env, tmp_path) as running:
        yield running


async def end_poll(settings: TemporalSettings, workflow_id: str) -> None:
    """Leave no poll running on the session's shared dev server."""
    client = await Client.connect(settings.address, namespace=settings.namespace)
    await client.get_workflow_handle(workflow_id).terminate("test over")


def test_sigkill_between_fetch_and_append_loses_and_doubles_nothing(
    stack: Stack,
    endpoint: PollEndpoint,
    db_settings: DatabaseSettings,
    temporal_settings: TemporalSettings,
) -> None:
    url = db_settings.url
    name = f"k{uuid.uuid4().hex[:8]}"  # workflow ids on the shared dev server never collide
    endpoint.page(None, items("a", 50), "p2")  # full pages: each next one comes 2 s later
    endpoint.page("p2", items("b", 50), "p3")
    endpoint.page("p3", items("c", 10), None)
    endpoint.hold_cursor = "p2"
    Owner(stack.ingress_url).apply_and_start(SPEC.format(name=name, url=endpoint.url), name)
    try:
        until(endpoint.held.is_set, 60, "the second page fetched and held", stack)
        stack["workers-workflow"].kill()
        endpoint.release.set()
        # The first page is in, the second is not, and the cursor stands at it.
        (cursor,) = rows(url, "SELECT cursor, appended, failures FROM poll_cursors")
        assert (cursor["cursor"], cursor["appended"], cursor["failures"]) == ("p2", 50, 0)
        assert polled(url) == {f"a-{i}": 0 for i in range(50)}
        stack["workers-workflow"].start()

        def all_in() -> bool:
            return len(polled(url)) == 110

        until(all_in, RETRY_S, "every item after the retried attempt", stack)
        expected = [f"{p}-{i}" for p, n in (("a", 50), ("b", 50), ("c", 10)) for i in range(n)]
        # Each item exactly once: one row each, and no duplicate ever counted against one.
        assert polled(url) == dict.fromkeys(expected, 0)
        (cursor,) = rows(url, "SELECT cursor, appended, failures, last_error FROM poll_cursors")
        assert cursor == {"cursor": "p3", "appended": 110, "failures": 0, "last_error": None}
        assert endpoint.cursors()[:4] == [None, "p2", "p2", "p3"]
    finally:
        run_async(end_poll(temporal_settings, names.poll_id(name, 1, "feed")))


def polled(url: str) -> dict[str, int]:
    """Each polled item's dedupe key and how often a duplicate of it was refused."""
    found = rows(url, "SELECT dedupe_key, dup_count FROM bus_ingress WHERE source_key LIKE 'poll:%' "
                 "ORDER BY id")  # fmt: skip
    keys = [r["dedupe_key"] for r in found]
    assert len(keys) == len(set(keys))
    return {r["dedupe_key"]: r["dup_count"] for r in found}
