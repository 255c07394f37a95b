"""The owner's lane pieces that need no server: the owner's and the turns' workflow queues and
their activity queues, their slots settings, and wake forks (issue 27)."""

from __future__ import annotations

import asyncio

import pytest

from eventos import names
from eventos.errors import ConfigError
from eventos.runtime.wake import WakeSignal
from eventos.settings import (
    OWNER_WORKFLOW_TASK_SLOTS,
    TURN_WORKFLOW_TASK_SLOTS,
    WORKFLOW_TASK_SLOTS,
    WorkflowSettings,
)


def test_the_owners_and_the_turns_queues_share_their_home_queues_activity_queues() -> None:
    for home in (names.WORKFLOW_QUEUE, "wf-test"):
        beside = {names.owner_queue(home), names.turn_queue(home)}
        assert len(beside) == 2 and home not in beside
        for queue in beside:
            for base in (names.LLM_QUEUES[names.C1_OWNER], names.EGRESS_QUEUE):
                assert names.queue_for(base, queue) == names.queue_for(base, home)
    assert names.queue_for(names.EGRESS_QUEUE, names.owner_queue(names.WORKFLOW_QUEUE)) == "egress"
    assert names.queue_for("llm-c4", names.turn_queue("wf-test")) == "wf-test.llm-c4"


def test_the_owners_conversation_is_the_owner_chat_not_a_users() -> None:
    assert names.owners_conversation("ann/g1/talk/main", "main")
    assert not names.owners_conversation("ann/g1/talk/u_0123456789abcdef", "u_0123456789abcdef")
    assert not names.owners_conversation("ann/g1/worker/t_0123456789abcdef", "t_0123456789abcdef")


def test_owner_and_turn_slots_are_settings_of_their_own() -> None:
    assert WorkflowSettings.from_env({}) == WorkflowSettings(
        WORKFLOW_TASK_SLOTS, OWNER_WORKFLOW_TASK_SLOTS, TURN_WORKFLOW_TASK_SLOTS
    )
    env = {"EVENTOS_WORKFLOW_TASK_SLOTS": "6", "EVENTOS_OWNER_WORKFLOW_TASK_SLOTS": "3",
           "EVENTOS_TURN_WORKFLOW_TASK_SLOTS": "5"}  # fmt: skip
    assert WorkflowSettings.from_env(env) == WorkflowSettings(6, 3, 5)
    for name in ("EVENTOS_OWNER_WORKFLOW_TASK_SLOTS", "EVENTOS_TURN_WORKFLOW_TASK_SLOTS"):
        with pytest.raises(ConfigError, match=name):
            WorkflowSettings.from_env({name: "0"})


async def test_a_kick_reaches_every_fork_whoever_waits_first() -> None:
    signal = WakeSignal()
    first, second = signal.fork(), signal.fork()
    signal.set()
    assert await first.wait(1.0)
    assert await second.wait(1.0)  # the first's wait did not clear it
    assert not await asyncio.wait_for(first.wait(0.01), 1.0)  # each clears on its own
