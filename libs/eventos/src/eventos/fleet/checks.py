"""What both drivers of the upgrader ask an instance the same way (eventos.fleet.local_driver,
eventos.fleet.k8s_driver): which generations hold runs that cannot replay, whether the new
release completed a workflow task, whether a service's `/readyz` answer names a release, and
whether the Temporal server serves on a version."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, GetSystemInfoRequest
from temporalio.client import Client
from temporalio.exceptions import TemporalError

from eventos.db import connect
from eventos.db.sql import Q
from eventos.fleet.upgrade import NeedsReset, UpgradeError
from eventos.runtime.payload_guard import connect as temporal_connect
from eventos.settings import DatabaseSettings, TemporalSettings

CHECK_RUNS_MAX = 1000  # workflows whose histories the rollback reads for a completed task
SERVES_POLL_S = 0.5
SERVES_CALL = timedelta(seconds=5)


async def generations_of(database_url: str, workflow_ids: list[str]) -> list[NeedsReset]:
    """The generations the workflows belong to (those the database knows)."""
    if not workflow_ids:
        return []
    conn = await connect(DatabaseSettings(url=database_url))
    async with conn:
        cur = await conn.execute(Q["upgrade_run_generations"], {"ids": workflow_ids})
        rows = await cur.fetchall()
    found: dict[tuple[str, int], list[str]] = {}
    for row in rows:
        if row["employee"] is not None:
            key = (str(row["employee"]), int(row["generation"]))
            found.setdefault(key, []).append(str(row["id"]))
    return [NeedsReset(e, g, sorted(ids)) for (e, g), ids in sorted(found.items())]


async def workflow_task_completed_since(temporal: TemporalSettings, since: datetime) -> bool:
    """Whether any workflow task was completed since `since` (True when it cannot be ruled out:
    more runs to read than CHECK_RUNS_MAX)."""
    client = await temporal_connect(temporal.address, temporal.namespace)
    stamp = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    query = f'ExecutionStatus="Running" OR CloseTime >= "{stamp}"'
    read = 0
    async for execution in client.list_workflows(query, page_size=100):
        read += 1
        if read > CHECK_RUNS_MAX:
            return True  # cannot rule it out: restore
        history = await client.get_workflow_handle(
            execution.id, run_id=execution.run_id
        ).fetch_history()
        for event in history.events:
            if (event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
                    and event.event_time.ToDatetime(since.tzinfo) >= since):  # fmt: skip
                return True
    return False


def readyz_says(status: int, body: Any, build: str, image_tag: str | None = None) -> str | None:
    """None when a `/readyz` answer (`status`, its JSON `body`) is ready on `build` (and on
    `image_tag` when given: the images' tag the deployment set), else what it said."""
    if not isinstance(body, dict):
        return f"{status} (not JSON)"
    release = body.get("release") or {}
    if status != 200:
        return f"{status} failed {body.get('failed')}"
    if build and release.get("build") != build:
        return f"ready, but on build {release.get('build')}"
    if image_tag is not None and release.get("image_tag") != image_tag:
        return f"ready, but on image tag {release.get('image_tag')!r}"
    return None


async def temporal_serves(temporal: TemporalSettings, version: str, timeout_s: float) -> None:
    """Return once the Temporal server at `temporal.address` serves `temporal.namespace` and
    GetSystemInfo names `version`; UpgradeError with what it last saw after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    client: Client | None = None
    seen = "no answer yet"
    while True:
        try:
            client = client or await temporal_connect(temporal.address, temporal.namespace)
            service = client.workflow_service
            info = await service.get_system_info(GetSystemInfoRequest(), timeout=SERVES_CALL)
            probe = DescribeNamespaceRequest(namespace=temporal.namespace)
            await service.describe_namespace(probe, timeout=SERVES_CALL)
            if info.server_version == version:
                return
            seen = f"it serves, on version {info.server_version}"
        except (RuntimeError, TemporalError) as exc:
            seen = f"{type(exc).__name__}: {str(exc)[:300]}"
        if time.monotonic() > deadline:
            raise UpgradeError(f"the Temporal server at {temporal.address} did not serve "
                               f"{temporal.namespace!r} on {version} within {timeout_s:g}s: "
                               f"{seen}")  # fmt: skip
        await asyncio.sleep(SERVES_POLL_S)
