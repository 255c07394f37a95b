"""The owner's lane pieces that need no server: the owner's workflow queue and its activity
queues, its slots setting, and wake forks (issue 27)."""

from __future__ import annotations

import asyncio

import pytest

from eventos import names
from eventos.errors import ConfigError
from eventos.runtime.wake import WakeSignal
from eventos.settings import OWNER_WORKFLOW_TASK_SLOTS, WORKFLOW_TASK_SLOTS, WorkflowSettings


def test_the_owners_queue_shares_its_home_queues_activity_queues() -> None:
    for home in (names.WORKFLOW_QUEUE, "wf-test"):
        owner = names.owner_queue(home)
        assert owner != home
        for base in (names.LLM_QUEUES[names.C1_OWNER], names.EGRESS_QUEUE):
            assert names.queue_for(base, owner) == names.queue_for(base, home)
    assert names.queue_for(names.EGRESS_QUEUE, names.owner_queue(names.WORKFLOW_QUEUE)) == "egress"


def test_the_owners_conversation_is_the_owner_chat_not_a_users() -> None:
    assert names.owners_conversation("ann/g1/talk/main", "main")
    assert not names.owners_conversation("ann/g1/talk/u_0123456789abcdef", "u_0123456789abcdef")
    assert not names.owners_conversation("ann/g1/worker/t_0123456789abcdef", "t_0123456789abcdef")


def test_owner_slots_are_a_setting_of_their_own() -> None:
    assert WorkflowSettings.from_env({}) == WorkflowSettings(
        WORKFLOW_TASK_SLOTS, OWNER_WORKFLOW_TASK_SLOTS
    )
    env = {"EVENTOS_WORKFLOW_TASK_SLOTS": "6", "EVENTOS_OWNER_WORKFLOW_TASK_SLOTS": "3"}
    assert WorkflowSettings.from_env(env) == WorkflowSettings(6, 3)
    with pytest.raises(ConfigError, match="EVENTOS_OWNER_WORKFLOW_TASK_SLOTS"):
        WorkflowSettings.from_env({"EVENTOS_OWNER_WORKFLOW_TASK_SLOTS": "0"})


async def test_a_kick_reaches_every_fork_whoever_waits_first() -> None:
    signal = WakeSignal()
    first, second = signal.fork(), signal.fork()
    signal.set()
    assert await first.wait(1.0)
    assert await second.wait(1.0)  # the first's wait did not clear it
    assert not await asyncio.wait_for(first.wait(0.01), 1.0)  # each clears on its own
