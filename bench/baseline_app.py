"""The baseline: a bare Starlette app under uvicorn doing one autocommit INSERT per request.

`python bench/baseline_app.py --url URL --port PORT [--pool N]`. It runs the way the
ingress service does (uvicorn's Server inside `asyncio.run`, so the same event loop and
HTTP parser) and has the same pool size, so the comparison isolates what ingress does per
event beyond "receive, insert, commit, answer".
"""

from __future__ import annotations

import argparse
import asyncio

import uvicorn
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TABLE_DDL = """
CREATE TABLE IF NOT EXISTS bench_baseline (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    body jsonb NOT NULL
)
"""
INSERT = "INSERT INTO bench_baseline (event_id, body) VALUES (%s, %s::jsonb) RETURNING id"


def build_app(pool: AsyncConnectionPool[AsyncConnection[tuple[int]]]) -> Starlette:
    """The app: POST /hooks/{path} inserts one row; /readyz for the driver."""

    async def hook(request: Request) -> Response:
        body = await request.body()
        event_id = request.headers.get("x-event-id", "")
        async with pool.connection() as conn:
            cur = await conn.execute(INSERT, (event_id, body.decode()))
            row = await cur.fetchone()
        return JSONResponse({"status": "accepted", "id": row[0] if row else None})

    async def readyz(request: Request) -> Response:
        return JSONResponse({"ready": True})

    return Starlette(
        routes=[Route("/hooks/{path:path}", hook, methods=["POST"]), Route("/readyz", readyz)]
    )


async def serve(url: str, port: int, pool_size: int) -> None:
    pool: AsyncConnectionPool[AsyncConnection[tuple[int]]] = AsyncConnectionPool(
        url, min_size=1, max_size=pool_size, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    try:
        config = uvicorn.Config(
            build_app(pool),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        await uvicorn.Server(config).serve()
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pool", type=int, default=10, help="pool size (ingress default: 10)")
    args = parser.parse_args()
    asyncio.run(serve(args.url, args.port, args.pool))


if __name__ == "__main__":
    main()
