"""The fault run (issue 17): a local instance under a steady mixed load while a seeded schedule
SIGKILLs one process at a time and loses PostgreSQL and Temporal for a while; then a ledger of
everything acknowledged, consumed, replied and done (docs/faults.md).

    .venv/bin/python bench/faults.py [--minutes 15] [--seed N] [--tier S|L] [--keep]

Prints the seed first (replay a run with --seed and the same --minutes and --tier), a progress
line every 30 s on stderr, then the ledger; exits 1 when a line does not add up. The instance
is always its own (embedded PostgreSQL, its own Temporal server): EVENTOS_DATABASE_URL and
TEMPORAL_ADDRESS are ignored, since the run stops both. `--minutes 60` reaches the hour-long
targets by construction: every process killed 12 times, PostgreSQL and Temporal lost 4 times
each, and about 14,000 events offered at the default rates.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from faults_book import Book
from faults_instance import TEMPORAL, Instance
from faults_ledger import Ledger, Line, Receivers, account
from faults_load import (
    PURPOSES,
    TELEGRAM_LATENCY_S,
    TESTS,
    EffectTarget,
    Load,
    Rates,
    secret_env,
    specs,
)
from faults_schedule import TAIL_S, Done, Executor, Fault, FaultTarget, Profile, plan
from harness import exit_on_signals, progress

sys.path.insert(0, str(TESTS))
from fake_telegram import FakeTelegram

PROGRESS_S = 30.0
LATE_TASK = "Task not found when completing"  # a worker's log line
QUIET = """SELECT
  (SELECT count(*) FROM bus_ingress WHERE status = 'accepted')
  + (SELECT count(*) FROM bus_deliveries WHERE status IN ('pending', 'held', 'delivered'))
  + (SELECT count(*) FROM turns WHERE status = 'running')
  + (SELECT count(*) FROM outbound_messages WHERE status IN ('queued', 'sending'))
  + (SELECT count(*) FROM tool_calls WHERE status = 'calling')"""
# Each audience's last chat event placed, and whether any is not placed yet (the stream shows
# events by place: migration 0024).
STREAM_HEADS = """SELECT audience, coalesce(max(pos), 0), count(*) FILTER (WHERE pos IS NULL)
FROM chat_events GROUP BY 1"""


@dataclass(frozen=True)
class Config:
    """One run: the seed, the faults, the load and how long the drain may take."""

    seed: int
    profile: Profile
    tier: str = "S"
    rates: Rates = field(default_factory=Rates)
    drain_s: float = 600.0

    @classmethod
    def for_test(cls, seed: int) -> Config:
        """The test suite's run: every process killed twice, PostgreSQL lost for 10 s and
        Temporal for 30 s, in about three minutes of load."""
        profile = Profile(3.0, kills_each=2, postgres_losses=1, temporal_losses=1,
                          postgres_s=10.0, temporal_s=30.0)  # fmt: skip
        return cls(seed, profile, drain_s=240.0)

    def replay(self) -> str:
        return (f".venv/bin/python bench/faults.py --seed {self.seed} "
                f"--minutes {self.profile.minutes:g} --tier {self.tier}")  # fmt: skip


@dataclass
class Result:
    """The ledger, the faults planned and done, and the events acknowledged per channel."""

    ledger: Ledger
    faults: list[Fault]
    done: list[Done]
    acked: dict[str, int]


@dataclass
class Stage:
    """Where the load goes and what the faults hit: the local instance here, a release on a
    cluster in tests/k8s/test_faults_on_cluster.py."""

    ingress_url: str
    ingress_grpc: str
    admin_token: str
    target: FaultTarget
    victims: list[str]  # what the plan kills, each `kills_each` times
    # The database's URL, asked for once the faults are done (a cluster's port-forward to
    # PostgreSQL would not outlive the loss of its pod).
    database: Callable[[], AbstractContextManager[str]]
    late_tasks: Callable[[], dict[str, int]]  # per service: LATE_TASK lines in its logs


def local_stage(instance: Instance) -> Stage:
    """The local instance as a stage: every service and the Temporal server are killed."""
    return Stage(instance.ingress_url, instance.ingress_grpc, instance.admin_token, instance,
                 [*instance.services(), TEMPORAL],
                 lambda: contextlib.nullcontext(instance.database_url),
                 lambda: _late_tasks(instance))  # fmt: skip


def service_env(telegram_api: str) -> dict[str, str]:
    """The services' settings of a run besides the secrets: Telegram at the fake, channels
    that notice a stopped reader within seconds, tools allowed to reach the effect server on a
    private address."""
    return {"EVENTOS_CHANNELS_TELEGRAM_API": telegram_api, "EVENTOS_CHANNELS_POLL_TIMEOUT_S": "5",
            "EVENTOS_CHANNELS_REFRESH_S": "1", "EVENTOS_CHANNELS_LEASE_TTL_S": "5",
            "EVENTOS_OUTBOUND_ALLOW_PRIVATE": "true",
            "EVENTOS_SECRETS_PURPOSES": PURPOSES}  # fmt: skip


def run(config: Config, workdir: Path) -> Result:
    """One fault run in `workdir` (the instance's state and logs stay there)."""
    return asyncio.run(_run(config, workdir))


async def _run(config: Config, workdir: Path) -> Result:
    fake = FakeTelegram()
    await fake.start()
    try:
        bot = fake.add_bot("fx_shop_bot")
        fake.send_latency_s = TELEGRAM_LATENCY_S
        with EffectTarget(config.seed) as target:
            specs_dir = workdir / "employees"
            specs_dir.mkdir(parents=True, exist_ok=True)
            for name, text in specs().items():
                (specs_dir / f"{name}.yaml").write_text(text)
            env = {**secret_env(bot), **service_env(fake.base_url)}
            instance = Instance(workdir, specs_dir, env, config.tier, say=progress)
            await asyncio.to_thread(instance.start)
            try:
                return await load_and_faults(config, local_stage(instance), fake, bot, target,
                                             workdir)  # fmt: skip
            finally:
                await asyncio.to_thread(instance.stop)
    finally:
        await fake.stop()


async def load_and_faults(
    config: Config, stage: Stage, fake: FakeTelegram, bot: str, target: EffectTarget,
    workdir: Path,
) -> Result:  # fmt: skip
    """The load through the planned faults, the drain, and the ledger."""
    book = Book()
    load = Load(book, random.Random(config.seed), config.rates, stage.ingress_url,
                stage.ingress_grpc, stage.admin_token, fake, bot, target, workdir)  # fmt: skip
    faults = plan(config.seed, stage.victims, config.profile)
    executor = Executor(stage.target, faults, progress)
    try:
        await load.setup()
        load.start()
        executor.start(time.time())
        await _until_faults_done(executor, load, len(faults))
        await load.stop_sending()
        with stage.database() as url:
            drained = await _drain(load, url, config.drain_s)
            progress(
                f"drained in {drained:.0f} s"
                if drained >= 0
                else f"not drained after {config.drain_s:g} s: the ledger names what is left"
            )
            receivers = Receivers(
                fake.sent(bot), {tag: target.reached(f"/effect/{tag}") for tag in book.tools}
            )
            ledger = await asyncio.to_thread(account, config.seed, url, book, receivers,
                                             executor.done)  # fmt: skip
        late = await asyncio.to_thread(stage.late_tasks)
        ledger.lines.append(Line("workflow tasks finished past their timeout",
                                 ", ".join(f"{n} {c}" for n, c in late.items() if c) or "0",
                                 checked=False))  # fmt: skip
        ledger.lines.append(
            Line(
                "the harness itself",
                "senders and schedule",
                [*load.errors, *([f"schedule: {executor.error!r}"] if executor.error else [])],
            )
        )
        return Result(ledger, faults, executor.done, dict(book.counts()))
    finally:
        executor.stop()
        await load.close()


def _late_tasks(instance: Instance) -> dict[str, int]:
    """Workflow tasks a worker finished after Temporal had timed them out (their work is done
    again), from the workers' logs: a figure of how the instance coped."""
    counts = {}
    for name, svc in instance.stack.services.items():
        if svc.log_path.exists():
            with svc.log_path.open(errors="replace") as log:
                counts[name] = sum(LATE_TASK in line for line in log)
    return counts


async def _until_faults_done(executor: Executor, load: Load, planned: int) -> None:
    """Load runs through the whole plan, and TAIL_S after the last fault is back."""
    last = time.monotonic()
    while not executor.finished:
        await asyncio.sleep(1.0)
        if time.monotonic() - last >= PROGRESS_S:
            last = time.monotonic()
            counts = dict(load.book.counts())
            progress(
                f"acknowledged {sum(counts.values())} {counts}; faults "
                f"{len(executor.done)}/{planned}; unanswered {len(load.unanswered)}"
            )
    await asyncio.sleep(TAIL_S)


async def _drain(load: Load, url: str, deadline_s: float) -> float:
    """Seconds until every event is answered and settled and every stream read; -1 after
    the deadline."""
    began = time.monotonic()
    while time.monotonic() - began < deadline_s:
        if load.settled() and await asyncio.to_thread(_settled, url, load):
            return time.monotonic() - began
        await asyncio.sleep(1.0)
    return -1.0


def _settled(url: str, load: Load) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        (open_,) = conn.execute(QUIET).fetchone() or (1,)
        heads = conn.execute(STREAM_HEADS).fetchall()
    read = load.book.read_through()
    return open_ == 0 and all(read.get(a, 0) >= head and not unplaced
                              for a, head, unplaced in heads)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=15.0, help="length of the faulted load (15)")
    p.add_argument("--seed", type=int, help="replay a run (default: a new seed)")
    p.add_argument("--tier", choices=("S", "L"), default="S",
                   help="L: the full Temporal server on the instance's PostgreSQL")  # fmt: skip
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, database)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    exit_on_signals()
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    config = Config(seed, Profile.for_minutes(args.minutes), tier=args.tier)
    print(f"seed {seed}  (replay: {config.replay()})", flush=True)
    pr = config.profile
    progress(
        f"{pr.kills_each} kills of each process, PostgreSQL lost {pr.postgres_losses}x "
        f"{pr.postgres_s:g} s, Temporal {pr.temporal_losses}x {pr.temporal_s:g} s; "
        f"~{config.rates.total():.1f} new events/s"
    )
    workdir = Path(tempfile.mkdtemp(prefix="eventos-faults-"))
    keep = args.keep
    try:
        result = run(config, workdir)
        print(result.ledger.render(), flush=True)
        keep = keep or not result.ledger.ok
        return 0 if result.ledger.ok else 1
    except KeyboardInterrupt:
        progress("interrupted; everything started was stopped")
        return 130
    finally:
        if keep:
            progress(f"work folder kept: {workdir} (logs in .eventos/logs)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
