"""Test hook: a webhook provider's sender (the upgrade tests' steady load, EG16): posts one
event after another to an instance's hook, each retried until acknowledged (2xx), as providers
retry; `acked` lists the X-Event-Ids acknowledged, in order."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from eventos.testing import wait_for_sync


@dataclass
class WebhookSender:
    """Posts `{"n": n}` with X-Event-Id `<prefix>-<n>` to `url()` (read at every attempt: the
    instance's address may move) every `interval_s`, retrying each event until acknowledged."""

    url: Callable[[], str]
    prefix: str
    interval_s: float = 0.5
    acked: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def send_one(self, n: int) -> None:
        event_id = f"{self.prefix}-{n}"
        while not self._stop.is_set():
            with contextlib.suppress(httpx.HTTPError, OSError, ValueError):
                answer = httpx.post(self.url(), json={"n": n}, timeout=10,
                                    headers={"X-Event-Id": event_id})  # fmt: skip
                if answer.is_success:
                    self.acked.append(event_id)
                    return
            self._stop.wait(self.interval_s)  # a provider's retry delay

    def start(self, acked: int = 0, timeout_s: float = 60.0) -> WebhookSender:
        """Start sending; return once `acked` events were acknowledged."""

        def loop() -> None:
            n = 0
            while not self._stop.is_set():
                self.send_one(n)
                n += 1
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        self.wait_acked(acked, timeout_s)
        return self

    def wait_acked(self, more: int, timeout_s: float) -> None:
        """Return once `more` events more than now were acknowledged."""
        target = len(self.acked) + more
        wait_for_sync(lambda: len(self.acked) >= target, timeout=timeout_s,
                      what=f"{more} more events acknowledged")  # fmt: skip

    def stop(self) -> list[str]:
        """Stop sending; every event acknowledged."""
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)
        return list(self.acked)
