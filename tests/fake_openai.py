"""A loopback fake of the OpenAI chat-completions API, served over real HTTP on 127.0.0.1.

It checks the bearer key, validates requests the way the API does (unknown arguments, message
roles, tool-call pairing, tool shapes, the token-limit field each model family takes) and answers
with the API's bodies and headers: `usage`, `x-request-id`, rate-limit headers, and error objects
`{"error": {message, type, param, code}}`.
Tests queue answers: a reply, tool calls, an error with `Retry-After` / `x-should-retry`, a hang.
Error messages echo what they complain about (the API does), so tests can check nothing leaks.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from eventos.testing import wait_for

KEY = "sk-fake-0123456789abcdefghijklmnopqrstuv"
REQUEST_ARGS = {
    "model", "messages", "max_tokens", "max_completion_tokens", "tools", "tool_choice",
    "temperature", "top_p", "n", "stop", "stream", "seed", "user", "response_format",
    "parallel_tool_calls", "frequency_penalty", "presence_penalty", "logit_bias", "metadata",
}  # fmt: skip
# The reasoning families (o1, o3, o4-mini, gpt-5…) refuse `max_tokens` with a 400
# `unsupported_parameter` and take `max_completion_tokens`; current classic chat models (gpt-4o,
# gpt-4.1…) take either, `max_tokens` being the deprecated older name.
REASONING_MODEL = re.compile(r"^(o1|o3|o4|gpt-5)([-.]|$)")
ROLES = {"system", "developer", "user", "assistant", "tool"}
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    408: "timeout",
    409: "conflict",
    422: "invalid_request_error",
    429: "requests",
}


@dataclass
class Answer:
    """One scripted answer: a completion (default), an HTTP error, a raw body or a hang."""

    status: int = 200
    content: str | None = "Hello from the fake."
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, args)
    finish_reason: str | None = None
    usage: tuple[int, int] | None = None  # (prompt, completion) tokens
    headers: dict[str, str] = field(default_factory=dict)
    code: str | None = None
    raw: str | None = None
    hang: bool = False


@dataclass
class Seen:
    """One request the fake received."""

    at: float
    headers: dict[str, str]
    body: Any


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class FakeOpenAI:
    """The fake server; `key=None` plays a local gateway that takes no key."""

    def __init__(self, key: str | None = KEY) -> None:
        self.key = key
        self.requests: list[Seen] = []
        self.answers: deque[Answer] = deque()
        self.port = 0
        self._release = asyncio.Event()
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def reset(self) -> None:
        """Forget queued answers and seen requests."""
        self.answers.clear()
        self.requests.clear()

    def queue(self, *answers: Answer) -> None:
        """Answer the next requests with these, in order; then with the default reply."""
        self.answers.extend(answers)

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._completions, methods=["POST"]),
                Route("/{path:path}", self._unknown_url, methods=["GET", "POST"]),
            ]
        )
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        server = self._server

        async def started() -> bool:
            return server.started

        await wait_for(started, what="the fake OpenAI server listens")

    async def stop(self) -> None:
        self._release.set()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.wait_for(self._task, 10)

    async def _unknown_url(self, request: Request) -> Response:
        message = f"Invalid URL ({request.method} {request.url.path})"
        return self._error(404, message)

    async def _completions(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.requests.append(Seen(time.monotonic(), dict(request.headers), body))
        try:
            self._check_key(request.headers.get("authorization"))
            if not isinstance(body, dict):
                raise ApiError(400, "We could not parse the JSON body of your request.")
            validate(body)
        except ApiError as exc:
            return self._error(exc.status, exc.message, param=exc.param, code=exc.code)
        answer = self.answers.popleft() if self.answers else Answer()
        if answer.hang:
            await self._release.wait()
        if answer.raw is not None:
            return Response(answer.raw, 200, self._headers(), media_type="application/json")
        if answer.status != 200:
            return self._scripted_error(answer, body)
        return JSONResponse(completion(body, answer), headers=self._headers(answer.headers))

    def _check_key(self, authorization: str | None) -> None:
        if self.key is None:
            return
        if not authorization or not authorization.startswith("Bearer "):
            raise ApiError(401, "You didn't provide an API key in an Authorization header.")
        given = authorization.removeprefix("Bearer ")
        if given != self.key:
            masked = given[:3] + "*" * 8 + given[-4:]
            raise ApiError(401, f"Incorrect API key provided: {masked}.")

    def _scripted_error(self, answer: Answer, body: dict[str, Any]) -> Response:
        # Like the API, messages quote the request (here: the last message's text).
        last = body["messages"][-1].get("content")
        message = {
            400: f"Invalid 'messages[-1].content': {last!r} is not allowed.",
            401: f"Incorrect API key provided: {(self.key or '')[:8]}****.",
            404: f"The model `{body['model']}` does not exist or you do not have access to it.",
            429: f"Rate limit reached for {body['model']} on requests per min. Request: {last!r}.",
        }.get(answer.status, f"The server had an error processing {last!r}.")
        return self._error(answer.status, message, code=answer.code, headers=answer.headers)

    def _error(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        kind = ERROR_TYPES.get(status, "server_error")
        if code == "insufficient_quota":
            kind = "insufficient_quota"
        if status == 401 and code is None:
            code = "invalid_api_key"
        error = {"message": message, "type": kind, "param": param, "code": code}
        return JSONResponse({"error": error}, status, headers=self._headers(headers or {}))

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {
            "x-request-id": f"req_{uuid.uuid4().hex}",
            "openai-organization": "org-fake",
            "openai-processing-ms": "42",
            "openai-version": "2020-10-01",
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-reset-requests": "120ms",
            "x-ratelimit-limit-tokens": "200000",
            "x-ratelimit-remaining-tokens": "199000",
            "x-ratelimit-reset-tokens": "300ms",
            **(extra or {}),
        }


def validate(body: dict[str, Any]) -> None:
    """Raise ApiError where the API would reject the request."""
    for name in body:
        if name not in REQUEST_ARGS:
            raise ApiError(400, f"Unrecognized request argument supplied: {name}")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise ApiError(400, "you must provide a model parameter", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "[] is too short - 'messages'", "messages")
    for i, message in enumerate(messages):
        validate_message(message, i, messages)
    tools = body.get("tools")
    if tools is not None:
        validate_tools(tools)
    if "max_tokens" in body and REASONING_MODEL.match(body["model"]):
        raise ApiError(
            400, "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
            "'max_completion_tokens' instead.", "max_tokens", "unsupported_parameter")  # fmt: skip
    for name in ("max_tokens", "max_completion_tokens"):
        limit = body.get(name)
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ApiError(400, f"{name} must be at least 1", name)


def validate_message(message: Any, i: int, messages: list[Any]) -> None:
    where = f"messages.[{i}]"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise ApiError(400, f"Invalid value for '{where}.role'", f"{where}.role")
    role, content = message["role"], message.get("content")
    if role == "tool":
        if not isinstance(message.get("tool_call_id"), str):
            raise ApiError(400, f"Missing parameter '{where}.tool_call_id'", where)
        if message["tool_call_id"] not in _open_calls(messages, i):
            raise ApiError(
                400, "messages with role 'tool' must be a response to a preceding message "
                "with 'tool_calls'", where)  # fmt: skip
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list) or not calls:
            raise ApiError(400, f"Invalid value for '{where}.tool_calls'", f"{where}.tool_calls")
        for call in calls:
            validate_call(call, where)
        _check_answered(calls, i, messages)
    if content is None and not (role == "assistant" and calls):
        raise ApiError(400, f"Invalid value for '{where}.content': expected a string", where)
    if content is not None and not isinstance(content, str):
        raise ApiError(400, f"Invalid type for '{where}.content'", f"{where}.content")


def validate_call(call: Any, where: str) -> None:
    ok = (
        isinstance(call, dict)
        and isinstance(call.get("id"), str)
        and call.get("type") == "function"
        and isinstance(call.get("function"), dict)
        and isinstance(call["function"].get("name"), str)
        and isinstance(call["function"].get("arguments"), str)
    )
    if not ok:
        raise ApiError(400, f"Invalid value for '{where}.tool_calls'", f"{where}.tool_calls")


def _open_calls(messages: list[Any], i: int) -> set[str]:
    """Tool-call ids of the assistant message this tool message (index i) may answer."""
    j = i - 1
    while j >= 0 and messages[j].get("role") == "tool":
        j -= 1
    if j < 0 or not messages[j].get("tool_calls"):
        return set()
    return {c.get("id") for c in messages[j]["tool_calls"]}


def _check_answered(calls: list[dict[str, Any]], i: int, messages: list[Any]) -> None:
    answered = set()
    for later in messages[i + 1 :]:
        if later.get("role") != "tool":
            break
        answered.add(later.get("tool_call_id"))
    missing = [c["id"] for c in calls if c["id"] not in answered]
    if missing:
        raise ApiError(
            400, "An assistant message with 'tool_calls' must be followed by tool messages "
            f"responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(missing)}", f"messages.[{i}].role")  # fmt: skip


def validate_tools(tools: Any) -> None:
    if not isinstance(tools, list) or not tools:
        raise ApiError(400, "[] is too short - 'tools'", "tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(function, dict):
            raise ApiError(400, f"Invalid value for 'tools[{i}]'", f"tools[{i}]")
        if not TOOL_NAME.match(str(function.get("name", ""))):
            raise ApiError(400, f"Invalid 'tools[{i}].function.name'", f"tools[{i}].function.name")
        if not isinstance(function.get("parameters", {}), dict):
            raise ApiError(400, f"Invalid 'tools[{i}].function.parameters'", f"tools[{i}]")


def completion(body: dict[str, Any], answer: Answer) -> dict[str, Any]:
    """A `chat.completion` object for the request and the scripted answer."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if answer.tool_calls else answer.content,
        "refusal": None,
        "annotations": [],
    }
    if answer.tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in answer.tool_calls
        ]
    finish = answer.finish_reason or ("tool_calls" if answer.tool_calls else "stop")
    prompt, completion_tokens = answer.usage or (
        len(json.dumps(body["messages"])) // 4,
        len(json.dumps(message)) // 4,
    )
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:29]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body["model"],
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        },
        "service_tier": "default",
        "system_fingerprint": "fp_fake0001",
    }
