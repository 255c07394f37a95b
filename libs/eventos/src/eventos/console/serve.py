"""The console's routes on ingress: `/console` (the page) and `/console/assets/<version>/...`
(its files, cached for a year). Every answer under `/console` (a 404 and a 405 too) carries a
strict Content-Security-Policy: scripts and styles only from these files, requests only to this
origin, no framing, no referrer."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route, Router, request_response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventos.console.assets import Asset, Assets

PREFIX = "/console"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
}
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"  # the page names the assets' version: it is always asked again
READ = ("GET", "HEAD")
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class SecurityHeaders:
    """Adds the console's security headers to every answer of the wrapped app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.decode().lower() not in SECURITY]  # fmt: skip
                headers += [(k.encode(), v.encode()) for k, v in SECURITY.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def _send(request: Request, asset: Asset, cache: str) -> Response:
    """The asset, gzipped where the client takes gzip; 405 for a method that is not a read."""
    if request.method not in READ:
        return PlainTextResponse("method not allowed", 405, headers={"Allow": "GET, HEAD"})
    headers = {"Cache-Control": cache, "Vary": "Accept-Encoding"}
    body = asset.body
    if "gzip" in request.headers.get("accept-encoding", ""):
        body, headers["Content-Encoding"] = asset.gzipped, "gzip"
    return Response(body, media_type=asset.media_type, headers=headers)


def routes(assets: Assets) -> list[BaseRoute]:
    """The console's routes, serving `assets`."""

    async def page(request: Request) -> Response:
        return _send(request, assets.index, REVALIDATE)

    async def asset(request: Request) -> Response:
        found = assets.files.get(str(request.path_params["name"]))
        if request.path_params["version"] != assets.version or found is None:
            return PlainTextResponse("not found", 404)
        return _send(request, found, IMMUTABLE)

    async def other(request: Request) -> Response:
        return PlainTextResponse("not found", 404)

    inner = Router([
        Route("/", page, methods=ALL_METHODS),
        Route("/assets/{version}/{name:path}", asset, methods=ALL_METHODS),
        Route("/{rest:path}", other, methods=ALL_METHODS),
    ])  # fmt: skip
    return [
        Route(PREFIX, SecurityHeaders(request_response(page)), methods=ALL_METHODS),
        Mount(PREFIX, app=SecurityHeaders(inner)),
    ]
