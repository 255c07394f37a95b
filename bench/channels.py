"""Telegram conversations through the Bot API fake at a steady rate (issue 14).

    .venv/bin/python bench/channels.py [--chats 50] [--rate 10] [--seconds 60]
                                       [--account-rate 30] [--quick]

Starts an embedded PostgreSQL and the Temporal dev server (or uses EVENTOS_DATABASE_URL's server
and TEMPORAL_ADDRESS), the ingress in this process with its Telegram reader, the router's and
relay's loops, the workflow, LLM (local provider) and egress workers, and the loopback Bot API
fake of the test tree with Telegram's documented limits (1 message/s per chat, 30/s per bot).
`--chats` customers write, round robin, `--rate` messages per second in all for `--seconds`.
It prints the inbound-to-reply latency (p50/p99, from the moment the customer's message is in
Telegram's queue to the moment the reply reaches the fake; private chats debounce 2 s first),
the most sends in any one second against the account's bucket (`--account-rate` tokens per
second), the fake's 429s, and what was sent twice: deliveries at the fake against outbox rows
by idempotency key (target: 0).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from eventos_ingress.app import IngressConfig, build
from harness import (
    exit_on_signals,
    fresh_database,
    parse_with_quick,
    progress,
    run_in_temp_folder,
    temporal_server,
)

from eventos import names
from eventos.channels.settings import DEFAULT_BUCKETS, Bucket, ChannelSettings
from eventos.channels.telegram import TelegramApi, TelegramSender
from eventos.db import connect, open_pool
from eventos.db.migrate import migrate
from eventos.delivery.relay import Relay
from eventos.delivery.routing import route_pass
from eventos.employees import lifecycle
from eventos.llm.activity import LlmActivities
from eventos.llm.endpoints import LlmEndpoints
from eventos.llm.worker import llm_worker
from eventos.outbox.egress import Egress
from eventos.outbox.keys import OutboxKeys, new_key_entry
from eventos.runtime.payload_guard import connect as temporal_connect
from eventos.runtime.temporal import TemporalConnection
from eventos.secret_purposes import SecretPurposes
from eventos.settings import (
    AdminSettings,
    DatabaseSettings,
    SecretStore,
    ServiceSettings,
)
from eventos.spec.model import load_specs
from eventos.workers.activities import DbActivities
from eventos.workers.roles import egress_worker, workflow_worker

SPEC = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: shop}
spec:
  agents: [{name: front, model: {provider: local, name: scripted}}]
  triggers: [{kind: telegram, account: tg-bench}]
"""
ADMIN = "bench-admin-token-0123456789"
TESTS = Path(__file__).resolve().parent.parent / "tests"  # the provider fakes live there
DRAIN_S = 120.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def pump(pool: Any, relay: Relay) -> None:
    """The router's and the relay's loops, tight."""
    while True:
        async with pool.connection() as conn:
            await route_pass(conn)
        await relay.pass_once()
        await asyncio.sleep(0.02)


class Load:
    """Customers writing at a steady rate; replies matched to the oldest unanswered message."""

    def __init__(self, fake: Any, token: str, chats: int) -> None:
        self.fake, self.token = fake, token
        self.chats = [7_000_000 + i for i in range(chats)]
        self.unanswered: dict[int, collections.deque[float]] = collections.defaultdict(
            collections.deque
        )
        self.seen: dict[int, int] = collections.defaultdict(int)
        self.latencies: list[float] = []
        self.sent_at: list[float] = []
        self.messages = 0

    async def write(self, rate: float, seconds: float) -> None:
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < seconds:
            chat = self.chats[n % len(self.chats)]
            self.fake.customer_message(self.token, chat, f"order question {n} from {chat}")
            self.unanswered[chat].append(time.monotonic())
            n += 1
            self.messages = n
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))

    def collect(self) -> None:
        """New replies at the fake: each answers every message of its chat sent before it."""
        now = time.monotonic()
        for chat in self.chats:
            count = len(self.fake.sent(self.token, chat))
            while self.seen[chat] < count:
                self.seen[chat] += 1
                self.sent_at.append(now)
                waiting = self.unanswered[chat]
                if waiting:
                    self.latencies.append(now - waiting[0])
                    waiting.clear()  # one reply covers what the turn merged

    def open_messages(self) -> int:
        return sum(len(q) for q in self.unanswered.values())


async def run(args: argparse.Namespace, folder: Path) -> None:
    with fresh_database(folder, "eventos_channels") as url, temporal_server(folder) as ts:
        db = DatabaseSettings(url=url, pool_max=20)
        async with await connect(db) as conn:
            await migrate(conn)
            (spec,) = load_specs(SPEC)
            purposes = SecretPurposes.parse("tg-bench=channel")  # the account's credential
            await lifecycle.apply(conn, spec, LlmEndpoints(), purposes)
            await lifecycle.start(conn, "shop")
            await lifecycle.activate(conn, "shop")
        sys.path.insert(0, str(TESTS))
        from fake_telegram import FakeTelegram

        fake = FakeTelegram()
        await fake.start()
        try:
            await measure(args, folder, db, ts, fake)
        finally:
            await fake.stop()


async def measure(args: argparse.Namespace, folder: Path, db: DatabaseSettings, ts: Any,
                  fake: Any) -> None:  # fmt: skip
    token = fake.add_bot("shop_bot")
    secrets = SecretStore(
        env={"EVENTOS_SECRET_TG_BENCH": token, "EVENTOS_SECRETS_PURPOSES": "tg-bench=channel"}
    )
    buckets = {**DEFAULT_BUCKETS,
               "telegram": {**DEFAULT_BUCKETS["telegram"],
                            "account": Bucket(args.account_rate, args.account_rate)}}  # fmt: skip
    channels = ChannelSettings(telegram_api=fake.base_url, poll_timeout_s=5, refresh_s=1,
                               buckets=buckets)  # fmt: skip
    keys = OutboxKeys.parse(new_key_entry("bench"))
    pool = await open_pool(db)
    client = await temporal_connect(ts.address, ts.namespace)
    try:
        async with ingress_in_process(db, secrets, channels):
            await drive(args, ts, client, pool, fake, token, secrets, channels, keys)
    finally:
        await pool.close()


@contextlib.asynccontextmanager
async def ingress_in_process(db: DatabaseSettings, secrets: SecretStore,
                             channels: ChannelSettings) -> AsyncIterator[Any]:  # fmt: skip
    """The ingress (its Telegram reader too) serving in this process until the block ends."""
    cfg = IngressConfig(database=db, service=ServiceSettings("ingress", http_port=0, grpc_port=0),
                        admin=AdminSettings(ADMIN), secrets=secrets, channels=channels)  # fmt: skip
    ingress = await build(cfg)
    serving = asyncio.create_task(ingress.run(install_signals=False))
    await asyncio.wait_for(ingress.started(), 15)
    try:
        yield ingress
    finally:
        ingress.stop()
        await asyncio.wait_for(serving, 30)


async def enter_workers(
    stack: contextlib.AsyncExitStack, client: Any, pool: Any, http: httpx.AsyncClient,
    telegram_api: str, keys: OutboxKeys, secrets: SecretStore, channels: ChannelSettings,
    slots: int,
) -> None:  # fmt: skip
    """The workflow, egress (Telegram at `telegram_api`) and LLM workers (`slots` each, local
    provider), entered on `stack`."""
    sender = TelegramSender(TelegramApi(http, telegram_api), channels.send_timeout_s)
    egress = Egress(pool, keys, {"telegram": sender}, secrets, channels)
    acts = DbActivities(pool, outbox=keys, egress=egress)
    llm = LlmActivities(http, SecretStore(env={}), pool, endpoints=LlmEndpoints())
    workers = [workflow_worker(client, db=acts), egress_worker(client, acts)]
    workers += [llm_worker(client, k, slots, llm) for k in names.CLASSES]
    for w in workers:
        await stack.enter_async_context(w)


async def drive(args: argparse.Namespace, ts: Any, client: Any, pool: Any,
                fake: Any, token: str, secrets: SecretStore, channels: ChannelSettings,
                keys: OutboxKeys) -> None:  # fmt: skip
    """Workers and loops up, the load written, every message answered (or the drain's end)."""
    async with httpx.AsyncClient() as http, contextlib.AsyncExitStack() as stack:
        await enter_workers(stack, client, pool, http, fake.base_url, keys, secrets, channels, 16)
        relay = Relay(pool, TemporalConnection(ts), "bench")
        pumping = asyncio.create_task(pump(pool, relay))
        load = Load(fake, token, args.chats)
        progress(f"{args.chats} chats, {args.rate:g} messages/s for {args.seconds:g} s")
        writing = asyncio.create_task(load.write(args.rate, args.seconds))
        while not writing.done():
            load.collect()
            await asyncio.sleep(0.02)
        deadline = time.monotonic() + DRAIN_S
        while load.open_messages() and time.monotonic() < deadline:
            load.collect()
            await asyncio.sleep(0.02)
        pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pumping
        await report(args, load, pool, fake, token)


async def report(args: argparse.Namespace, load: Load, pool: Any, fake: Any,
                 token: str) -> None:  # fmt: skip
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS rows, count(DISTINCT idempotency_key) AS keys, "
            "count(*) FILTER (WHERE status = 'sent') AS sent, "
            "count(*) FILTER (WHERE status <> 'sent') AS unsent FROM outbound_messages"
        )
        out = await cur.fetchone() or {}
    messages = fake.sent(token)
    delivered = len(messages)
    # A reply delivered twice reaches its chat twice with its text (each reply quotes its input).
    repeats = collections.Counter((m["chat"]["id"], m["text"]) for m in messages)
    doubled = sum(n - 1 for n in repeats.values())
    calls = fake.calls(token, "sendMessage")
    refused = len(calls) - delivered
    per_second = collections.Counter(int(t) for t in load.sent_at)
    busiest = max(per_second.values(), default=0)
    print(f"\nTelegram, {args.chats} conversations, {load.messages} messages at {args.rate:g}/s "
          f"over {args.seconds:g} s: {len(load.latencies)} replies, "
          f"{load.open_messages()} messages unanswered after the drain")  # fmt: skip
    print(
        f"inbound-to-reply latency: p50 {percentile(load.latencies, 0.5):.2f} s, "
        f"p99 {percentile(load.latencies, 0.99):.2f} s (the private-chat debounce is 2 s)"
    )
    print(
        f"sends: most in one second {busiest} (account bucket {args.account_rate:g}/s, "
        f"burst {args.account_rate:g}); {refused} sendMessage calls refused by the fake (429s)"
    )
    twice = max(doubled, delivered - int(out.get("sent") or 0))
    print(f"outbox: {out.get('rows')} rows, {out.get('keys')} idempotency keys, "
          f"{out.get('unsent')} not sent; delivered at the fake {delivered}; "
          f"sent twice: {twice} (target 0: {'PASS' if twice == 0 else 'MISS'})")  # fmt: skip
    if twice:
        raise SystemExit("a reply reached the fake more than once")


def main() -> int:
    exit_on_signals()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--rate", type=float, default=10.0, help="messages per second in all")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--account-rate", type=float, default=30.0,
                        help="the account bucket's tokens per second (Telegram's 30)")  # fmt: skip
    args = parse_with_quick(parser, {"chats": 3, "rate": 3, "seconds": 4})
    return run_in_temp_folder("eventos-channels-", lambda folder: run(args, folder))


if __name__ == "__main__":
    raise SystemExit(main())
