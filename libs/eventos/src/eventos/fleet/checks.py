"""What both drivers of the upgrader ask an instance the same way (eventos.fleet.local_driver,
eventos.fleet.k8s_driver): which generations hold runs that cannot replay, whether the new
release completed a workflow task, whether a service's `/readyz` answer names a release, and
whether the Temporal server serves on a version."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, GetSystemInfoRequest

from eventos.db import connect
from eventos.db.sql import Q
from eventos.fleet.upgrade import NeedsReset
from eventos.runtime.payload_guard import connect as temporal_connect
from eventos.settings import DatabaseSettings, TemporalSettings

CHECK_RUNS_MAX = 1000  # workflows whose histories the rollback reads for a completed task
TEMPORAL_ASK_S = 10.0  # one connection and its two questions to the Temporal frontend


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


async def temporal_serves(temporal: TemporalSettings, version: str) -> str | None:
    """None when the Temporal server at `temporal` serves on `version` (its namespace answers,
    GetSystemInfo's server_version is `version`), else what it said."""

    async def ask() -> str | None:
        client = await temporal_connect(temporal.address, temporal.namespace)
        service = client.service_client.workflow_service
        info = await service.get_system_info(GetSystemInfoRequest())
        await service.describe_namespace(DescribeNamespaceRequest(namespace=temporal.namespace))
        said = info.server_version
        return None if said == version else f"Temporal at {temporal.address} runs {said}"

    try:
        return await asyncio.wait_for(ask(), TEMPORAL_ASK_S)
    except Exception as exc:  # not serving yet: unreachable, the namespace not loaded, a timeout
        return f"Temporal at {temporal.address}: {type(exc).__name__}: {str(exc)[:200]}"
