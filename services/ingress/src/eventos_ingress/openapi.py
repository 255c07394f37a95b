"""The OpenAPI 3.1 document of the owner API (`GET /openapi.json`).

Written out rather than generated from docstrings, so every request and response body has a
component schema; a test validates the document and fuzzes every operation against it.
"""

from __future__ import annotations

from typing import Any

from eventos import names
from eventos.operator import actions
from eventos_ingress import bodies, problems

Schema = dict[str, Any]
STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
BOOL: Schema = {"type": "boolean"}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def obj(required: dict[str, Schema], optional: dict[str, Schema] | None = None) -> Schema:
    return {
        "type": "object",
        "required": sorted(required),
        "properties": {**required, **(optional or {})},
    }


INTENT_KINDS = ["start", "stop", "resume", "reset", "interrupt", "limits", "rearm"]
SCHEMAS: dict[str, Schema] = {
    "Problem": {
        **obj(
            {
                "type": {"type": "string", "format": "uri"},
                "title": STR,
                "status": INT,
                "detail": STR,
            },
            {"errors": {"type": "array", "items": ref("FieldError")}},
        ),
        "description": "RFC 9457 problem details; `type` is one of "
        + ", ".join(f"`{k.type}`" for k in problems.KINDS),
    },
    "FieldError": obj({"path": STR, "message": STR}),
    "EmployeeSpec": {
        "type": "object",
        "description": "a `kind: Employee` document",
        "additionalProperties": True,
    },
    "Applied": obj(
        {
            "applied": {
                "type": "array",
                "items": obj(
                    {"name": STR, "created": BOOL, "changed": BOOL},
                    # Flags changed: this live generation drains into a new one (docs/flags.md).
                    {"draining": INT},
                ),
            }
        }
    ),
    "IntentRef": obj({"id": INT, "kind": STR, "state": STR}),
    "Intent": obj(
        {
            "id": INT,
            "kind": STR,
            "state": {"enum": ["applying", "applied", "failed"]},
            "revision": nullable(INT),
            "outcome": nullable(STR),
            "created_at": {"type": "string", "format": "date-time"},
            "applied_at": nullable({"type": "string", "format": "date-time"}),
        }
    ),
    "Employee": obj(
        {
            "name": STR,
            "spec_sha256": STR,
            "generation": nullable(INT),
            "state": STR,
            "pause_reason": nullable(STR),
            "revision": nullable(INT),
            "limits": nullable({"type": "object"}),
            "intent": nullable(ref("IntentRef")),
        }
    ),
    "EmployeeDetail": {
        "allOf": [
            ref("Employee"),
            obj({"spec": ref("EmployeeSpec")}, {"degraded": nullable(ref("Degraded"))}),
        ]
    },
    "Degraded": obj({"since": {"type": "string", "format": "date-time"}, "reason": STR}),
    "EmployeeList": obj({"employees": {"type": "array", "items": ref("Employee")}}),
    "Requested": obj({"name": STR, "generation": INT, "state": STR, "intent": ref("Intent")}),
    "EmployeeDeleted": obj(
        {
            "name": STR,
            "deleted_at": {"type": "string", "format": "date-time"},
            "retired_generation": nullable(INT),
            "intent": nullable(ref("Intent")),
        }
    ),
    "Limits": obj({"daily_usd": {"type": "number", "exclusiveMinimum": 0}}),
    "Interrupt": obj({}, {"conversation": {**STR, "description": "`<lane>/<thread>`"}}),
    "ChatSend": obj({"client_message_id": STR, "text": STR}, {"session": STR}),
    "ChatQueued": obj({"message_id": INT, "status": STR, "duplicate": BOOL}),
    "ChatMessage": obj(
        {"message_id": INT, "status": STR, "reply": nullable(STR)},
        {
            "reply_status": {
                "type": "string",
                "enum": ["held_for_review", "declined", "expired", "failed"],
                "description": "what became of the reply while there is none to read: held "
                "for review (never its draft), declined, expired undecided, or its send failed",
            },
            "gate": {
                **nullable(ref("Gate")),
                "description": "what holds the message now (the gate `waiting` gives its "
                "input, or the approval its reply waits for); a user reads one only when it "
                "waits behind a reply held for review",
            },
            "reason": {**nullable(STR), "description": "admin only: why a dead one is dead"},
        },
    ),
    "UserCreate": obj(
        {"name": STR},
        {
            "class": {
                "type": "string",
                "enum": ["c1", "c2"],
                "description": "the chat's class: c2 (default), or c1 granted by the admin",
            },
            "daily_usd": nullable(
                {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": 100000,
                    "description": "daily spend cap per employee; default a "
                    "quarter of the employee's daily budget",
                }
            ),
        },
    ),
    "UserCreated": obj(
        {
            "name": STR,
            "id": {**STR, "description": "the user record's id (a re-created name gets a new one)"},
            "token": {**STR, "description": "shown once"},
            "class": STR,
            "daily_usd": nullable({"type": "number"}),
        }
    ),
    "User": obj(
        {
            "name": STR,
            "id": STR,
            "class": STR,
            "daily_usd": nullable({"type": "number"}),
            "created_at": {"type": "string", "format": "date-time"},
        }
    ),
    "UserList": obj({"users": {"type": "array", "items": ref("User")}}),
    "AttentionItem": obj(
        {
            "id": INT,
            "employee": STR,
            "kind": STR,
            "severity": {"enum": ["info", "warning", "error"]},
            "ref": STR,
            "detail": nullable(STR),
            "first_seen": STR,
            "last_seen": STR,
            "count": INT,
            "state": {"enum": list(names.ITEM_STATES)},
            "actions": {"type": "array", "items": STR},
        },
        {
            k: nullable(STR)
            for k in ("audience", "acked_at", "acked_by", "resolved_at", "resolved_by", "turn_id")
        },
    ),
    "AttentionPage": obj(
        {
            "attention": {"type": "array", "items": ref("AttentionItem")},
            "next_cursor": nullable(STR),
        }
    ),
    "AttentionAct": obj(
        {"action": {"enum": actions.NAMES}},
        {
            "daily_usd": {
                "type": "number",
                "exclusiveMinimum": 0,
                "description": "resume: raise the daily budget instead of a plain Resume",
            }
        },
    ),
    "AttentionActed": obj(
        {"item": INT, "action": STR},
        {
            "call": STR,
            "input": INT,
            "outbox": INT,
            "intent": ref("Intent"),
            "replayed": INT,
            "replays": {"type": "array", "items": ref("Replay")},
            "stream": STR,
            "held": INT,
            "employee": STR,
        },
    ),
    "DeadLetter": obj(
        {
            "id": {**STR, "description": "`ingress-<n>` or `delivery-<n>`"},
            "kind": {"enum": [names.LETTER_INGRESS, names.LETTER_DELIVERY]},
            "reason": {**STR, "description": "the reason's code (the metrics label)"},
            "detail": nullable(STR),
            "source": STR,
            "at": STR,
            "employee": nullable(STR),
            "stream": nullable(STR),
            "type": STR,
            "size": INT,
            "preview": {**STR, "description": "type, size and the data's key names; no content"},
            "chain_id": STR,
            "replay_of": nullable(STR),
            "replayed_at": nullable(STR),
            "replayed_as": nullable(INT),
        },
        {"turn_id": nullable(STR)},
    ),
    "DeadLetterPage": obj(
        {
            "dead_letters": {"type": "array", "items": ref("DeadLetter")},
            "next_cursor": nullable(STR),
        }
    ),
    "ReplaySelector": {
        **obj(
            {},
            {
                "ids": {"type": "array", "items": STR, "minItems": 1, "maxItems": 1000},
                **{k: STR for k in ("reason", "source", "employee", "since", "until")},
            },
        ),
        "additionalProperties": False,
        "description": "dead letters by id, or by reason, source, employee and time; at most 1,000",
    },
    "ReplayRequest": {
        **obj({"selector": ref("ReplaySelector")}, {"confirmation": STR}),
        "additionalProperties": False,
    },
    "ReplayPreview": obj(
        {
            "count": INT,
            "sample": {"type": "array", "items": ref("DeadLetter")},
            "already_replayed": INT,
            "confirmation": nullable(STR),
            "expires_at": nullable(STR),
        }
    ),
    "Replay": obj({"id": STR, "as": {**INT, "description": "the new ingress row"}}),
    "ReplayDone": obj(
        {
            "replayed": INT,
            "already_replayed": INT,
            "replays": {"type": "array", "items": ref("Replay")},
            "already": {"type": "array", "items": STR},
        }
    ),
    "OutboxRow": obj(
        {
            "id": INT,
            "employee": STR,
            "thread": STR,
            "turn_id": STR,
            "kind": STR,
            "class": INT,
            "status": STR,
            "created_at": STR,
            "updated_at": STR,
        },
        {
            k: {"type": ["string", "null"]}
            for k in (
                "account",
                "held_reason",
                "error",
                "provider_message_id",
                "provider_called_at",
                "retry_requested_at",
            )
        }
        | {"receipt": {"type": ["object", "null"]}},
    ),
    "OutboxPage": obj(
        {
            "outbox": {"type": "array", "items": {"$ref": "#/components/schemas/OutboxRow"}},
            "next_before": {"type": ["integer", "null"]},
        }
    ),
    "OperatorEvent": {
        **obj(
            {
                "pos": INT,
                "at": {"type": "string", "format": "date-time"},
                "kind": {
                    "enum": sorted(k for ks in names.OPERATOR_EVENT_KINDS.values() for k in ks)
                },
                "employee": STR,
                "ref": STR,
                "state": nullable(STR),
                "detail": {"type": "object"},
            }
        ),
        "description": "the data of one event of `GET /v1/events`: ids, kinds, states and "
        "names, never message text",
    },
    "Approval": obj(
        {"id": STR, "employee": STR, "state": STR, "expires_at": STR},
        {
            k: {"type": ["string", "null"]}
            for k in (
                "thread",
                "kind",
                "channel",
                "draft",
                "send_status",
                "decided_at",
                "decided_by",
                "taken_at",
                "created_at",
                "turn_id",
                "rule",
            )
        },
    ),
    "ApprovalList": obj(
        {"approvals": {"type": "array", "items": {"$ref": "#/components/schemas/Approval"}}}
    ),
    "OutboxRetried": obj({"id": INT, "status": STR, "retry": {"type": "boolean"}}),
    "TimelineEntry": obj(
        {
            "id": INT,
            "at": {"type": "string", "format": "date-time"},
            "kind": {
                **STR,
                "description": "`<family>.<what>`: input, turn, reply, alarm, task, "
                "tool, attention (docs/timeline.md)",
            },
            "chain_id": nullable(STR),
            "chains": {"type": "array", "items": STR},
            "thread": nullable(STR),
            "summary": {**STR, "description": "what happened, in words; never message text"},
            "ref": nullable(STR),
            "detail": {"type": "object"},
        }
    ),
    "TimelinePage": obj(
        {
            "timeline": {"type": "array", "items": ref("TimelineEntry")},
            "next_cursor": nullable(STR),
            "follow_cursor": {**STR, "description": "asks later for what happened since"},
            "as_of": {"type": "string", "format": "date-time"},
        }
    ),
    "Gate": obj(
        {
            "code": STR,
            "text": STR,
            "until": nullable({"type": "string", "format": "date-time"}),
        },
        {"approval": {**STR, "description": "the approval it waits for (or its turn acts on)"}},
    ),
    "WaitingInput": obj(
        {
            "stream": nullable(STR),
            "thread": nullable(STR),
            "lane": nullable(STR),
            "seq": nullable(INT),
            "class": nullable(INT),
            "since": {"type": "string", "format": "date-time"},
            "status": STR,
            "ref": STR,
            "input": STR,
            "gate": ref("Gate"),
        }
    ),
    "WaitingList": obj(
        {
            "waiting": {"type": "array", "items": ref("WaitingInput")},
            "more": INT,
            "as_of": nullable({"type": "string", "format": "date-time"}),
        }
    ),
}

# The web console's reads (console_api.py).
NUM: Schema = {"type": "number"}
TIME: Schema = {"type": "string", "format": "date-time"}
CURSOR: Schema = nullable({**STR, "description": "pass as `?cursor=` for the next page"})


def _page_of(key: str, item: str) -> Schema:
    return obj({key: {"type": "array", "items": ref(item)}, "next_cursor": CURSOR})


SCHEMAS |= {
    "Me": obj({"name": STR, "admin": BOOL, "chat": {"type": "array", "items": STR}}),
    "Counts": obj(
        {
            "attention_open": INT,
            "approvals_pending": INT,
            "outbox_unknown": nullable(INT),
            "cap": INT,
        }
    ),
    "Budget": obj(
        {"daily_usd": nullable(NUM), "spent_usd": NUM, "reserved_usd": NUM, "state": STR}
    ),
    "EmployeeSummary": obj(
        {
            "name": STR,
            "state": STR,
            "pause_reason": nullable(STR),
            "generation": nullable(INT),
            "budget": ref("Budget"),
            "pending": {
                "type": "object",
                "additionalProperties": INT,
                "description": "inputs not yet consumed by class (`C1` …)",
            },
            "pending_capped": BOOL,
            "attention_open": INT,
        }
    ),
    "EmployeeSummaryPage": _page_of("employee_summaries", "EmployeeSummary"),
    "Conversation": obj(
        {
            "generation": INT,
            "agent": STR,
            "thread": STR,
            "lane": STR,
            "turns": INT,
            "updated_at": TIME,
            "transcript_messages": INT,
            "unconsumed": INT,
            "hold_reason": nullable(STR),
        }
    ),
    "ConversationPage": _page_of("conversations", "Conversation"),
    "TurnStep": obj(
        {"kind": {"enum": ["llm", "tool"]}, "at": TIME},
        {
            "model": STR,
            "state": STR,
            "input_tokens": nullable(INT),
            "output_tokens": nullable(INT),
            "usd": NUM,
            "name": STR,
            "effect": STR,
            "status": STR,
            "outcome": nullable(STR),
            "ended_at": nullable(TIME),
            "duration_s": nullable(NUM),
            "step": nullable(INT),
            "attempts": INT,
        },
    ),
    "Turn": obj(
        {
            "id": STR,
            "generation": INT,
            "agent": STR,
            "thread": STR,
            "n": INT,
            "class": INT,
            "status": STR,
            "started_at": TIME,
            "ended_at": nullable(TIME),
            "error": nullable(STR),
            "admission_wait_s": nullable(NUM),
            "cost_usd": NUM,
            "input_tokens": INT,
            "output_tokens": INT,
            "steps": {"type": "array", "items": ref("TurnStep")},
            "steps_capped": BOOL,
        }
    ),
    "TurnPage": _page_of("turns", "Turn"),
    "TranscriptMessage": obj(
        {
            "n": INT,
            "role": nullable(STR),
            "content": STR,
            "tool_calls": {
                "type": "array",
                "items": obj({"id": nullable(STR), "name": nullable(STR), "arguments": STR}),
            },
            "tool_call_id": nullable(STR),
            "name": nullable(STR),
            "truncated": BOOL,
        }
    ),
    "Transcript": obj(
        {
            "turn": ref("Turn"),
            "messages": {"type": "array", "items": ref("TranscriptMessage")},
            "messages_capped": BOOL,
        }
    ),
    "ChatHistoryMessage": obj(
        {
            "message_id": INT,
            "text": STR,
            "status": STR,
            "reply": nullable(STR),
            "reply_status": nullable(
                {"type": "string", "enum": ["held_for_review", "declined", "expired", "failed"]}
            ),
            "created_at": TIME,
        }
    ),
    "ChatHistory": obj(
        {
            "messages": {"type": "array", "items": ref("ChatHistoryMessage")},
            "next_cursor": CURSOR,
            "last_event_id": {**INT, "description": "the chat event stream's `after`"},
        }
    ),
}

COMMON = {
    "400": "a malformed request; `errors` names each bad field (`(body)` for the whole body)",
    "401": "no valid bearer token",
    "403": "a user token on an admin-only operation",
    "413": "the body is over the operation's cap",
    "503": "the database is unavailable; `Retry-After` says when to ask again",
}
NAME = {"name": "name", "in": "path", "required": True, "schema": STR}


def _json(schema: Schema) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {problems.MEDIA_TYPE: {"schema": ref("Problem")}},
    }


def op(
    summary: str,
    ok: tuple[int, str, str | None],
    *,
    errors: dict[str, str] | None = None,
    body: str | None = None,
    params: list[dict[str, Any]] | None = None,
    cap: int = bodies.JSON_BODY_MAX,
) -> dict[str, Any]:
    """One operation: its success answer (status, description, schema) and its refusals."""
    status, description, schema = ok
    responses: dict[str, Any] = {str(status): {"description": description}}
    if schema is not None:
        responses[str(status)]["content"] = _json(ref(schema))
    for code, text in {**COMMON, **(errors or {})}.items():
        responses[code] = _problem(text)
    doc: dict[str, Any] = {"summary": summary, "responses": responses, "x-body-cap-bytes": cap}
    if params:
        doc["parameters"] = params
    if body is not None:
        doc["requestBody"] = {"required": True, "content": _json(ref(body))}
    return doc


def _lifecycle(action: str, what: str) -> dict[str, Any]:
    errors = {"404": "no such employee", "409": "the employee's state does not allow it"}
    if action == "interrupt":
        errors["404"] = "no such employee or conversation"
        return {
            "post": {
                **op(
                    what,
                    (202, "committed, with its intent", "Requested"),
                    errors=errors,
                    params=[NAME],
                ),
                "requestBody": {"required": False, "content": _json(ref("Interrupt"))},
            }
        }
    return {
        "post": op(
            what, (202, "committed, with its intent", "Requested"), errors=errors, params=[NAME]
        )
    }


def events_paths() -> dict[str, Any]:
    """The operator event stream (docs/events.md)."""
    kinds = ", ".join(f"`{f}`" for f in names.OPERATOR_EVENT_KINDS)
    params = [
        {"name": "Last-Event-ID", "in": "header", "schema": STR,
         "description": "the place read last (a reconnect): every event after it, once"},
        {"name": "after", "in": "query", "schema": {"type": "integer", "minimum": 0},
         "description": "as Last-Event-ID, for clients that cannot set it; neither: from now"},
        {"name": "employee", "in": "query", "schema": STR, "description": "one employee's"},
        {"name": "kind", "in": "query", "schema": STR,
         "description": f"kinds or families ({kinds}), comma-separated"},
    ]  # fmt: skip
    get = op(
        "State changes as server-sent events (a user: its own audience's); each event's `id` "
        "is its place, its `event` its kind, its `data` an OperatorEvent",
        (200, "a text/event-stream", None),
        errors={"400": "a bad filter, or a Last-Event-ID ahead of the stream",
                "410": "events after that Last-Event-ID are past the retention"},
        params=params,
    )  # fmt: skip
    get["responses"]["200"]["content"] = {"text/event-stream": {"schema": STR}}
    return {"/v1/events": {"get": get}}


def attention_paths(item_id: dict[str, Any]) -> dict[str, Any]:
    """Attention items: the list, one item, and :ack, :resolve, :act."""
    item = [{**item_id, "name": "item_id"}]
    missing = {"404": "no such attention item for this caller"}
    query = [{"name": k, "in": "query", "schema": STR} for k in ("state", "employee", "kind")]
    page = [{"name": "cursor", "in": "query", "schema": STR},
            {"name": "limit", "in": "query", "schema": INT}]  # fmt: skip
    resolved = {**missing, "409": "the item is resolved"}
    return {
        "/v1/attention": {
            "get": op(
                "Attention items newest first (a user: their own audience's); `state` takes "
                "open, acked, resolved, or several comma-separated",
                (200, "a page of items; `next_cursor` asks for the next", "AttentionPage"),
                params=query + page,
            )
        },
        "/v1/attention/{item_id}": {
            "get": op(
                "One attention item",
                (200, "the item", "AttentionItem"),
                errors=missing,
                params=item,
            )
        },
        "/v1/attention/{item_id}:ack": {
            "post": op(
                "Acknowledge an item: listed as acked until resolved; repeats count on it",
                (200, "the item", "AttentionItem"),
                errors=resolved,
                params=item,
            )
        },
        "/v1/attention/{item_id}:resolve": {
            "post": op(
                "Resolve an item by hand",
                (200, "the item", "AttentionItem"),
                errors=resolved,
                params=item,
            )
        },
        "/v1/attention/{item_id}:act": {
            "post": op(
                "Take one of the item's `actions`: resume, reset, replay (its dead inputs, no "
                "confirmation needed), retry (an unknown tool call or send)",
                (202, "committed: what the action did", "AttentionActed"),
                errors={
                    **missing,
                    "409": "the item is resolved, offers no such action to this "
                    "caller, or its action cannot be taken now",
                },
                body="AttentionAct",
                params=item,
            )
        },
    }


def dead_letter_paths() -> dict[str, Any]:
    """Dead letters and replay (admin only)."""
    filters = [
        {"name": k, "in": "query", "schema": STR}
        for k in ("reason", "source", "employee", "since", "until", "replayed", "cursor")
    ]
    replay = op(
        "Replay dead letters: the selector alone answers what it would replay and a "
        "confirmation (200); the selector with that confirmation replays (202)",
        (200, "what the selector would replay", "ReplayPreview"),
        errors={
            "409": "the confirmation expired, was altered or does not match what the "
            "selector matches"
        },
        body="ReplayRequest",
    )
    replay["responses"]["202"] = {"description": "replayed",
                                  "content": _json(ref("ReplayDone"))}  # fmt: skip
    return {
        "/v1/dead-letters": {
            "get": op(
                "Dead ingress rows and deliveries newest first, never their content",
                (200, "a page of dead letters", "DeadLetterPage"),
                params=[*filters, {"name": "limit", "in": "query", "schema": INT}],
            )
        },
        "/v1/replay": {"post": replay},
    }


def paths() -> dict[str, Any]:
    """Every /v1/ operation."""
    employee = {"404": "no such employee"}
    apply = op(
        "Apply employee specs",
        (200, "applied", "Applied"),
        errors={"409": "a webhook path is already used by another employee"},
        cap=bodies.APPLY_BODY_MAX,
    )
    apply["requestBody"] = {
        "required": True,
        "content": {
            "application/json": {"schema": ref("EmployeeSpec")},
            "application/yaml": {"schema": {"type": "string", "description": "one or more specs"}},
        },
    }
    after = {"name": "after", "in": "query", "required": False, "schema": INT}
    session = {"name": "session", "in": "query", "required": False, "schema": STR}
    message_id = {
        "name": "message_id",
        "in": "path",
        "required": True,
        "schema": {"type": "integer", "minimum": 0},
    }
    intent_id = {**message_id, "name": "intent_id"}

    out: dict[str, Any] = {
        "/v1/employees": {
            "post": apply,
            "get": op(
                "Every employee with its live generation", (200, "the employees", "EmployeeList")
            ),
        },
        "/v1/employees/{name}": {
            "get": op(
                "One employee with its spec",
                (200, "the employee", "EmployeeDetail"),
                errors=employee,
                params=[NAME],
            ),
            "delete": op(
                "Delete an employee with no live generation (admin only): it leaves every list, "
                "its webhook paths and sources are freed, its history stays for its retention; "
                "a paused generation is retired with a Reset intent; applying the name again "
                "makes a fresh employee",
                (200, "deleted", "EmployeeDeleted"),
                errors={
                    **employee,
                    "409": "the employee is starting or running: stop it first "
                    "(`eventosctl stop NAME`), then delete",
                },
                params=[NAME],
            ),
        },
        "/v1/employees/{name}/limits": {
            "post": op(
                "Replace the live generation's limits",
                (202, "committed, with its intent", "Requested"),
                errors={**employee, "409": "the employee has no live generation"},
                body="Limits",
                params=[NAME],
            )
        },
        "/v1/employees/{name}/chat": {
            "post": op(
                "Send a chat message as the caller (202, queued)",
                (202, "queued", "ChatQueued"),
                errors={
                    **employee,
                    "409": "the employee is not started, or takes no chat (no chat trigger)",
                    "429": "queue_full: 100 messages pending in the session; nothing saved",
                },
                body="ChatSend",
                params=[NAME],
            )
        },
        "/v1/employees/{name}/chat/{message_id}": {
            "get": op(
                "One of the caller's chat messages with its reply",
                (200, "the message", "ChatMessage"),
                errors={"404": "no such message for this caller"},
                params=[NAME, message_id],
            )
        },
        "/v1/employees/{name}/chat/events": {
            "get": {
                **op(
                    "Server-sent events of the caller's chat session: run.start, run.input_merged, "
                    "reply",
                    (200, "a text/event-stream", None),
                    errors=employee,
                    params=[NAME, session, after],
                )
            }
        },
        "/v1/employees/{name}/timeline": {
            "get": op(
                "What happened to an employee's work, a page at a time (admin only)",
                (200, "a page of entries; `next_cursor` asks for the next", "TimelinePage"),
                errors=employee,
                params=[
                    NAME,
                    *(
                        {"name": k, "in": "query", "schema": STR}
                        for k in ("chain", "thread", "kind", "since", "until", "cursor")
                    ),
                    {"name": "order", "in": "query", "schema": {"enum": ["newest", "oldest"]}},
                    {"name": "limit", "in": "query", "schema": INT},
                ],
            )
        },
        "/v1/employees/{name}/waiting": {
            "get": op(
                "Every input not consumed yet, with the gate holding it (admin only)",
                (
                    200,
                    "the inputs, oldest first; `more` says how many were left out",
                    "WaitingList",
                ),
                errors=employee,
                params=[NAME, {"name": "limit", "in": "query", "schema": INT}],
            )
        },
        "/v1/intents/{intent_id}": {
            "get": op(
                "One intent",
                (200, "the intent", "Intent"),
                errors={"404": "no such intent"},
                params=[intent_id],
            )
        },
        "/v1/rearm": {
            "post": op("Re-arm Temporal from the database", (202, "the re-arm intent", "Intent"))
        },
        "/v1/users": {
            "post": op(
                "Create a user (admin only); its token is shown once",
                (201, "the user and its token", "UserCreated"),
                errors={"409": "the name is taken"},
                body="UserCreate",
            ),
            "get": op("Every user (admin only)", (200, "the users", "UserList")),
        },
        **events_paths(),
        **attention_paths(intent_id),
        **dead_letter_paths(),
        "/v1/approvals": {
            "get": op(
                "Approvals newest first, each with its held draft (a user: their own)",
                (200, "the approvals", "ApprovalList"),
                params=[
                    {"name": "state", "in": "query", "schema": STR},
                    {"name": "employee", "in": "query", "schema": STR},
                ],
            )
        },
        "/v1/approvals/{approval_id}": {
            "get": op(
                "One approval with its held draft",
                (200, "the approval", "Approval"),
                errors={"404": "no such approval for this caller"},
                params=[{"name": "approval_id", "in": "path", "required": True, "schema": STR}],
            )
        },
        "/v1/approvals/{approval_id}:approve": {
            "post": op(
                "Approve: the decision is committed, its workflow nudged, the send follows",
                (202, "the approval as decided", "Approval"),
                errors={"404": "no such approval for this caller", "409": "not pending"},
                params=[{"name": "approval_id", "in": "path", "required": True, "schema": STR}],
            )
        },
        "/v1/approvals/{approval_id}:decline": {
            "post": op(
                "Decline: the decision is committed; the held send is never made",
                (202, "the approval as decided", "Approval"),
                errors={"404": "no such approval for this caller", "409": "not pending"},
                params=[{"name": "approval_id", "in": "path", "required": True, "schema": STR}],
            )
        },
        "/v1/outbox": {
            "get": op(
                "The outbox, newest first; never a recipient or a body (admin only)",
                (200, "a page of rows; `next_before` asks for the next", "OutboxPage"),
                params=[
                    {"name": "status", "in": "query", "schema": STR},
                    {"name": "employee", "in": "query", "schema": STR},
                    {"name": "before", "in": "query", "schema": INT},
                    {"name": "limit", "in": "query", "schema": INT},
                ],
            )
        },
        "/v1/outbox/{id}:retry": {
            "post": op(
                "Send an `unknown` or `failed` row once more (admin only)",
                (202, "queued: the egress sends it once", "OutboxRetried"),
                errors={"404": "no such row", "409": "the row is not unknown or failed"},
                params=[{**intent_id, "name": "id"}],
            )
        },
        "/v1/users/{name}": {
            "delete": op(
                "Remove a user: its token stops working (admin only)",
                (204, "removed", None),
                errors={"404": "no such user"},
                params=[{**NAME, "description": "a user name"}],
            )
        },
    }
    for path, item in _console_paths(employee).items():
        out.setdefault(path, {}).update(item)
    events = out["/v1/employees/{name}/chat/events"]["get"]
    events["responses"]["200"]["content"] = {"text/event-stream": {"schema": STR}}
    for action, what in [
        ("start", "Start a new generation"),
        ("stop", "Pause it"),
        ("resume", "Resume it"),
        ("reset", "Retire it"),
        ("interrupt", "Interrupt a conversation's running turn"),
    ]:
        out[f"/v1/employees/{{name}}:{action}"] = _lifecycle(action, what)
    return out


def _console_paths(employee: dict[str, str]) -> dict[str, Any]:
    """The web console's reads (console_api.py)."""
    page = [
        {"name": "cursor", "in": "query", "required": False, "schema": STR},
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": 200},
        },
    ]
    thread = {"name": "thread", "in": "query", "required": False, "schema": STR}
    session = {"name": "session", "in": "query", "required": False, "schema": STR}
    turn = {"name": "turn_id", "in": "path", "required": True, "schema": STR}
    return {
        "/v1/me": {
            "get": op(
                "Who this token is, and the employees it may chat with", (200, "the caller", "Me")
            )
        },
        "/v1/counts": {
            "get": op(
                "What waits for the caller, counted up to `cap` each: attention items open, "
                "approvals pending, outbox rows `unknown` (null for a user)",
                (200, "the counts", "Counts"),
            )
        },
        "/v1/employee-summaries": {
            "get": op(
                "Employees by name: state, generation, budget, pending inputs by class, open "
                "attention items (admin only)",
                (200, "a page of employees", "EmployeeSummaryPage"),
                params=page,
            )
        },
        "/v1/employees/{name}/conversations": {
            "get": op(
                "An employee's conversations, newest generation first (admin only)",
                (200, "a page of conversations", "ConversationPage"),
                errors=employee,
                params=[NAME, *page],
            )
        },
        "/v1/employees/{name}/turns": {
            "get": op(
                "An employee's turns newest first, with their steps and cost (admin only)",
                (200, "a page of turns", "TurnPage"),
                errors=employee,
                params=[NAME, thread, *page],
            )
        },
        "/v1/employees/{name}/turns/{turn_id}": {
            "get": op(
                "One turn with its steps (durations, attempts), cost and error (admin only)",
                (200, "the turn", "Turn"),
                errors={"404": "no such employee or turn"},
                params=[NAME, turn],
            )
        },
        "/v1/employees/{name}/turns/{turn_id}/transcript": {
            "get": op(
                "What the model was asked and answered in a turn (admin only, and only with "
                "EVENTOS_CONSOLE_TRANSCRIPTS on; each view is recorded on the timeline)",
                (200, "the turn's transcript messages", "Transcript"),
                errors={
                    "403": "a user token, or transcript views are off on this instance",
                    "404": "no such employee or turn",
                },
                params=[NAME, turn],
            )
        },
        "/v1/employees/{name}/chat": {
            "get": op(
                "The caller's own messages in a session, newest first, with their replies",
                (200, "a page of messages", "ChatHistory"),
                errors=employee,
                params=[NAME, session, *page],
            )
        },
    }


def document() -> dict[str, Any]:
    """The whole document."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "Event OS owner API", "version": "1"},
        "paths": paths(),
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
