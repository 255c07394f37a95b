"""The HTTP client channel readers and senders share (per process).

Providers' addresses come from the operator's settings, never from an employee's spec, so this
client is not the guarded one tools and polls use; its bounds are the providers' own: a long
poll is held by the reader's own timeout, and every other call by the sender's.
"""

from __future__ import annotations

import httpx

MAX_CONNECTIONS = 200
CONNECT_TIMEOUT_S = 5.0


def provider_client() -> httpx.AsyncClient:
    """A client with bounded connections; each call passes its own timeout."""
    timeout = httpx.Timeout(30.0, connect=CONNECT_TIMEOUT_S)
    limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=50)
    return httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False)
