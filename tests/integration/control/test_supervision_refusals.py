"""What Temporal refuses at run time becomes a failed intent and an attention item naming the
cause, never a silent retry loop (issue 26 point 2), on the real dev server and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from test_router import query
from test_supervision import new_employee, post, settled, supervisor_status
from test_turns import Instance, instance  # noqa: F401 (`instance` is a fixture)

from eventos import names
from eventos.control.intent_deliverer import rearm
from eventos.runtime.temporal import TemporalConnection
from eventos.settings import TemporalSettings
from eventos.testing import wait_for

pytestmark = pytest.mark.temporal


async def items_of(instance: Instance, name: str) -> list[dict[str, Any]]:
    return await query(instance.pool, "SELECT kind, severity, ref, detail, count "
                       "FROM attention_items WHERE employee = %s ORDER BY id", name)  # fmt: skip


async def test_a_schedule_temporal_refuses_fails_its_start_with_an_attention_item(
    instance: Instance,
) -> None:
    """A cron expression stored before apply checked it (an upgrade): Temporal refuses its
    Schedule once; the start fails naming the cause, the other triggers run, nothing loops."""
    name = await new_employee(instance)
    await query(instance.pool, "UPDATE employees SET spec = jsonb_set(spec, "
                "'{spec,triggers,2,schedule}', '\"61 * * * *\"') WHERE name = %s RETURNING name",
                name)  # fmt: skip
    started = await post(instance, f"/v1/employees/{name}:start")

    async def failed() -> dict[str, Any] | None:
        got = (await instance.api.get(f"/v1/intents/{started['intent']['id']}")).json()
        return got if got["state"] == names.INTENT_FAILED else None

    intent = await wait_for(failed, timeout=30, interval=0.1, what="the start intent failed")
    sid = names.schedule_id(name, 1, "nightly")
    assert "cron trigger 'nightly'" in intent["outcome"]
    assert "Minute is not in range [0-59]" in intent["outcome"]
    assert "refused its Schedule (invalid_request: RPCError: " in intent["outcome"]  # its category
    (item,) = await items_of(instance, name)
    assert (item["kind"], item["severity"], item["ref"]) == (
        names.ATTENTION_SCHEDULE_REFUSED,
        "error",
        sid,
    )
    assert "Minute is not in range [0-59]" in item["detail"] and "apply" in item["detail"]
    # The owner sees it through the API too.
    listed = (await instance.api.get("/v1/attention")).json()
    assert any(i["kind"] == names.ATTENTION_SCHEDULE_REFUSED for i in listed["attention"]), listed
    # The supervisor's first run finished (no activity retrying), the generation runs and
    # answers its chat.
    handle = instance.client.get_workflow_handle(names.supervisor_id(name, 1))

    async def converged() -> bool:
        desc = await handle.describe()
        return (desc.status == WorkflowExecutionStatus.RUNNING
                and not desc.raw_description.pending_activities)  # fmt: skip

    await wait_for(converged, timeout=30, what="the supervisor's first run done")
    assert (await supervisor_status(instance, name)).state == names.GEN_RUNNING
    assert "hello" in await instance.reply(await instance_chat(instance, name, "hello"), name=name)
    # A re-arm meets the same refusal: it counts on the open item and does not raise.
    await rearm(instance.pool, instance.client, instance.deliverer.workflow_queue,
                outbox=instance.deliverer.outbox)  # fmt: skip
    (item,) = await items_of(instance, name)
    assert item["count"] == 2


async def instance_chat(instance: Instance, name: str, text: str) -> int:
    r = await instance.api.post(f"/v1/employees/{name}/chat",
                                json={"client_message_id": f"c-{text}", "text": text})  # fmt: skip
    assert r.status_code == 202, r.text
    return int(r.json()["message_id"])


async def test_an_intent_that_cannot_apply_fails_with_an_attention_item(
    instance: Instance,
) -> None:
    """The database says the generation is live while its supervisor completed (it was reset):
    the Stop cannot apply; it fails at once with the cause, and an attention item says so."""
    name = await new_employee(instance)
    for action in ("start", "reset"):
        answer = await post(instance, f"/v1/employees/{name}:{action}")
        assert (await settled(instance, answer["intent"]))["state"] == names.INTENT_APPLIED
    handle = instance.client.get_workflow_handle(names.supervisor_id(name, 1))
    await wait_for(lambda: _completed(handle), timeout=30, what="the supervisor completed")
    await query(instance.pool, "UPDATE generations SET state = 'running' WHERE employee = %s "
                "RETURNING employee", name)  # fmt: skip
    stop = await post(instance, f"/v1/employees/{name}:stop")
    intent = await settled(instance, stop["intent"])
    assert intent["state"] == names.INTENT_FAILED
    assert "is completed but the generation is live" in intent["outcome"]
    (item,) = await items_of(instance, name)
    assert (item["kind"], item["severity"], item["ref"]) == (
        names.ATTENTION_INTENT_FAILED,
        "error",
        f"intent-{stop['intent']['id']}",
    )
    assert intent["outcome"] in item["detail"]


async def _completed(handle: Any) -> bool:
    desc = await handle.describe()
    return bool(desc.status == WorkflowExecutionStatus.COMPLETED)


async def test_an_intent_temporal_keeps_answering_with_an_error_fails_after_its_attempts(
    instance: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temporal answers every attempt, with an error (the deliverer is pointed at a namespace
    the server does not have): after INTENT_ATTEMPTS_MAX attempts (two here) the intent fails
    with the error and an attention item, instead of retrying for ever."""
    monkeypatch.setattr(names, "INTENT_ATTEMPTS_MAX", 2)
    name = await new_employee(instance)
    answer = await post(instance, f"/v1/employees/{name}:start")
    assert (await settled(instance, answer["intent"]))["state"] == names.INTENT_APPLIED
    real = instance.deliverer.temporal
    address = real.settings.address
    instance.deliverer.temporal = TemporalConnection(
        TemporalSettings(address=address, namespace="no-such-namespace")
    )
    try:
        stop = await post(instance, f"/v1/employees/{name}:stop")
        intent = await settled(instance, stop["intent"], timeout=60)
    finally:
        instance.deliverer.temporal = real
    assert intent["state"] == names.INTENT_FAILED, intent
    assert "no-such-namespace" in intent["outcome"] and "(after 2 attempts)" in intent["outcome"]
    assert intent["outcome"].startswith("invalid_request: RPCError: "), intent  # its category
    (item,) = await items_of(instance, name)
    assert (item["kind"], item["ref"]) == (
        names.ATTENTION_INTENT_FAILED,
        f"intent-{stop['intent']['id']}",
    )
    assert intent["outcome"] in item["detail"]
