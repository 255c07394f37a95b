"""The replay gate: today's workflow code replays every history every release recorded.

`tests/histories/<release>/` holds the histories each release's code recorded on the real
stack (record_histories.py; a release is the eventos version, release_histories.py). Every one
of every release must replay without a nondeterminism error on the current code, the newest
release must hold a history of every workflow type this code registers (a new type cannot
skip the gate) showing the commands it records, and the gate can fail: a workflow changed
without a patch marker fails its replay, the same change behind one passes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from datetime import timedelta
from typing import Any

import pytest
from release_histories import HISTORIES, Recorded, recorded, release_folders
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    Replayer,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from eventos import names
from eventos.runtime.build import release
from eventos.runtime.payload_guard import GUARDED_DATA_CONVERTER
from eventos.workers.roles import WORKFLOWS

FOLDERS = release_folders()
ALL = [r for folder in FOLDERS for r in recorded(folder)]
NEWEST = recorded(FOLDERS[-1]) if FOLDERS else []
TYPES = {w.__temporal_workflow_definition.name: w for w in WORKFLOWS}  # type: ignore[attr-defined]


async def each(histories: Iterable[WorkflowHistory]) -> AsyncIterator[WorkflowHistory]:
    for history in histories:
        yield history


async def replay_failures(replayer: Replayer, histories: list[Recorded]) -> dict[str, str]:
    """Each history that did not replay, by its file, with the error."""
    results = await replayer.replay_workflows(
        each(r.history for r in histories), raise_on_replay_failure=False
    )
    found = results.replay_failures
    return {r.label: repr(found[r.history.run_id]) for r in histories if r.history.run_id in found}


async def test_every_history_of_every_release_replays_on_this_code() -> None:
    assert len({r.history.run_id for r in ALL}) == len(ALL), "a history recorded twice"
    replayer = Replayer(workflows=WORKFLOWS, data_converter=GUARDED_DATA_CONVERTER)
    assert await replay_failures(replayer, ALL) == {}


def test_the_newest_release_is_this_code_and_has_a_history_of_every_workflow_type() -> None:
    assert FOLDERS, "no release folder in tests/histories: make record-histories"
    newest = FOLDERS[-1].name
    assert newest == release(), (
        f"this code is release {release()}, the newest histories are {newest}'s: record this "
        "release's (make record-histories) and commit tests/histories/" + release()
    )
    missing = set(TYPES) - {r.workflow_type for r in NEWEST}
    assert missing == set(), f"no history of {sorted(missing)} in tests/histories/{newest}"


def started(name: str) -> Callable[[HistoryEvent], bool]:
    return lambda e: (
        e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == name
    )


def of_type(event_type: EventType.ValueType) -> Callable[[HistoryEvent], bool]:
    return lambda e: e.event_type == event_type


# What the newest release's histories show of each type between them: the commands the
# recorder's scenarios drive (a history of a type that does nothing would gate nothing).
SHOWS: dict[str, dict[str, Callable[[HistoryEvent], bool]]] = {
    names.WF_CONVERSATION: {
        "a turn started": of_type(EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED),
        "a Signal": of_type(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED),
        "continued as new": of_type(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW),
        "passivated": of_type(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED),
    },
    names.WF_TURN: {
        "a tool call": started(names.ACT_TOOL),
        "an approval": of_type(EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED),
    },
    names.WF_SUPERVISOR: {
        "a control applied": started(names.ACT_APPLY_CONTROL),
        "the alarms fired": started(names.ACT_FIRE_ALARMS),
        "an Update": of_type(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED),
    },
    names.WF_APPROVAL: {
        "the decision's nudge": of_type(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED),
        "completed": of_type(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED),
    },
    names.WF_POLL: {
        "a cycle": started(names.ACT_POLL),
        "ended": of_type(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED),
    },
    names.WF_SCHEDULE_FIRE: {"a fire": started(names.ACT_FIRE_SCHEDULE)},
}


def test_the_newest_histories_show_what_each_workflow_type_does() -> None:
    assert set(SHOWS) == set(TYPES), "say what the new type's histories must show"
    lacking = [
        f"{kind}: {what}"
        for kind, wanted in SHOWS.items()
        for what, shows in wanted.items()
        if not any(shows(e) for r in NEWEST if r.workflow_type == kind for e in r.history.events)
    ]
    assert lacking == []


PROBE = "replay-gate-probe"  # an activity no release ever ran


class Changed(Interceptor):
    """Workflow type `kind` changed: one command added before its first, a probe activity
    started (behind the patch marker `PROBE` when `patched`), as a careless edit would."""

    def __init__(self, kind: str, *, patched: bool) -> None:
        self.kind, self.patched = kind, patched

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        kind, patched = self.kind, self.patched

        class Inbound(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                if workflow.info().workflow_type == kind and (
                    not patched or workflow.patched(PROBE)
                ):
                    workflow.start_activity(PROBE, start_to_close_timeout=timedelta(seconds=10))
                return await super().execute_workflow(input)

        return Inbound


@pytest.mark.parametrize("kind", sorted(TYPES))
async def test_a_change_without_a_patch_marker_fails_the_gate_and_one_behind_it_passes(
    kind: str,
) -> None:
    histories = [r for r in NEWEST if r.workflow_type == kind]
    assert histories, kind

    def replayer(*, patched: bool) -> Replayer:
        return Replayer(workflows=WORKFLOWS, data_converter=GUARDED_DATA_CONVERTER,
                        interceptors=[Changed(kind, patched=patched)])  # fmt: skip

    failed = await replay_failures(replayer(patched=False), histories)
    assert sorted(failed) == sorted(r.label for r in histories)
    assert all("NondeterminismError" in error for error in failed.values()), failed
    assert await replay_failures(replayer(patched=True), histories) == {}


def test_the_histories_folder_holds_release_folders_only() -> None:
    strays = [p.name for p in HISTORIES.iterdir() if not p.is_dir()]
    assert strays == [], "histories belong in tests/histories/<release>/"
