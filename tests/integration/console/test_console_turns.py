"""A turn as the console reads it, on the real stack (the ingress, workers on the dev server,
PostgreSQL): one turn with its steps (durations, attempts, model, tokens, cost), and the
admin-only, opt-in transcript view of what the model was asked and answered: off by default
(403 problem+json saying how to turn it on), never a user's, and every view on the employee's
timeline (who, when)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from channel_stack import Stack, egress_running, telegram_stack
from conftest import E2E_TIMEOUT_S
from psycopg_pool import AsyncConnectionPool

from eventos.console.settings import TRANSCRIPTS_VAR, ConsoleSettings
from eventos.db import Conn
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox.keys import OutboxKeys
from eventos.settings import DatabaseSettings, TemporalSettings
from eventos.testing import wait_for

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

CHAT = "    - {kind: chat}\n"


@pytest.fixture
def stack_of(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> Any:  # fmt: skip
    """The Telegram stack with owner chat, its ingress with these console settings."""

    @contextlib.asynccontextmanager
    async def make(console: ConsoleSettings, tools: tuple[str, ...] = ()) -> AsyncIterator[Stack]:
        async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                                  llm_endpoints, spec_extra=CHAT, tools=tools,
                                  console=console) as s:  # fmt: skip
            yield s

    return make


async def answered_turn(s: Stack, text: str) -> str:
    """Chat `text` to the stack's employee; the id of the turn that answered it."""
    doc = {"client_message_id": uuid.uuid4().hex, "text": text}
    sent = await s.api.post(f"/v1/employees/{s.name}/chat", json=doc)
    assert sent.status_code == 202, sent.text
    message = sent.json()["message_id"]

    async def reply() -> str | None:
        r = await s.api.get(f"/v1/employees/{s.name}/chat/{message}")
        return r.json()["reply"]  # type: ignore[no-any-return]

    async with egress_running(s):
        await wait_for(reply, timeout=60, interval=0.2, what="the reply")
    turns = (await s.api.get(f"/v1/employees/{s.name}/turns")).json()["turns"]
    return str(turns[0]["id"])


async def viewed(s: Stack) -> list[dict[str, Any]]:
    r = await s.api.get(f"/v1/employees/{s.name}/timeline", params={"kind": "transcript"})
    assert r.status_code == 200, r.text
    return list(r.json()["timeline"])


async def new_user(s: Stack, name: str) -> str:
    r = await s.api.post("/v1/users", json={"name": name})
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


async def test_a_turn_shows_its_steps_with_durations_attempts_model_tokens_and_cost(
    stack_of: Any,
) -> None:
    async with stack_of(ConsoleSettings()) as s:
        turn_id = await answered_turn(s, "count my steps")
        r = await s.api.get(f"/v1/employees/{s.name}/turns/{turn_id}")
        assert r.status_code == 200, r.text
        turn = r.json()
        assert turn["id"] == turn_id and turn["status"] == "done" and turn["error"] is None
        (step,) = [x for x in turn["steps"] if x["kind"] == "llm"]
        assert step["model"] == "local/scripted" and step["state"] == "settled"
        assert step["step"] == 0 and step["attempts"] == 1  # `step-0`, as the activity id
        assert step["duration_s"] is not None and step["duration_s"] >= 0
        assert step["ended_at"] is not None
        assert step["input_tokens"] > 0 and step["output_tokens"] > 0
        assert turn["cost_usd"] == step["usd"] > 0
        missing = await s.api.get(f"/v1/employees/{s.name}/turns/turn-nobody-1")
        assert missing.status_code == 404
        assert missing.headers["content-type"] == "application/problem+json"


async def test_transcripts_are_off_by_default_and_say_how_to_turn_them_on(
    stack_of: Any,
) -> None:
    async with stack_of(ConsoleSettings()) as s:
        turn_id = await answered_turn(s, "nobody reads this")
        r = await s.api.get(f"/v1/employees/{s.name}/turns/{turn_id}/transcript")
        assert r.status_code == 403, r.text
        assert r.headers["content-type"] == "application/problem+json"
        problem = r.json()
        assert problem["status"] == 403 and TRANSCRIPTS_VAR in problem["detail"]
        assert "nobody reads this" not in r.text
        assert await viewed(s) == []  # nothing was shown, so nothing is recorded


async def test_a_transcript_is_the_admins_alone_and_every_view_is_on_the_timeline(
    stack_of: Any,
) -> None:
    async with stack_of(ConsoleSettings(transcripts=True)) as s:
        turn_id = await answered_turn(s, "what did you hear")
        path = f"/v1/employees/{s.name}/turns/{turn_id}/transcript"
        token = await new_user(s, "carol")
        refused = await s.api.get(path, headers={"Authorization": f"Bearer {token}"})
        assert refused.status_code == 403, refused.text
        assert "what did you hear" not in refused.text
        assert await viewed(s) == []

        r = await s.api.get(path)
        assert r.status_code == 200, r.text
        assert r.headers["cache-control"] == "no-store"  # message text: no cache keeps it
        doc = r.json()
        assert doc["turn"]["id"] == turn_id and doc["messages_capped"] is False
        roles = [m["role"] for m in doc["messages"]]
        assert roles[0] == "user" and roles[-1] == "assistant", roles
        assert "what did you hear" in doc["messages"][0]["content"]  # what it was asked
        assert "you said: what did you hear" in doc["messages"][-1]["content"]  # its answer
        (entry,) = await viewed(s)
        assert entry["kind"] == "transcript.viewed" and entry["ref"] == turn_id
        assert entry["summary"] == f"transcript of turn {doc['turn']['n']} viewed by owner"
        assert entry["detail"]["by"] == "owner" and entry["at"]
        assert "what did you hear" not in str(entry)  # the entry says who and when, no text

        await s.api.get(path)
        assert len(await viewed(s)) == 2  # each view is recorded
        missing = await s.api.get(f"/v1/employees/{s.name}/turns/turn-nobody-1/transcript")
        assert missing.status_code == 404
        assert len(await viewed(s)) == 2


async def test_a_retried_model_call_counts_its_attempts(stack_of: Any) -> None:
    async with stack_of(ConsoleSettings()) as s:
        turn_id = await answered_turn(s, "try twice\nfail: 500 1")  # the first attempt fails
        turn = (await s.api.get(f"/v1/employees/{s.name}/turns/{turn_id}")).json()
        (step,) = [x for x in turn["steps"] if x["kind"] == "llm"]
        assert step["attempts"] == 2 and step["state"] == "settled", step
        assert step["output_tokens"] > 0 and step["duration_s"] is not None


async def test_a_tool_call_is_a_step_with_its_duration_and_attempts(stack_of: Any) -> None:
    async with stack_of(ConsoleSettings(), tools=("set_alarm",)) as s:
        args = json.dumps({"text": "water the plants", "in_s": 3600})
        turn_id = await answered_turn(s, f"remind me\ncall: set_alarm {args}")
        turn = (await s.api.get(f"/v1/employees/{s.name}/turns/{turn_id}")).json()
        kinds = [x["kind"] for x in turn["steps"]]
        assert kinds == ["llm", "tool", "llm"], kinds  # in the order they happened
        tool = turn["steps"][1]
        assert tool["name"] == "set_alarm" and tool["status"] == "done" and tool["attempts"] == 1
        assert tool["duration_s"] is not None and tool["ended_at"] is not None
        assert [x["step"] for x in turn["steps"] if x["kind"] == "llm"] == [0, 1]
        assert "water the plants" not in str(turn)  # never the arguments or the result


async def test_a_dead_letter_and_its_attention_item_name_the_failed_turn(stack_of: Any) -> None:
    async with stack_of(ConsoleSettings()) as s:
        doc = {"client_message_id": uuid.uuid4().hex, "text": "refuse me\nfail: 400"}
        sent = await s.api.post(f"/v1/employees/{s.name}/chat", json=doc)
        assert sent.status_code == 202, sent.text

        async def letter() -> dict[str, Any] | None:
            r = await s.api.get("/v1/dead-letters", params={"employee": s.name})
            rows = r.json()["dead_letters"]
            return rows[0] if rows else None

        async with egress_running(s):
            dead = await wait_for(letter, timeout=120, interval=0.2, what="the dead letter")
        turn_id = dead["turn_id"]
        assert turn_id, dead
        turn = (await s.api.get(f"/v1/employees/{s.name}/turns/{turn_id}")).json()
        assert turn["status"] == "failed" and turn["error"]
        items = (await s.api.get("/v1/attention", params={"employee": s.name,
                                                          "kind": "dead_input"})).json()  # fmt: skip
        (item,) = items["attention"]
        assert item["turn_id"] == turn_id
