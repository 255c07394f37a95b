"""A real HTTP server on loopback for the tools' tests: it records every request and answers
each path with a scripted response; a path may hold its requests until the test releases
them (to kill a worker while a call is surely at the server)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOLD_MAX_S = 120.0  # a held request is answered by then at the latest


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Answer:
    status: int = 200
    body: bytes = b'{"ok": true}'
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    hold_first: int = 0  # hold this many requests until released
    cut: bool = False  # close the connection mid-body (a call that broke off)
    gate: threading.Event | None = None  # hold every request until the test sets it


class Loopback:
    """Scripted answers by path; `seen` lists requests in arrival order."""

    def __init__(self) -> None:
        self.answers: dict[str, Answer] = {}
        self.seen: list[Seen] = []
        self.in_flight = 0  # requests the server holds or answers right now
        self.max_in_flight = 0
        self.answered: list[str] = []  # paths in the order their answers were written
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str, answer: Answer) -> None:
        self.answers[path] = answer

    def requests(self, path: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path == path]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                with server.lock:
                    server.seen.append(Seen(self.command, path, dict(self.headers), body))
                    count = len([s for s in server.seen if s.path == path])
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._answer(path, count)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                        server.answered.append(path)

            def _answer(self, path: str, count: int) -> None:
                answer = server.answers.get(path, Answer(404, b'{"error": "no such path"}'))
                if count <= answer.hold_first:
                    server.release.wait(HOLD_MAX_S)
                if answer.gate is not None:
                    answer.gate.wait(HOLD_MAX_S)
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                if answer.cut:
                    self.wfile.write(answer.body[: len(answer.body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    self.wfile.write(answer.body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve

        return Handler


@contextmanager
def loopback() -> Iterator[Loopback]:
    server = Loopback()
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.server.shutdown()
        server.server.server_close()
        thread.join(10)


def http_employee(name: str, hosts: str) -> str:
    """An employee on the local model whose one agent may call `http_request` on `hosts`."""
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {name}}}
spec:
  agents:
    - name: front
      model: {{provider: local, name: scripted}}
      tools: [http_request]
      http_hosts: {hosts}
  triggers:
    - {{kind: chat}}
"""
