"""The bare ASGI layer of `/hooks` (eventos_ingress.raw_http) and the prefix dispatch in front
of Starlette (eventos.runtime.service.PrefixDispatch), driven as an ASGI server drives them."""

from __future__ import annotations

import json
from typing import Any

from eventos_ingress.raw_http import Answer, HookRequest, hook_app
from starlette.types import Message, Receive, Scope

from eventos.runtime.service import PrefixDispatch


def scope(
    path: str, method: str = "POST", headers: list[tuple[bytes, bytes]] | None = None
) -> Scope:
    return {"type": "http", "path": path, "method": method, "headers": headers or []}


async def nothing() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


class Sent:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])

    @property
    def body(self) -> Any:
        return json.loads(self.messages[1]["body"])


def test_a_request_reads_its_path_below_the_prefix_and_lowercased_headers() -> None:
    raw = [(b"X-Event-Id", b"one"), (b"Content-Type", b"application/json"), (b"x-event-id", b"two")]
    request = HookRequest(scope("/hooks/a/b%20c", headers=raw), nothing, "/hooks/")
    assert (request.path, request.method) == ("a/b%20c", "POST")
    assert request.headers == {"x-event-id": "two", "content-type": "application/json"}


async def test_an_answer_is_one_start_and_one_body_with_its_headers() -> None:
    sent = Sent()
    await Answer(429, {"error": "rate limit", "é": 1}, {"Retry-After": "3"}).send(sent)
    assert sent.status == 429 and len(sent.messages) == 2
    assert sent.body == {"error": "rate limit", "é": 1}
    assert sent.headers[b"content-type"] == b"application/json"
    assert sent.headers[b"content-length"] == str(len(sent.messages[1]["body"])).encode()
    assert sent.headers[b"retry-after"] == b"3"


async def test_a_handler_that_raises_answers_500_and_nothing_else() -> None:
    async def broken(request: HookRequest) -> Answer:
        raise RuntimeError("boom")

    sent = Sent()
    await hook_app("/hooks/", broken)(scope("/hooks/x"), nothing, sent)
    assert (sent.status, sent.body) == (500, {"error": "internal error"})
    assert "boom" not in json.dumps(sent.body)


async def test_only_the_prefix_goes_to_the_bare_app_the_rest_to_the_framework() -> None:
    seen: list[str] = []

    async def framework(scope: Scope, receive: Receive, send: Any) -> None:
        seen.append(f"framework {scope['path']}")

    async def handle(request: HookRequest) -> Answer:
        seen.append(f"hooks {request.path}")
        return Answer(200, {"status": "accepted"})

    app = PrefixDispatch(framework, [("/hooks/", hook_app("/hooks/", handle))])
    for path in ("/hooks/a", "/hooks", "/v1/employees", "/hooks/"):
        await app(scope(path), nothing, Sent())
    await app({"type": "websocket", "path": "/hooks/a"}, nothing, Sent())
    assert seen == ["hooks a", "framework /hooks", "framework /v1/employees", "hooks ",
                    "framework /hooks/a"]  # fmt: skip
