"""Wiring of the ingress service: webhooks, owner API, gRPC EventIngress, health."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from psycopg_pool import AsyncConnectionPool

from eventos.bus.inbox import GroupCommitter
from eventos.channels.discord import DiscordApi
from eventos.channels.discord_gateway import DiscordReader
from eventos.channels.email import EmailReader
from eventos.channels.http import provider_client
from eventos.channels.readers import ChannelReader, ChannelReaders
from eventos.channels.settings import ChannelSettings
from eventos.channels.telegram import TelegramApi, TelegramReader
from eventos.console import serve as console
from eventos.console.assets import Assets
from eventos.console.settings import ConsoleSettings
from eventos.db import Conn, open_pool
from eventos.llm.endpoints import LlmEndpoints
from eventos.owner.wakeups import StreamWakeups
from eventos.runtime.http_bounds import CapClass, under
from eventos.runtime.service import GrpcServerOptions, Service
from eventos.runtime.wake import Kicker
from eventos.scheduling.policy import SchedConfig
from eventos.settings import (
    AdminSettings,
    DatabaseSettings,
    GrpcIngressSettings,
    HttpBounds,
    IngressBuffers,
    SecretStore,
    ServiceSettings,
)
from eventos.spec.model import PROVIDER_SCHEMES
from eventos.v1 import ingress_pb2_grpc
from eventos_ingress.credentials import DriverTable
from eventos_ingress.discord import PREFIX as DISCORD_PREFIX
from eventos_ingress.discord import DiscordInteractions
from eventos_ingress.hooks import Hooks
from eventos_ingress.limits import HookLimits
from eventos_ingress.owner_api import OwnerApi
from eventos_ingress.publish import EventIngressServicer
from eventos_ingress.raw_http import hook_app
from eventos_ingress.routes import RouteTable
from eventos_ingress.streams_api import is_stream
from eventos_ingress.whatsapp_hook import PREFIX as WHATSAPP_PREFIX
from eventos_ingress.whatsapp_hook import WhatsAppHook

NAME = "ingress"
HOOKS_PREFIX = "/hooks/"
CHANNELS_PREFIX = "/channels/"  # the channels' own hooks (WhatsApp, Discord interactions)


def in_flight_classes(bounds: HttpBounds) -> list[CapClass]:
    """Webhooks (anyone on the internet may call them), event streams (each open for long)
    and the owner API (all else) each have their own cap: a class at its cap refuses only
    its own callers."""
    return [
        CapClass("hooks", bounds.hooks_max_in_flight, under(HOOKS_PREFIX, CHANNELS_PREFIX)),
        CapClass("streams", bounds.streams_max_in_flight, is_stream),
    ]


@dataclass
class IngressConfig:
    """Everything the ingress service needs, passed in."""

    database: DatabaseSettings
    service: ServiceSettings
    admin: AdminSettings
    secrets: SecretStore
    buffers: IngressBuffers = field(default_factory=IngressBuffers)
    hook_limits: HookLimits = field(default_factory=HookLimits)
    http_bounds: HttpBounds = field(default_factory=HttpBounds)
    grpc: GrpcIngressSettings = field(default_factory=GrpcIngressSettings)
    group_commit_workers: int = 4
    llm_endpoints: LlmEndpoints = field(default_factory=LlmEndpoints)
    channels: ChannelSettings = field(default_factory=ChannelSettings)
    sched: SchedConfig = field(default_factory=SchedConfig)  # explains admission's waits
    console: ConsoleSettings = field(default_factory=ConsoleSettings)

    @classmethod
    def from_env(cls) -> IngressConfig:
        return cls(
            database=DatabaseSettings.from_env(),
            service=ServiceSettings.from_env(NAME),
            admin=AdminSettings.from_env(),
            secrets=SecretStore.from_env(),
            buffers=IngressBuffers.from_env(),
            hook_limits=HookLimits.from_env(),
            http_bounds=HttpBounds.from_env(),
            grpc=GrpcIngressSettings.from_env(),
            llm_endpoints=LlmEndpoints.from_env(),
            channels=ChannelSettings.from_env(),
            sched=SchedConfig.from_env(),
            console=ConsoleSettings.from_env(),
        )


def grpc_server_options(settings: GrpcIngressSettings) -> GrpcServerOptions:
    """The gRPC server's bounds and, with a certificate configured, its TLS."""
    credentials = None
    if settings.tls_cert is not None and settings.tls_key is not None:
        credentials = grpc.ssl_server_credentials([(settings.tls_key, settings.tls_cert)])
    return GrpcServerOptions(
        options=settings.server_options(),
        credentials=credentials,
        max_concurrent_rpcs=settings.max_concurrent_rpcs,
    )


async def build(cfg: IngressConfig) -> Service:
    """The ingress service, ready to run."""
    cfg.grpc.check_transport(cfg.service.host)
    spool_dir = cfg.buffers.spool_dir
    if spool_dir is not None:
        spool_dir.mkdir(parents=True, exist_ok=True)
    pool: AsyncConnectionPool[Conn] = await open_pool(cfg.database, wait=False)
    committer = GroupCommitter(
        pool, workers=cfg.group_commit_workers, max_queue=cfg.buffers.commit_queue_max
    )
    kicker = (
        Kicker(cfg.service.kick_targets, reason="ingress") if cfg.service.kick_targets else None
    )
    routes = RouteTable(pool, PROVIDER_SCHEMES)
    hooks = Hooks(
        pool,
        committer,
        cfg.secrets,
        routes,
        kicker,
        cfg.hook_limits,
        body_idle_timeout_s=cfg.http_bounds.body_idle_timeout_s,
        spool_dir=str(spool_dir) if spool_dir else None,
    )
    wakeups = StreamWakeups(cfg.database)
    owner = OwnerApi(pool, cfg.admin, wakeups, kicker, cfg.llm_endpoints, cfg.sched,
                     cfg.secrets.purposes, cfg.console)  # fmt: skip
    drivers = DriverTable(pool, cfg.secrets, cfg.grpc.internal_token)
    servicer = EventIngressServicer(pool, committer, drivers, cfg.grpc, kicker)
    http = provider_client()
    telegram = TelegramReader(TelegramApi(http, cfg.channels.telegram_api),
                              cfg.channels.poll_timeout_s)  # fmt: skip
    email = EmailReader(cfg.channels.email_poll_s)
    discord = DiscordReader(DiscordApi(http), cfg.channels.gateway_wait_s)
    drivers_read: dict[str, ChannelReader] = {
        telegram.driver: telegram,
        email.driver: email,
        discord.driver: discord,
    }
    readers = ChannelReaders(pool, cfg.secrets, cfg.channels, drivers_read, kicker)
    whatsapp = WhatsAppHook(pool, cfg.secrets, kicker, cfg.http_bounds.body_idle_timeout_s,
                            backlog_max=cfg.channels.backlog_max)  # fmt: skip
    interactions = DiscordInteractions(pool, cfg.secrets, kicker)

    async def database_ready() -> None:
        async with pool.connection(timeout=1.5) as conn:
            await conn.execute("SELECT 1")

    async def stop() -> None:
        await discord.close()
        await http.aclose()
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
        routes=[*owner.routes(), *console.routes(Assets.load())],
        raw_routes=[
            (HOOKS_PREFIX, hook_app(HOOKS_PREFIX, hooks.handle)),
            (WHATSAPP_PREFIX, hook_app(WHATSAPP_PREFIX, whatsapp.handle)),
            (DISCORD_PREFIX, hook_app(DISCORD_PREFIX, interactions.handle)),
        ],
        checks={"database": database_ready},
        grpc_registrars=[
            lambda s: ingress_pb2_grpc.add_EventIngressServicer_to_server(servicer, s)
        ],
        grpc_server=grpc_server_options(cfg.grpc),
        loops=[routes.refresh_loop, drivers.refresh_loop, wakeups.run, readers.run],
        on_stop=[stop],
        http_bounds=cfg.http_bounds,
        in_flight_classes=in_flight_classes(cfg.http_bounds),
    )
