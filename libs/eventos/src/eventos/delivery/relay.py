"""The relay (SPEC §8 step 3): leased streams → Signal-With-Start → `delivered_seq`.

Per claimed stream, gates in order: the generation runs (else its inputs are dead(reset)),
no hold, background work (C3, C4) only while the employee's budget is normal (else hold
`budget`, lifted by the ledger) and the employee is not degraded (else hold `degraded`, lifted
when it recovers: eventos.health), room in the window (32 inputs or 512 KB delivered and
unconsumed, else hold `window`). Then batches of at most 16 inputs or 256 KB go to the
entity by known id, one call in flight per stream, at most 4 per entity per second;
`delivered_seq` is committed only after Temporal accepted, and only while our lease's
fencing token is still current.
A repeat after a crash between accept and commit is dropped by the entity (seq ≤ applied).
A stream whose entity waits for a turn slot of its top pending class or a higher one, and takes
what was held for it when granted, is not claimed: its grant hands the inputs over
(eventos.delivery.held).

A pass claims up to 256 streams and serves 64 of them at once, the next starting as one is done.
Their statements are grouped: the reads (and the commits, and the lease releases) asked for while
one such statement runs go together in the next one, each with its stream's own result (a commit
fenced off is that stream's alone). A stream's read takes what its window can hold, so its next
batches go from the same read (the gates as that read saw them); it is read again, right after
a commit on the same connection, only when that read may have left inputs out. The commit of a
stream's last batch of the pass gives its lease back in the same statement.

Claimed streams are served class by class, owner first. The relay service runs two lanes
(`lanes`): one claims the streams whose top pending input is the owner's (C1), the other the
rest, each with its own loop, serving places and statements, so an owner's input never waits
for a pass over background streams; a stream is leased by one lane at a time, and the lanes share
the per-entity rate, the breaker and the pushback. The owner's own conversations (owner chat)
start on the owner's workflow queue when `owner_task_queue` is set (names.owner_queue).

When Temporal pushes back (RESOURCE_EXHAUSTED) the lowest class still served pauses first, the
calls per pass halve (from 64, and grow back one per accepted call), and for the next 30 s the
calls of each pass are shared among the classes by deficit round-robin weighted by their floors,
one batch per stream, so no class starves and none takes the others' share.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter, defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar

from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client
from temporalio.common import Priority, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from eventos import names
from eventos.contracts import DeliverBatch, DeliveryItem, StreamCursor
from eventos.db import Conn
from eventos.db.sql import Q
from eventos.runtime.metrics import BREAKERS_OPEN, DEAD_RESET, RELAY_LAG, class_label, count_dead
from eventos.runtime.payload_guard import PayloadTooLarge
from eventos.runtime.temporal import TemporalConnection
from eventos.runtime.wake import WakeSignal
from eventos.settings import TurnTimeouts
from eventos.spec.model import resolve_flags

log = logging.getLogger(__name__)

LEASE_TTL_S = 30.0
# A Signal-With-Start's deadline: a frontend that stopped answering on a live connection (a
# half-open TCP path, a stuck proxy) fails the call as DEADLINE_EXCEEDED, which opens the
# breaker, instead of holding the stream's lease and a serving slot until TCP gives up. Well
# under the lease's 30 s; a call that took effect meanwhile is delivered again and dropped by
# the entity (seq <= applied).
SIGNAL_WITH_START_TIMEOUT_S = 10.0
CLAIM_LIMIT = 256  # streams claimed per pass
STREAMS_AT_ONCE = 64  # of those, served at once (each with one call in flight); also the most
# calls per pass while pushback shapes the passes
PROBE_INTERVAL_S = 5.0
PER_ENTITY_PER_SECOND = 4
# A stream's read takes what its window can hold and one more (33 inputs, or until 512 KB): the
# batches after the first go from the same read, and a read that came back short of that has
# seen every pending input (one that did not ends at the window's hold, or is read again).
READ_AHEAD_INPUTS = names.WINDOW_MAX_INPUTS + 1
READ_AHEAD_BYTES = names.WINDOW_MAX_BYTES
MAX_CLASS_PAUSE_S = 30.0
PUSHBACK_MEMORY_S = 30.0  # passes stay shaped this long after the last pushback
# Deficit round-robin quanta: calls per round in proportion to the class floors.
QUANTUM = {c: f / min(names.CLASS_FLOORS.values()) for c, f in names.CLASS_FLOORS.items()}
# Refusals that will not change on a retry: the input itself is the problem.
DETERMINISTIC = {RPCStatusCode.INVALID_ARGUMENT, RPCStatusCode.FAILED_PRECONDITION}
BACKGROUND = (names.C3_INTERNAL, names.C4_BACKGROUND)
UNAVAILABLE = {RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED}


Rows = list[dict[str, Any]]
# stream_key, fencing token, through seq, read it again, give the lease back
Commit = tuple[str, int, int, bool, bool]
Committed = tuple[bool, Rows]  # committed (else the lease was taken over), the stream read again
K = TypeVar("K")
R = TypeVar("R")


class Grouped(Generic[K, R]):
    """One statement for many callers: the first call runs at once, and the calls that arrive
    while a statement runs go together in the next one. `run` answers each key (a key missing
    from its answer gets `missing`)."""

    def __init__(self, run: Callable[[list[K]], Awaitable[dict[K, R]]], missing: R) -> None:
        self._run = run
        self._missing = missing
        self._waiting: list[tuple[K, asyncio.Future[R]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def __call__(self, key: K) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((key, future))
        if self._flushing is None:
            self._flushing = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self._waiting:
                group, self._waiting = self._waiting, []
                try:
                    answers = await self._run([key for key, _ in group])
                except Exception as exc:
                    for _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for key, future in group:
                    if not future.done():
                        future.set_result(answers.get(key, self._missing))
        finally:
            self._flushing = None


class StaleLease(Exception):
    """Another relay took the stream over: our commit was fenced off."""


class TemporalDown(Exception):
    """Temporal did not answer; the breaker opens."""


class TemporalBusy(Exception):
    """Temporal refused for now (pushback, or a refusal still under its attempt limit)."""


@dataclass
class Breaker:
    """Open while Temporal is unavailable; a probe every 5 s closes it."""

    probe_interval_s: float = PROBE_INTERVAL_S
    open_until: float = 0.0
    opened: bool = False

    def trip(self) -> None:
        self.opened = True
        self.open_until = time.monotonic() + self.probe_interval_s
        BREAKERS_OPEN.labels("temporal").set(1)

    def close(self) -> None:
        self.opened = False
        BREAKERS_OPEN.labels("temporal").set(0)

    def may_probe(self) -> bool:
        return self.opened and time.monotonic() >= self.open_until


@dataclass
class ClassShares:
    """Deficit round-robin between classes: each visit adds the class's quantum of credit and
    spends it a call at a time; a pass that runs out of calls resumes at the same class."""

    deficit: dict[int, float] = field(default_factory=dict)
    at: int = 0  # index in names.CLASSES of the class being visited
    credited: bool = False  # that class already got this round's quantum

    def split(self, waiting: dict[int, int], budget: int) -> dict[int, int]:
        """How many of each class's waiting streams to serve with `budget` calls."""
        grant = dict.fromkeys(names.CLASSES, 0)

        def left(c: int) -> int:
            return waiting.get(c, 0) - grant[c]

        while budget > 0 and any(left(c) > 0 for c in names.CLASSES):
            c = names.CLASSES[self.at]
            if left(c) > 0:
                if not self.credited:
                    self.deficit[c] = self.deficit.get(c, 0.0) + QUANTUM[c]
                    self.credited = True
                while self.deficit[c] >= 1 and left(c) > 0 and budget > 0:
                    grant[c] += 1
                    self.deficit[c] -= 1
                    budget -= 1
                if budget == 0 and left(c) > 0 and self.deficit[c] >= 1:
                    break  # out of calls mid-visit: the next pass goes on here
            if left(c) <= 0:
                self.deficit[c] = 0.0  # nothing waiting keeps no credit
            self.at = (self.at + 1) % len(names.CLASSES)
            self.credited = False
        return {c: n for c, n in grant.items() if n}


@dataclass
class Pushback:
    """What RESOURCE_EXHAUSTED did: the lowest class served pauses first (0.5 s doubling up
    to 30 s), the calls per pass halve, and passes are shaped by class shares meanwhile."""

    until: dict[int, float] = field(default_factory=dict)
    step: dict[int, float] = field(default_factory=dict)
    budget: int = STREAMS_AT_ONCE
    last_at: float | None = None
    shares: ClassShares = field(default_factory=ClassShares)

    def active(self) -> list[int]:
        now = time.monotonic()
        return [c for c in names.CLASSES if self.until.get(c, 0.0) <= now]

    def shaping(self) -> bool:
        return self.last_at is not None and time.monotonic() - self.last_at < PUSHBACK_MEMORY_S

    def push_back(self) -> int:
        """Pause the lowest class not paused yet (or lengthen the lowest's pause)."""
        now = time.monotonic()
        self.last_at = now
        self.budget = max(1, self.budget // 2)
        running = [c for c in names.CLASSES if self.until.get(c, 0.0) <= now]
        klass = running[-1] if running else names.CLASSES[-1]
        self.step[klass] = min(MAX_CLASS_PAUSE_S, self.step.get(klass, 0.5) * 2)
        self.until[klass] = now + self.step[klass]
        return klass

    def relax(self, klass: int) -> None:
        self.step.pop(klass, None)
        self.budget = min(STREAMS_AT_ONCE, self.budget + 1)


def take_batch(rows: list[dict[str, Any]], room_inputs: int, room_bytes: int) -> list[DeliveryItem]:
    """The longest prefix within 16 inputs, 256 KB and the window's room (at least one)."""
    batch: list[DeliveryItem] = []
    size = 0
    for row in rows:
        item = DeliveryItem.from_row(row)
        too_many = len(batch) >= min(names.BATCH_MAX_ITEMS, room_inputs)
        too_big = size + item.size > min(names.BATCH_MAX_BYTES, room_bytes)
        if batch and (too_many or too_big):
            break
        batch.append(item)
        size += item.size
    return batch


def after_batch(rows: Rows, batch: list[DeliveryItem]) -> Rows:
    """The stream as it stands once `batch` (a prefix of `rows`) is committed, from the same
    read: the inputs after it, headed by the stream's row with the batch added to its
    `delivered_seq` and its window (empty when the read held no more)."""
    rest = rows[len(batch) :]
    if not rest:
        return []
    head = {**rest[0], "delivered_seq": batch[-1].seq, "read_more": rows[0]["read_more"],
            "window_inputs": int(rows[0]["window_inputs"]) + len(batch),
            "window_bytes": int(rows[0]["window_bytes"]) + sum(i.size for i in batch)}  # fmt: skip
    return [head, *rest[1:]]


@dataclass
class Relay:
    """One relay process's loop over the streams it leases."""

    pool: AsyncConnectionPool[Conn]
    temporal: TemporalConnection
    relay_id: str
    task_queue: str = names.WORKFLOW_QUEUE
    # Where the owner's conversations start (names.owner_queue(task_queue) in the relay service,
    # whose workers-workflow poll it); None: on `task_queue` like the rest.
    owner_task_queue: str | None = None
    # Where the other conversations' turns run (names.turn_queue(task_queue) in the relay
    # service, whose workers-workflow poll it), put in each new run's cursor; None: on the
    # entity's queue. The owner's turns follow its conversation on the owner's queue.
    turn_task_queue: str | None = None
    classes: tuple[int, ...] = names.CLASSES  # the top pending classes this relay claims
    lease_ttl_s: float = LEASE_TTL_S
    entity_roll_after: int = names.ENTITY_ROLL_AFTER
    entity_idle_s: float | None = None  # None: the lane's default (SPEC §7)
    entity_cancel_grace_s: float = names.TURN_CANCEL_GRACE_S
    turn_timeouts: TurnTimeouts = field(default_factory=TurnTimeouts)  # each cursor carries them
    call_timeout_s: float = SIGNAL_WITH_START_TIMEOUT_S  # each Signal-With-Start's rpc_timeout
    breaker: Breaker = field(default_factory=Breaker)
    pauses: Pushback = field(default_factory=Pushback)
    clock: Callable[[], float] = time.monotonic  # of the per-entity rate; tests move it by hand
    _sent: dict[str, deque[float]] = field(default_factory=dict)
    _rate_free_at: float | None = None  # when the soonest rate-limited stream may send again
    _serving: set[str] = field(default_factory=set)
    _read: Grouped[str, Rows] = field(init=False)
    _commit_one: Grouped[Commit, Committed] = field(init=False)
    _release: Grouped[tuple[str, int], None] = field(init=False)
    _at_once: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(STREAMS_AT_ONCE))

    def __post_init__(self) -> None:
        BREAKERS_OPEN.labels("temporal").set(int(self.breaker.opened))
        self._read = Grouped(self._read_batches, [])
        self._commit_one = Grouped(self._commit_batches, (False, []))
        self._release = Grouped(self._release_leases, None)

    async def pass_once(self) -> int:
        """Claim streams and serve each; returns how many batches Temporal accepted."""
        if self.breaker.opened and (not self.breaker.may_probe() or not await self._probe()):
            return 0
        classes = [c for c in self.pauses.active() if c in self.classes]
        if not classes:
            return 0
        async with self.pool.connection() as conn:
            params = {"owner": self.relay_id, "classes": classes, "limit": CLAIM_LIMIT,
                      "ttl_s": self.lease_ttl_s}  # fmt: skip
            cur = await conn.execute(Q["stream_claim"], params)
            leases = [(str(r["stream_key"]), int(r["fencing_token"]), int(r["top_pending_class"]))
                      for r in await cur.fetchall()]  # fmt: skip
        batches = None  # as many as each stream has
        if self.pauses.shaping():
            leases = await self._share(leases)
            batches = 1
        sent = 0
        for klass in names.CLASSES:  # owner first
            mine = [(key, token) for key, token, c in leases if c == klass]
            results = await asyncio.gather(*(self._serve_one(k, t, batches) for k, t in mine))
            sent += sum(results)
        return sent

    async def _serve_one(self, stream_key: str, token: int, batches: int | None) -> int:
        """Serve a claimed stream once one of the `STREAMS_AT_ONCE` places is free."""
        async with self._at_once:
            return await self._serve(stream_key, token, batches)

    async def _share(self, leases: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
        """Keep the streams the class shares grant this pass; give the other leases back."""
        grant = self.pauses.shares.split(Counter(c for _, _, c in leases), self.pauses.budget)
        kept: list[tuple[str, int, int]] = []
        back: list[tuple[str, int, int]] = []
        for lease in leases:
            klass = lease[2]
            if grant.get(klass, 0) > 0:
                grant[klass] -= 1
                kept.append(lease)
            else:
                back.append(lease)
        if back:
            await self._release_leases([(key, token) for key, token, _ in back])
        return kept

    async def _probe(self) -> bool:
        try:
            await self.temporal.ready()
        except Exception as exc:
            self.breaker.trip()
            await self._record_breaker(str(exc) or type(exc).__name__)
            return False
        log.info("Temporal answers again: breaker closed")
        self.breaker.close()
        await self._record_breaker(None)
        return True

    async def _record_breaker(self, error: str | None) -> None:
        """Tell the database the breaker's state (open, with its next probe, or closed), so
        the owner API can say why inputs wait without asking Temporal (I2). Best effort: the
        database may be down too."""
        params = {"relay_id": self.relay_id, "open": self.breaker.opened,
                  "probe_s": self.breaker.probe_interval_s,
                  "error": (error or "")[:500] or None}  # fmt: skip
        try:
            async with self.pool.connection() as conn:
                await conn.execute(Q["relay_breaker_save"], params)
        except Exception as exc:
            log.warning("could not record the Temporal breaker's state: %s", exc)

    async def _serve(self, stream_key: str, token: int, batches: int | None = None) -> int:
        if stream_key in self._serving:  # cannot happen with one loop; cheap to make sure
            return 0
        self._serving.add(stream_key)
        try:
            return await self._serve_leased(stream_key, token, batches)
        finally:
            self._serving.discard(stream_key)
            sent = self._sent.get(stream_key)
            if sent and self.clock() - sent[-1] >= 1.0:
                del self._sent[stream_key]  # only the last second matters: keep memory bounded

    async def _serve_leased(self, stream_key: str, token: int, batches: int | None) -> int:
        sent, released = 0, False
        try:
            found = await self._read(stream_key)
            while found and (batches is None or sent < batches):
                read_next = batches is None or sent + 1 < batches
                delivered, found, released = await self._one_batch(stream_key, token, found,
                                                                   read_next)  # fmt: skip
                sent += delivered
        except StaleLease:
            log.warning("lease on %s was taken over; stopping there", stream_key)
            return sent
        except TemporalDown as exc:
            log.warning("Temporal unavailable (%s): breaker open, probing every 5 s", exc)
            opened = not self.breaker.opened
            self.breaker.trip()
            if opened:
                await self._record_breaker(str(exc))
        except TemporalBusy:
            pass  # the stream is served again on a later pass
        except Exception:
            log.exception("relay failed on %s", stream_key)
        if not released:
            await self._release((stream_key, token))
        return sent

    def _rate_ok(self, stream_key: str) -> bool:
        sent = self._sent.setdefault(stream_key, deque(maxlen=PER_ENTITY_PER_SECOND))
        if len(sent) < PER_ENTITY_PER_SECOND or self.clock() - sent[0] >= 1.0:
            return True
        free_at = sent[0] + 1.0
        self._rate_free_at = min(free_at, self._rate_free_at or free_at)
        return False

    def idle_wait(self, poll_s: float) -> float:
        """How long an idle loop may wait: the poll interval, or less when a stream held back
        by the per-entity rate may send sooner."""
        free_at, self._rate_free_at = self._rate_free_at, None
        if free_at is None:
            return poll_s
        return min(poll_s, max(0.0, free_at - self.clock()))

    async def _one_batch(
        self, stream_key: str, token: int, found: list[dict[str, Any]], read_next: bool
    ) -> tuple[bool, list[dict[str, Any]], bool]:
        """Gates on the stream as `found` (its row with its next pending inputs), then one
        Signal-With-Start: (a batch was delivered, the stream as it stands after the commit
        when `read_next` — the rest of the same read, or read again when that read may have
        left some out —, the lease was given back with the commit)."""
        if not self._rate_ok(stream_key) or found[0]["hold_reason"] is not None:
            return False, [], False
        stream = found[0]
        if stream["generation_state"] not in (names.GEN_RUNNING, names.GEN_PAUSED):
            async with self.pool.connection() as conn:
                await self._kill(conn, stream_key)
            return False, [], False
        rows = [r for r in found if r["seq"] is not None]
        if not rows:
            if stream["top_pending_class"] is not None:  # nothing sendable: stop claiming it
                async with self.pool.connection() as conn:
                    await conn.execute(Q["stream_refresh_pending"], {"stream_key": stream_key})
            return False, [], False
        top_class = min(int(r["class"]) for r in rows)
        if stream["budget_state"] != names.BUDGET_NORMAL and top_class in BACKGROUND:
            # Background work past 80% of the budget waits; the ledger lifts the hold.
            async with self.pool.connection() as conn:
                await conn.execute(Q["stream_hold_budget"], {"stream_key": stream_key})
            return False, [], False
        if stream["degraded"] and top_class in BACKGROUND:
            # A degraded employee's background work waits too (SPEC §12); recovery lifts it.
            async with self.pool.connection() as conn:
                await conn.execute(Q["stream_hold_degraded"], {"stream_key": stream_key})
            return False, [], False
        room_inputs = names.WINDOW_MAX_INPUTS - int(stream["window_inputs"])
        room_bytes = names.WINDOW_MAX_BYTES - int(stream["window_bytes"])
        if room_inputs <= 0 or room_bytes <= 0:
            async with self.pool.connection() as conn:
                await self._hold_window(conn, stream_key)
            return False, [], False
        if any(r["type"] == names.TYPE_TRIGGER_CRON for r in rows) and await self._expire_ticks(
            stream_key
        ):
            return False, await self._read(stream_key), False  # send what is left
        batch = take_batch(rows, room_inputs, room_bytes)
        if not await self._send(stream, batch):
            return False, await self._read(stream_key), False  # a dead letter: try the rest
        now = time.monotonic()
        for row in rows[: len(batch)]:  # written `age_s` before the read, read at `read_at`
            lag = float(row["age_s"]) + now - float(row["read_at"])
            RELAY_LAG.labels(class_label(int(row["class"]))).observe(max(lag, 0.0))
        rest = after_batch(rows, batch) if read_next else []
        again = read_next and not rest and bool(stream["read_more"])
        done = not rest and not again
        found = await self._commit(stream_key, token, batch[-1].seq, again, release=done)
        return True, rest or found, done

    async def _expire_ticks(self, stream_key: str) -> bool:
        """Expire the stream's cron ticks a newer one superseded or older than one interval
        (SPEC §15: a hold just lifted must not run them); whether any was."""
        async with self.pool.connection() as conn:
            params = {"subscriptions": [], "stream_keys": [stream_key]}
            cur = await conn.execute(Q["cron_ticks_expire"], params)
            return bool(await cur.fetchall())

    async def _hold_window(self, conn: Conn, stream_key: str) -> None:
        """Hold the stream while its window is still full, counted under the stream's lock."""
        params = {"stream_key": stream_key, "max_inputs": names.WINDOW_MAX_INPUTS,
                  "max_bytes": names.WINDOW_MAX_BYTES}  # fmt: skip
        async with conn.transaction():
            await conn.execute(Q["stream_lock"], params)
            await conn.execute(Q["stream_hold_window"], params)

    async def _send(self, stream: dict[str, Any], batch: list[DeliveryItem]) -> bool:
        """Signal-With-Start; True when Temporal accepted the batch.

        The cursor (used only when this call starts a new run) says the run has applied
        everything delivered so far and reads back from the database what was delivered and
        not consumed: a run that replaces a lost one (Temporal lost it, or it was terminated)
        starts with the inputs its predecessor held, not only this batch."""
        cursor = StreamCursor(
            stream_key=stream["stream_key"], employee=stream["employee"],
            generation=int(stream["generation"]), lane=stream["lane"], thread=stream["thread"],
            applied_seq=int(stream["delivered_seq"]), reload_after=int(stream["consumed_seq"]),
            roll_after=self.entity_roll_after, idle_s=self.entity_idle_s,
            cancel_grace_s=self.entity_cancel_grace_s, flags=resolve_flags(stream["flags"]),
            send_timeout_s=self.turn_timeouts.send_s,
            llm_heartbeat_s=self.turn_timeouts.llm_heartbeat_s,
            turn_queue=self._turn_queue_of(stream),
        )  # fmt: skip
        try:
            client: Client = await self.temporal.get()
            await client.start_workflow(
                names.WF_CONVERSATION,
                cursor,
                id=stream["entity_id"],
                task_queue=self._queue_of(stream),
                start_signal=names.SIGNAL_DELIVER,
                start_signal_args=[DeliverBatch(stream["stream_key"], batch)],
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                priority=Priority(
                    priority_key=names.LANE_PRIORITY.get(stream["lane"], names.C3_INTERNAL),
                    fairness_key=stream["employee"],
                ),
                rpc_timeout=timedelta(seconds=self.call_timeout_s),
            )
        except RPCError as exc:
            return await self._refused(stream["stream_key"], batch, exc)
        except PayloadTooLarge as exc:  # refused before it left: deterministic too
            return await self._rejected(stream["stream_key"], batch, f"rejected: {exc}")
        except (RuntimeError, OSError) as exc:  # no connection could be made
            raise TemporalDown(str(exc)) from exc
        self._sent.setdefault(stream["stream_key"], deque(maxlen=PER_ENTITY_PER_SECOND)).append(
            self.clock()
        )
        self.pauses.relax(min(item.klass for item in batch))
        return True

    def _queue_of(self, stream: dict[str, Any]) -> str:
        """The workflow queue a run of the stream's entity starts on (a running one keeps its)."""
        owners = names.owners_conversation(stream["stream_key"], stream["thread"])
        return self.owner_task_queue if owners and self.owner_task_queue else self.task_queue

    def _turn_queue_of(self, stream: dict[str, Any]) -> str | None:
        """The workflow queue the turns of a new run of the stream's entity run on."""
        if self.owner_task_queue and names.owners_conversation(stream["stream_key"],
                                                               stream["thread"]):  # fmt: skip
            return None  # beside their conversation, on the owner's queue
        return self.turn_task_queue

    async def _refused(self, stream_key: str, batch: list[DeliveryItem], exc: RPCError) -> bool:
        if exc.status in UNAVAILABLE:
            raise TemporalDown(str(exc)) from exc
        if exc.status == RPCStatusCode.RESOURCE_EXHAUSTED:
            klass = self.pauses.push_back()
            log.warning("Temporal pushes back: class %d slowed", klass)
            raise TemporalBusy() from exc
        if exc.status not in DETERMINISTIC:
            raise TemporalDown(str(exc)) from exc
        return await self._rejected(
            stream_key, batch, f"rejected: {exc.status.name}: {exc.message}"
        )

    async def _rejected(self, stream_key: str, batch: list[DeliveryItem], why: str) -> bool:
        """Count a refusal on the batch's first input; dead-letter it after 5 (never blocks)."""
        first = batch[0].seq
        reason = why[:500]
        params = {"stream_key": stream_key, "seq": first, "reason": reason}
        async with self.pool.connection() as conn:
            cur = await conn.execute(Q["delivery_rejected"], params)
            attempts = int((await cur.fetchone() or {"attempts": 0})["attempts"])
        # Raised outside the block: an exception inside it would roll the count back.
        if attempts < names.DEAD_AFTER_ATTEMPTS:
            raise TemporalBusy()
        async with self.pool.connection() as conn, conn.transaction():
            dead = await conn.execute(Q["delivery_dead_letter"], params)
            await conn.execute(Q["stream_refresh_pending"], {"stream_key": stream_key})
        count_dead(reason, dead.rowcount)
        log.warning("dead-lettered %s seq %d after %d refusals", stream_key, first, attempts)
        return False

    async def _commit(
        self,
        stream_key: str,
        token: int,
        through: int,
        read_next: bool = False,
        *,
        release: bool = False,
    ) -> list[dict[str, Any]]:
        """Commit `delivered_seq` through `through` under our lease (giving it back with
        `release`); with `read_next`, the stream as read right after (as `stream_next_batches`:
        empty with nothing pending)."""
        commit = (stream_key, token, through, read_next, release)
        committed, found = await self._commit_one(commit)
        if not committed:
            raise StaleLease(stream_key)
        return found

    async def _read_batches(self, stream_keys: list[str]) -> dict[str, Rows]:
        async with self.pool.connection() as conn:
            return await self._read_statement(conn, stream_keys)

    async def _read_statement(self, conn: Conn, stream_keys: list[str]) -> dict[str, Rows]:
        params = {"stream_keys": stream_keys, "limit": READ_AHEAD_INPUTS,
                  "max_bytes": READ_AHEAD_BYTES}  # fmt: skip
        cur = await conn.execute(Q["stream_next_batches"], params)
        found: dict[str, Rows] = defaultdict(list)
        read_at = time.monotonic()
        for row in await cur.fetchall():
            row["read_at"] = read_at
            found[row["stream_key"]].append(row)
        for rows in found.values():  # the read may have left inputs out: read again after it
            pending = [r for r in rows if r["seq"] is not None]
            size = sum(int(r["size"]) for r in pending)
            rows[0]["read_more"] = len(pending) >= READ_AHEAD_INPUTS or size >= READ_AHEAD_BYTES
        return found

    async def _commit_batches(self, batches: list[Commit]) -> dict[Commit, Committed]:
        """One commit for every batch (one statement, atomic on its own), then one read of the
        committed streams that asked. A statement that fails (a deadlock with another
        transaction over several streams' rows, say) fails every stream of the group: their
        batches go again on a later pass and the entities drop the repeats."""
        params = {"stream_keys": [b[0] for b in batches], "tokens": [b[1] for b in batches],
                  "throughs": [b[2] for b in batches], "releases": [b[4] for b in batches],
                  "owner": self.relay_id}  # fmt: skip
        again = [b[0] for b in batches if b[3]]
        async with self.pool.connection() as conn:
            cur = await conn.execute(Q["stream_commit_delivered"], params)
            committed = {r["stream_key"] for r in await cur.fetchall()}
            again = [key for key in again if key in committed]
            found = await self._read_statement(conn, again) if again else {}
        return {b: (b[0] in committed, found.get(b[0], [])) for b in batches}

    async def _release_leases(self, leases: list[tuple[str, int]]) -> dict[tuple[str, int], None]:
        """Give leases back early (only those we still hold, by their tokens)."""
        params = {"stream_keys": [k for k, _ in leases], "tokens": [t for _, t in leases],
                  "owner": self.relay_id}  # fmt: skip
        async with self.pool.connection() as conn:
            await conn.execute(Q["leases_release"], params)
        return {}

    async def _kill(self, conn: Conn, stream_key: str) -> None:
        async with conn.transaction():
            killed = await conn.execute(Q["deliveries_kill_stream"], {"stream_key": stream_key})
            await conn.execute(Q["stream_refresh_pending"], {"stream_key": stream_key})
        count_dead(DEAD_RESET, killed.rowcount)


def lanes(relay: Relay) -> tuple[Relay, Relay]:
    """The owner's lane (streams whose top pending input is C1) and the others' lane of
    `relay`: each claims its own streams under its own lease owner and serves them with its own
    places and grouped statements; they share the per-entity rate, the streams being served,
    the breaker and the pushback (dataclasses.replace passes the same objects)."""
    owner = dataclasses.replace(relay, relay_id=f"{relay.relay_id}:c1", classes=(names.C1_OWNER,),
                                _at_once=asyncio.Semaphore(STREAMS_AT_ONCE))  # fmt: skip
    others = tuple(c for c in relay.classes if c != names.C1_OWNER)
    return owner, dataclasses.replace(relay, classes=others,
                                      _at_once=asyncio.Semaphore(STREAMS_AT_ONCE))  # fmt: skip


async def lanes_loop(relay: Relay, wake: WakeSignal, poll_s: float) -> None:
    """The relay service's delivery: the owner's lane and the others' (`lanes`), each in a
    loop of its own waking on kicks of its own, so an owner's input is served while a pass over
    background streams still runs."""
    async with asyncio.TaskGroup() as group:
        for lane in lanes(relay):
            group.create_task(relay_loop(lane, wake.fork(), poll_s))


async def relay_loop(relay: Relay, wake: WakeSignal, poll_s: float) -> None:
    """Serve streams while there is work; otherwise wait for a kick or the poll interval."""
    while True:
        try:
            sent = await relay.pass_once()
        except Exception:
            log.exception("relay pass failed")
            sent = 0
        if not sent:
            await wake.wait(relay.idle_wait(poll_s))
