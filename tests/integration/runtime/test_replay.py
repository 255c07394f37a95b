"""Workflow changes replay the histories recorded before them (Temporal determinism).

tests/histories/ holds an owner chat's entity and turns as an earlier release ran them (see
record_histories.py); today's workflow code must replay each without a nondeterminism error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from eventos.runtime.payload_guard import GUARDED_DATA_CONVERTER
from eventos.workers.roles import WORKFLOWS

HISTORIES = Path(__file__).resolve().parents[2] / "histories"
RECORDED = sorted(HISTORIES.glob("*.json"))


def test_the_recorded_histories_cover_the_entity_and_the_turns() -> None:
    names = {p.stem.rsplit("-", 1)[0] for p in RECORDED}
    assert names == {"conversation", "turn"}, RECORDED


async def each(histories: list[WorkflowHistory]) -> AsyncIterator[WorkflowHistory]:
    for history in histories:
        yield history


async def test_every_recorded_history_replays() -> None:
    histories = [WorkflowHistory.from_json(p.stem, p.read_text()) for p in RECORDED]
    replayer = Replayer(workflows=WORKFLOWS, data_converter=GUARDED_DATA_CONVERTER)
    results = await replayer.replay_workflows(each(histories), raise_on_replay_failure=False)
    failures = {
        p.stem: str(results.replay_failures.get(h.run_id))
        for p, h in zip(RECORDED, histories, strict=True)
        if h.run_id in results.replay_failures
    }
    assert failures == {}
