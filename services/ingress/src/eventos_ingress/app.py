"""Wiring of the ingress service: webhooks, owner API, gRPC EventIngress, health."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from psycopg_pool import AsyncConnectionPool
from starlette.routing import Route

from eventos.blobs import BlobStore
from eventos.bus import GroupCommitter
from eventos.db import Conn, open_pool
from eventos.llm.endpoints import LlmEndpoints
from eventos.service import Service
from eventos.settings import AdminSettings, DatabaseSettings, SecretStore, ServiceSettings
from eventos.spec import PROVIDER_SCHEMES
from eventos.v1 import ingress_pb2_grpc
from eventos.wake import Kicker
from eventos_ingress.hooks import Hooks
from eventos_ingress.limits import HookLimits
from eventos_ingress.owner_api import OwnerApi
from eventos_ingress.publish import EventIngressServicer
from eventos_ingress.routes import RouteTable

NAME = "ingress"
HOOK_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@dataclass
class IngressConfig:
    """Everything the ingress service needs, passed in."""

    database: DatabaseSettings
    service: ServiceSettings
    admin: AdminSettings
    secrets: SecretStore
    blob_dir: Path
    hook_limits: HookLimits = field(default_factory=HookLimits)
    driver_token: str | None = field(default=None, repr=False)
    group_commit_workers: int = 4
    llm_endpoints: LlmEndpoints = field(default_factory=LlmEndpoints)

    @classmethod
    def from_env(cls) -> IngressConfig:
        return cls(
            database=DatabaseSettings.from_env(),
            service=ServiceSettings.from_env(NAME),
            admin=AdminSettings.from_env(),
            secrets=SecretStore.from_env(),
            blob_dir=Path(os.environ.get("EVENTOS_BLOB_DIR", ".eventos/blobs")),
            hook_limits=HookLimits.from_env(),
            driver_token=os.environ.get("EVENTOS_DRIVER_TOKEN") or None,
            llm_endpoints=LlmEndpoints.from_env(),
        )


async def build(cfg: IngressConfig) -> Service:
    """The ingress service, ready to run."""
    pool: AsyncConnectionPool[Conn] = await open_pool(cfg.database, wait=False)
    committer = GroupCommitter(pool, workers=cfg.group_commit_workers)
    kicker = (
        Kicker(cfg.service.kick_targets, reason="ingress") if cfg.service.kick_targets else None
    )
    routes = RouteTable(pool, PROVIDER_SCHEMES)
    hooks = Hooks(
        pool, committer, cfg.secrets, BlobStore(cfg.blob_dir), routes, kicker, cfg.hook_limits
    )
    owner = OwnerApi(pool, cfg.admin.token, kicker, cfg.llm_endpoints)
    servicer = EventIngressServicer(pool, committer, kicker, cfg.driver_token)

    async def database_ready() -> None:
        async with pool.connection(timeout=1.5) as conn:
            await conn.execute("SELECT 1")

    async def stop() -> None:
        await committer.stop()
        if kicker is not None:
            await kicker.stop()
        await pool.close()

    committer.start()
    if kicker is not None:
        kicker.start()
    return Service(
        name=NAME,
        host=cfg.service.host,
        http_port=cfg.service.http_port,
        grpc_port=cfg.service.grpc_port,
        routes=[Route("/hooks/{path:path}", hooks.handle, methods=HOOK_METHODS), *owner.routes()],
        checks={"database": database_ready},
        grpc_registrars=[
            lambda s: ingress_pb2_grpc.add_EventIngressServicer_to_server(servicer, s)
        ],
        loops=[routes.refresh_loop],
        on_stop=[stop],
    )
