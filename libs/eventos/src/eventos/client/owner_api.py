"""A small synchronous client of the owner API (SPEC §17 HTTP), used by `eventosctl` and `make run`.

Transport failures and refusals are translated once, here, into two errors the callers print.
"""

from __future__ import annotations

import functools
import json
import ssl
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from eventos.client.sse import Block, Parser
from eventos.errors import EventOSError

# A stream sends a keep-alive every 15 quiet seconds: silence past this is a dead connection.
STREAM_SILENCE_S = 45.0


class InstanceUnreachable(EventOSError):
    """No instance answers."""

    def __init__(self, url: str, message: str | None = None):
        self.url = url
        super().__init__(message or f"no instance answers at {url}")


class InstanceTimeout(InstanceUnreachable):
    """The instance did not answer in time."""


class StreamDropped(EventOSError):
    """The event stream's connection dropped."""


class OwnerApiError(EventOSError):
    """The owner API refused the request."""

    def __init__(self, status: int, message: str, errors: list[tuple[str, str]] | None = None):
        self.status = status
        self.errors = errors or []
        super().__init__(message)


def _refusal(response: httpx.Response) -> OwnerApiError:
    try:
        doc = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    errors = [(str(e.get("path")), str(e.get("message"))) for e in doc.get("errors") or []]
    # A problem (RFC 9457): with field errors the title says it all, the fields follow.
    message = str(doc.get("title" if errors else "detail") or response.reason_phrase or "refused")
    return OwnerApiError(response.status_code, message, errors)


Rows = list[dict[str, Any]]


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's CAs), made once a process: loading the CA bundle
    took two thirds of a CLI command against a local instance, for every client made."""
    return httpx.create_ssl_context()


@dataclass
class OwnerClient:
    """The owner API of one instance: its base URL and bearer token."""

    url: str
    token: str = field(repr=False)
    timeout_s: float = 10.0
    # One connection for every call (a CLI command or `make run` applying many employees).
    _http: httpx.Client = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._http = httpx.Client(timeout=self.timeout_s, verify=tls_context())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OwnerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self, method: str, path: str, *, content: bytes | None = None, content_type: str = ""
    ) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            response = self._http.request(
                method, self.url.rstrip("/") + path, content=content, headers=headers
            )
        except httpx.ConnectError:
            raise InstanceUnreachable(self.url) from None
        except httpx.TimeoutException:
            message = f"the instance at {self.url} did not answer within {self.timeout_s:g}s"
            raise InstanceTimeout(self.url, message) from None
        if response.status_code >= 400:
            raise _refusal(response)
        if response.status_code == 204:
            return None
        return response.json()

    def stream(self, path: str, params: dict[str, str], last_id: str | None) -> Iterator[Block]:
        """The blocks of a server-sent event stream, from after `last_id` (Last-Event-ID);
        StreamDropped when its connection drops or goes silent, InstanceUnreachable when it
        cannot connect."""
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream"}
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        timeout = httpx.Timeout(self.timeout_s, read=STREAM_SILENCE_S)
        url = self.url.rstrip("/") + path
        try:
            with self._http.stream("GET", url, params=params, headers=headers,
                                   timeout=timeout) as response:  # fmt: skip
                if response.status_code >= 400:
                    response.read()
                    raise _refusal(response)
                parser = Parser()
                for line in response.iter_lines():
                    block = parser.feed(line)
                    if block is not None:
                        yield block
        except httpx.ConnectError:
            raise InstanceUnreachable(self.url) from None
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise StreamDropped(f"the stream at {self.url} dropped ({exc or type(exc).__name__})"
                                ) from None  # fmt: skip

    def apply(self, text: str, *, content_type: str = "application/yaml") -> list[dict[str, Any]]:
        """Apply one or more specs; returns {name, created, changed} per employee."""
        doc = self._call("POST", "/v1/employees", content=text.encode(), content_type=content_type)
        return list(doc["applied"])

    def list(self) -> list[dict[str, Any]]:
        """Every employee with its live generation."""
        return list(self._call("GET", "/v1/employees")["employees"])

    def get(self, name: str) -> dict[str, Any]:
        """One employee, its live generation and its stored spec."""
        return dict(self._call("GET", f"/v1/employees/{name}"))

    def delete(self, name: str) -> dict[str, Any]:
        """Delete an employee with no live generation (409 while starting or running); returns
        {name, deleted_at, retired_generation, intent} (the Reset intent of a paused one)."""
        return dict(self._call("DELETE", f"/v1/employees/{name}"))

    def _post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        payload = json.dumps(body).encode()
        return dict(self._call("POST", path, content=payload, content_type="application/json"))

    def lifecycle(
        self, name: str, action: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """`start`, `stop`, `resume`, `reset` or `interrupt`; returns {name, generation, state,
        intent} (the intent is `applying` until the deliverer applied it)."""
        return self._post_json(f"/v1/employees/{name}:{action}", body or {})

    def limits(self, name: str, limits: dict[str, Any]) -> dict[str, Any]:
        """Replace the live generation's limits; returns {name, generation, state, intent}."""
        return self._post_json(f"/v1/employees/{name}/limits", limits)

    def intent(self, intent_id: int) -> dict[str, Any]:
        """One intent: {id, kind, state, revision, outcome, created_at, applied_at}."""
        return dict(self._call("GET", f"/v1/intents/{intent_id}"))

    def wait_intent(
        self, intent: dict[str, Any], timeout_s: float, poll_s: float = 0.2
    ) -> dict[str, Any]:
        """The intent once it is no longer `applying`, or as it stands at the deadline."""
        deadline = time.monotonic() + timeout_s
        while intent["state"] == "applying" and time.monotonic() < deadline:
            time.sleep(poll_s)
            intent = self.intent(int(intent["id"]))
        return intent

    def rearm(self) -> dict[str, Any]:
        """Ask for a re-arm of Temporal from the database; returns its intent."""
        return self._post_json("/v1/rearm", {})

    def chat(
        self, name: str, text: str, client_message_id: str, session: str | None = None
    ) -> dict[str, Any]:
        """Queue the owner's message; returns {message_id, status, duplicate}."""
        body: dict[str, str] = {"client_message_id": client_message_id, "text": text}
        if session is not None:
            body["session"] = session
        return self._post_json(f"/v1/employees/{name}/chat", body)

    def message(self, name: str, message_id: int) -> dict[str, Any]:
        """One owner message: {message_id, status, reply} (reply is None until answered)."""
        return dict(self._call("GET", f"/v1/employees/{name}/chat/{message_id}"))

    def user_add(self, name: str, klass: str | None = None,
                 daily_usd: float | None = None) -> dict[str, Any]:  # fmt: skip
        """Create a user (admin token): {name, token, class, daily_usd}; the token is shown
        this once."""
        body: dict[str, Any] = {"name": name}
        if klass is not None:
            body["class"] = klass
        if daily_usd is not None:
            body["daily_usd"] = daily_usd
        return self._post_json("/v1/users", body)

    def users(self) -> Rows:
        """Every user: {name, class, daily_usd, created_at}."""
        return list(self._call("GET", "/v1/users")["users"])

    def user_remove(self, name: str) -> None:
        """Remove a user; its token stops working."""
        self._call("DELETE", f"/v1/users/{name}")

    def outbox(self, status: str | None = None, employee: str | None = None) -> Rows:
        """The outbox, newest first (one page); never a recipient or a body."""
        query = urllib.parse.urlencode({k: v for k, v in (("status", status),
                                        ("employee", employee)) if v})  # fmt: skip
        return list(self._call("GET", "/v1/outbox" + (f"?{query}" if query else ""))["outbox"])

    def outbox_retry(self, outbound_id: int) -> dict[str, Any]:
        """Send an `unknown` or `failed` row once more: {id, status, retry}."""
        return self._post_json(f"/v1/outbox/{outbound_id}:retry", {})

    def approvals(self, state: str | None = None) -> Rows:
        """Approvals newest first (the caller's own unless admin), each with its held draft."""
        query = f"?state={urllib.parse.quote(state)}" if state else ""
        return list(self._call("GET", "/v1/approvals" + query)["approvals"])

    def timeline(self, name: str, **params: str | int | None) -> dict[str, Any]:
        """A page of an employee's timeline: {timeline, next_cursor, follow_cursor, as_of}
        (`chain`, `thread`, `kind`, `since`, `until`, `order`, `cursor`, `limit`)."""
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        return dict(self._call("GET", f"/v1/employees/{name}/timeline?{query}"))

    def waiting(self, name: str, limit: int | None = None) -> dict[str, Any]:
        """Every input of an employee not consumed yet and its gate: {waiting, more, as_of}."""
        query = f"?limit={limit}" if limit is not None else ""
        return dict(self._call("GET", f"/v1/employees/{name}/waiting{query}"))

    def decide(self, approval_id: str, verb: str) -> dict[str, Any]:
        """`approve` or `decline` an approval: the approval as decided."""
        return self._post_json(f"/v1/approvals/{urllib.parse.quote(approval_id)}:{verb}", {})

    def _get_query(self, path: str, query: dict[str, Any]) -> Any:
        given = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        return self._call("GET", path + (f"?{given}" if given else ""))

    def dead_letters(self, query: dict[str, Any]) -> dict[str, Any]:
        """One page of dead letters: {dead_letters, next_cursor}."""
        return dict(self._get_query("/v1/dead-letters", query))

    def replay(self, selector: dict[str, Any], confirmation: str | None = None) -> dict[str, Any]:
        """Without `confirmation`: what the selector would replay and its confirmation; with
        it: the replay."""
        body: dict[str, Any] = {"selector": selector}
        if confirmation is not None:
            body["confirmation"] = confirmation
        return self._post_json("/v1/replay", body)

    def attention(self, query: dict[str, Any]) -> dict[str, Any]:
        """One page of attention items: {attention, next_cursor}."""
        return dict(self._get_query("/v1/attention", query))

    def attention_item(self, item_id: int) -> dict[str, Any]:
        """One attention item."""
        return dict(self._call("GET", f"/v1/attention/{item_id}"))

    def attention_post(self, item_id: int, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        """`ack`, `resolve` or `act` (with `{"action": …}`) on one item."""
        return self._post_json(f"/v1/attention/{item_id}:{verb}", body)
