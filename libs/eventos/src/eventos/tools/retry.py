"""Retry, the action of a `tool_unknown` attention item (SPEC §11): the owner checked the
outside world and asks for the call to be made once more.

The request commits an input into the thread that made the call (source `tool:<employee>`,
dedupe `retry:<item>`, so asking twice retries once); the attention handler
(`eventos.operator.attention`) resolves the item in the same transaction. The turn that
takes the input runs the call again under a new id (`retry_of` the unknown one, under the same
`unknown` rule) and the employee reads what it returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eventos import names
from eventos.bus.envelope import encoded_size, new_event_id
from eventos.bus.inbox import Accepted, Duplicate, IngressRecord, append
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.errors import Conflict


@dataclass(frozen=True)
class RetryRequested:
    item_id: int
    call: str  # the unknown call's key
    ingress_id: int


def retry_record(call: dict[str, Any], item_id: int) -> IngressRecord:
    """The input that asks the call's thread to run it again."""
    event_id = new_event_id()
    data = {"retry_of": call["id"], "name": call["name"], "arguments": call["arguments"],
            "text": f"[the owner asked to run your {call['name']} call again]"}  # fmt: skip
    envelope = {
        "specversion": "1.0", "id": event_id, "source": f"/employees/{call['employee']}/tools",
        "type": names.TYPE_TOOL_RETRY, "subject": call["id"],
        "datacontenttype": "application/json", "data": data,
        names.ATTR_LANE: call["lane"], names.ATTR_THREAD: call["thread"],
        names.ATTR_ROUTE: call["route"],
    }  # fmt: skip
    return IngressRecord(
        source_key=names.source_key(names.SOURCE_TOOL, call["employee"]),
        dedupe_key=f"retry:{item_id}", type=names.TYPE_TOOL_RETRY, chain_id=event_id,
        envelope=envelope, size=encoded_size(envelope), klass=names.C3_INTERNAL,
    )  # fmt: skip


async def request_retry(conn: Conn, item: Mapping[str, Any]) -> RetryRequested:
    """Retry the call of a `tool_unknown` item (locked by the caller, who settles it):
    Conflict unless the call is still unknown."""
    cur = await conn.execute(Q["tool_call_get"], {"id": item["ref"]})
    call = await cur.fetchone()
    if call is None or call["status"] != names.TOOL_UNKNOWN:
        raise Conflict(f"call {item['ref']} is not unknown")
    item_id = int(item["id"])
    (outcome,) = await append(conn, [retry_record(dict(call), item_id)])
    if not isinstance(outcome, Accepted | Duplicate):
        raise Conflict(f"the retry of {item['ref']} was not taken: {outcome}")
    return RetryRequested(item_id, str(item["ref"]), outcome.id)
