"""A real JSON endpoint on loopback for poll tests (`http.server` in a thread): it serves
programmed pages by cursor, records every request, and can hold one answer half sent."""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

CURSOR_PARAM = "after"
HOLD_S = 120.0  # a held answer waits at most this long for the test


def items(prefix: str, n: int, start: int = 0) -> list[dict[str, Any]]:
    """`n` items with ids `<prefix>-<i>`."""
    return [{"id": f"{prefix}-{i}", "n": i} for i in range(start, start + n)]


def page_body(page_items: list[Any], next_cursor: str | None) -> bytes:
    """The endpoint's page: `data.items` and `meta.next` (left out on the last page)."""
    meta = {"next": next_cursor} if next_cursor is not None else {}
    return json.dumps({"data": {"items": page_items}, "meta": meta}).encode()


@dataclass
class Seen:
    """One request as the endpoint received it."""

    cursor: str | None
    headers: dict[str, str]
    path: str = ""


@dataclass
class PollEndpoint:
    """Pages by cursor (`None`: the first poll); `answer` overrides them all while set."""

    pages: dict[str | None, tuple[int, bytes]] = field(default_factory=dict)
    answer: tuple[int, bytes, dict[str, str]] | None = None
    redirects: dict[str | None, str] = field(default_factory=dict)  # cursor → Location (307)
    requests: list[Seen] = field(default_factory=list)
    hold_cursor: str | None = None  # the next answer for this cursor stops before its last byte
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    server: ThreadingHTTPServer | None = None

    def page(self, cursor: str | None, page_items: list[Any], next_cursor: str | None) -> None:
        self.pages[cursor] = (200, page_body(page_items, next_cursor))

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/items"

    def cursors(self) -> list[str | None]:
        return [r.cursor for r in list(self.requests)]

    def start(self) -> PollEndpoint:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                cursor = query.get(CURSOR_PARAM, [None])[0]
                endpoint.requests.append(Seen(cursor, dict(self.headers.items()), self.path))
                endpoint.respond(self, cursor)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def respond(self, handler: BaseHTTPRequestHandler, cursor: str | None) -> None:
        if self.answer is not None:
            status, body, headers = self.answer
        elif cursor in self.redirects:
            status, body, headers = 307, b"", {"Location": self.redirects[cursor]}
        else:
            status, body = self.pages.get(cursor, (200, page_body([], None)))
            headers = {}
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        hold = self.hold_cursor is not None and cursor == self.hold_cursor
        if hold:
            self.hold_cursor = None
            handler.wfile.write(body[:-1])  # the poller has read all but the last byte …
            handler.wfile.flush()
            self.held.set()
            self.release.wait(HOLD_S)  # … when the test kills it
            body = body[-1:]
        with contextlib.suppress(OSError):  # the poller is gone (killed): nothing to answer
            handler.wfile.write(body)

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
