"""The steady mixed load of the fault run, and its receivers.

Senders, each at its own rate (exponential gaps from the run's seed), each acting as its real
counterpart would under faults:
- signed webhooks (Stripe's scheme and HMAC with an event-id header) over three employees and
  two paths each; a refused or unanswered one is sent again with the same id, as providers do,
  and a few answered ones are sent again anyway (a provider's duplicate delivery);
- owner chat from two users and the admin; a message that got no 202 is sent again with the
  same client id; some messages ask for an `http_request` (an unsafe POST to a loopback server
  that counts what arrives);
- driver events over gRPC `EventIngress.Publish` through the driver client library (its durable
  outbox resends whatever the bus did not answer);
- Telegram customers writing through the loopback Bot API fake (its updates stay until the
  reader confirms them).
Receivers: each audience's owner-chat event stream (SSE, resumed with Last-Event-ID), the
Telegram fake's sent messages and the loopback server's requests.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import hmac
import json
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from faults_book import CHAT, DRIVER, TELEGRAM, WEBHOOK, Acked, Attempt, Book

from eventos import names
from eventos.bus.driver import AckResult, AckStatus, Backoff, DriverClient, DriverOutbox
from eventos.owner import chat

TESTS = Path(__file__).resolve().parent.parent / "tests"  # the provider fakes live there
sys.path.insert(0, str(TESTS))
from fake_telegram import FakeTelegram  # noqa: E402

FRONT = "fx-front"  # takes chat, Telegram, the driver and tool calls
EMPLOYEES = (FRONT, "fx-ops", "fx-billing")
DRIVER_ID = "drv-1"
ACCOUNT = "tg-fx"
USERS = ("ann", "bob")
ADMIN = "owner"  # the admin's audience
CUSTOMERS = 6  # per webhook path, threaded by customer
SUBJECTS = 6  # driver event subjects (threads)
CHATS = 8  # Telegram customers
SECRETS = {"fx-stripe": "whsec_fault_run_stripe", "fx-hmac": "fault-run-hmac",
           "driver-drv-1": "fault-run-driver-token-0123"}  # fmt: skip
# What each is for, as the run's operator declares it (driver-drv-1 is `driver` by default).
PURPOSES = f"fx-stripe=webhook fx-hmac=webhook {ACCOUNT}=channel"
SEND_TIMEOUT_S = 10.0
RETRY_S = (1.0, 2.0, 4.0, 8.0, 15.0)  # then every 15 s, as long as the run lasts
RESEND_SHARE = 0.05  # answered webhooks sent again later (a provider's duplicate)
# Replies and effects take a while where they arrive, so a kill often finds one under way.
EFFECT_LATENCY_S = (0.2, 3.0)
TELEGRAM_LATENCY_S = (0.1, 1.5)
CONFIRM_POLL_S = 0.5
STREAM_RETRY_S = 1.0


@dataclass(frozen=True)
class Rates:
    """New events per second, per sender."""

    webhooks: float = 1.8
    driver: float = 0.8
    chat: float = 0.12  # per audience: two users and the admin
    telegram: float = 0.5
    tool_share: float = 0.25  # chat messages that ask for an http_request
    slow_share: float = 0.3  # chat and Telegram messages whose model step takes 1-3 s

    def total(self) -> float:
        return self.webhooks + self.driver + 3 * self.chat + self.telegram


def specs(effect_host: str = "127.0.0.1") -> dict[str, str]:
    """The employees of the run, as YAML specs by name (`fx-front`'s http_request may reach
    the effect server's host)."""
    docs = {}
    for name in EMPLOYEES:
        triggers = [
            f"{{kind: webhook, path: {name}/stripe, verify: {{scheme: stripe, secret: fx-stripe}},"
            " thread_by: data.body.customer}",
            f"{{kind: webhook, path: {name}/deploys, verify: {{scheme: hmac-sha256, "
            "secret: fx-hmac, header: X-Signature}, dedupe_header: X-Event-Id, "
            "thread_by: data.body.customer}",
        ]
        agent = "{name: main, model: {provider: local, name: scripted}, system: You help.}"
        if name in (FRONT, "fx-ops"):  # the driver's events fan out to two employees
            triggers.append(f"{{kind: grpc, driver: {DRIVER_ID}, thread_by: subject}}")
        if name == FRONT:
            triggers += ["{kind: chat}", f"{{kind: telegram, account: {ACCOUNT}}}"]
            agent = ("{name: main, model: {provider: local, name: scripted}, system: You help.,"
                     f" tools: [http_request], http_hosts: [{effect_host}]}}")  # fmt: skip
        lines = "\n".join(f"    - {t}" for t in triggers)
        docs[name] = (f"apiVersion: eventos/v1\nkind: Employee\nmetadata: {{name: {name}}}\n"
                      f"spec:\n  agents:\n    - {agent}\n  triggers:\n{lines}\n")  # fmt: skip
    return docs


def secret_env(bot_token: str) -> dict[str, str]:
    env = {f"EVENTOS_SECRET_{k.upper().replace('-', '_')}": v for k, v in SECRETS.items()}
    return {
        **env,
        f"EVENTOS_SECRET_{ACCOUNT.upper().replace('-', '_')}": bot_token,
        "EVENTOS_SECRETS_PURPOSES": PURPOSES,
    }


def _hex(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


@dataclass
class Hook:
    """One webhook event, sent until answered 2xx."""

    tag: str
    employee: str
    scheme: str
    customer: int
    tries: int = 0
    next_at: float = 0.0  # when to send it again (wall clock)

    @property
    def path(self) -> str:
        return f"{self.employee}/{self.scheme}"

    def request(self) -> tuple[bytes, dict[str, str]]:
        """The body and headers, signed now (Stripe's signature carries the time)."""
        doc = {"id": f"evt_{self.tag}", "object": "event", "type": "invoice.paid",
               "customer": f"cus_{self.customer}", "tag": self.tag}  # fmt: skip
        body = json.dumps(doc).encode()
        if self.scheme == "stripe":
            t = str(int(time.time()))
            sig = _hex(SECRETS["fx-stripe"], t.encode() + b"." + body)
            return body, {"Stripe-Signature": f"t={t},v1={sig}",
                          "content-type": "application/json"}  # fmt: skip
        return body, {"X-Signature": "sha256=" + _hex(SECRETS["fx-hmac"], body),
                      "X-Event-Id": self.tag, "content-type": "application/json"}  # fmt: skip

    @property
    def dedupe_key(self) -> str:
        return f"evt_{self.tag}" if self.scheme == "stripe" else f"h:{self.tag}"


@dataclass
class Message:
    """One owner-chat message of an audience, sent until answered 202."""

    tag: str
    audience: str
    text: str
    tries: int = 0
    next_at: float = 0.0


def delay(tries: int) -> float:
    return RETRY_S[min(tries, len(RETRY_S) - 1)]


@dataclass
class Load:
    """Every sender and receiver of one run, on one event loop."""

    book: Book
    rng: random.Random
    rates: Rates
    ingress_url: str
    ingress_grpc: str
    admin_token: str
    telegram: FakeTelegram
    bot: str
    target: EffectTarget
    workdir: Path
    tokens: dict[str, str] = field(default_factory=dict)  # audience → bearer token
    user_ids: dict[str, str] = field(default_factory=dict)  # user → its record's id
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    unanswered: dict[str, Hook | Message] = field(default_factory=dict)  # tag → the event
    updates: dict[int, tuple[str, float]] = field(default_factory=dict)  # update → tag, sent
    seqs: dict[int, tuple[str, float]] = field(default_factory=dict)  # driver seq → tag, sent
    errors: list[str] = field(default_factory=list)  # a sender that broke: a harness bug
    counters: dict[str, int] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    driver: DriverClient | None = None
    http: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(
        timeout=SEND_TIMEOUT_S, limits=httpx.Limits(max_connections=64)))  # fmt: skip

    def tag(self, channel: str) -> str:
        n = self.counters.get(channel, 0) + 1
        self.counters[channel] = n
        return f"fx-{channel}-{n}"

    async def setup(self) -> None:
        """The two users (their tokens are shown once)."""
        self.tokens[ADMIN] = self.admin_token
        for user in USERS:
            answer = await self.http.post(f"{self.ingress_url}/v1/users", json={"name": user},
                                          headers=self._auth(ADMIN))  # fmt: skip
            answer.raise_for_status()
            self.tokens[user] = answer.json()["token"]
            self.user_ids[user] = answer.json()["id"]

    def start(self) -> None:
        """Every sender and receiver, as tasks."""
        outbox = RecordingOutbox(self.workdir / "driver-outbox.sqlite", self._driver_acks)
        self.driver = DriverClient(self.ingress_grpc, DRIVER_ID, outbox, 120.0,
                                   ack_timeout_s=20.0, token=SECRETS["driver-drv-1"],
                                   backoff=Backoff(initial_s=0.2, max_s=5.0))  # fmt: skip
        jobs: list[Awaitable[None]] = [
            self._every(self.rates.webhooks, self._new_hook),
            self._every(self.rates.driver, self._new_driver_event),
            self._every(self.rates.telegram, self._new_customer_message),
            self._resend_loop(), self._confirm_loop(), self.driver.start(),
        ]  # fmt: skip
        for audience in (ADMIN, *USERS):
            jobs.append(
                self._every(self.rates.chat, functools.partial(self._new_message, audience))
            )
            jobs.append(self._follow(audience))
        self.tasks = [asyncio.create_task(self._guard(j)) for j in jobs]

    async def stop_sending(self) -> None:
        """No new events from here on (retries and receivers go on)."""
        self.stopping.set()

    def settled(self) -> bool:
        """Every event was answered: retried until acknowledged, the driver's outbox empty,
        every Telegram update confirmed."""
        outbox_empty = self.driver is None or self.driver.outbox.pending_count() == 0
        return not self.unanswered and outbox_empty and not self.updates

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.driver is not None:
            await self.driver.stop()
            self.driver.outbox.close()
        await self.http.aclose()

    # -- pacing ---------------------------------------------------------------------------

    async def _guard(self, job: Awaitable[None]) -> None:
        """A sender's task: cancelled at the end; any other error is a bug of the harness,
        reported by the run."""
        try:
            await job
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")

    async def _every(self, rate: float, new: Callable[[], Awaitable[None]]) -> None:
        """`new()` at exponential gaps of mean 1/rate, until the load stops."""
        while rate > 0 and not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.rng.expovariate(rate))
                return
            await new()

    async def _resend_loop(self) -> None:
        """Send what was not answered again once its delay has passed."""
        while True:
            await asyncio.sleep(0.5)
            now = time.time()
            for item in list(self.unanswered.values()):
                if now >= item.next_at:
                    item.next_at = now + 3600.0  # sending; its answer sets the next one
                    self._spawn(self._send_hook(item) if isinstance(item, Hook)
                                else self._send_message(item))  # fmt: skip

    def _spawn(self, job: Awaitable[None]) -> None:
        task = asyncio.create_task(self._guard(job))
        self.tasks.append(task)
        task.add_done_callback(lambda t: self.tasks.remove(t) if t in self.tasks else None)

    # -- webhooks -------------------------------------------------------------------------

    async def _new_hook(self) -> None:
        employee = self.rng.choice(EMPLOYEES)
        scheme = self.rng.choice(("stripe", "deploys"))
        hook = Hook(self.tag(WEBHOOK), employee, scheme, self.rng.randrange(CUSTOMERS))
        hook.next_at = time.time() + 3600.0  # sending; its answer sets the next one
        self.unanswered[hook.tag] = hook
        self._spawn(self._send_hook(hook))

    async def _send_hook(self, hook: Hook) -> None:
        body, headers = hook.request()
        began = time.time()
        try:
            answer = await self.http.post(f"{self.ingress_url}/hooks/{hook.path}", content=body,
                                          headers=headers)  # fmt: skip
            ok = answer.is_success
            said = (
                f"{answer.status_code} {answer.json().get('status', '')}"
                if ok
                else str(answer.status_code)
            )
        except (httpx.HTTPError, ValueError) as exc:
            ok, said = False, type(exc).__name__
        self.book.attempt(Attempt(WEBHOOK, hook.tag, began, time.time(), said, ok))
        hook.tries += 1
        if not ok and hook.tries <= 0:
            return  # a duplicate delivery that failed: the event was answered before
        if not ok:
            hook.next_at = time.time() + delay(hook.tries)
            return
        source = names.source_key(names.SOURCE_WEBHOOK, hook.path)
        self.book.ack(Acked(WEBHOOK, hook.tag, source, hook.dedupe_key, began, time.time()))
        self.unanswered.pop(hook.tag, None)
        if hook.tries == 1 and self.rng.random() < RESEND_SHARE:
            self._spawn(self._deliver_again(hook, self.rng.uniform(5, 60)))

    async def _deliver_again(self, hook: Hook, after_s: float) -> None:
        """The provider delivers an answered event once more (its answer must be 2xx and
        the inbox must not grow)."""
        await asyncio.sleep(after_s)
        again = Hook(hook.tag, hook.employee, hook.scheme, hook.customer, tries=-1)
        await self._send_hook(again)

    # -- owner chat -----------------------------------------------------------------------

    async def _new_message(self, audience: str) -> None:
        tag = self.tag(CHAT)
        text = f"{tag} how are things?" + self._slow()
        if self.rng.random() < self.rates.tool_share:
            url = f"{self.target.base_url}/effect/{tag}"
            call = {"method": "POST", "url": url, "body": {"tag": tag}}
            text = f"{tag} record this\ncall: http_request {json.dumps(call)}"
            self.book.tools.add(tag)
        message = Message(tag, audience, text, next_at=time.time() + 3600.0)
        self.unanswered[tag] = message
        self._spawn(self._send_message(message))

    async def _send_message(self, m: Message) -> None:
        began = time.time()
        try:
            answer = await self.http.post(
                f"{self.ingress_url}/v1/employees/{FRONT}/chat",
                json={"client_message_id": m.tag, "text": m.text},
                headers=self._auth(m.audience),
            )
            ok, said = answer.status_code == 202, str(answer.status_code)
            message_id = int(answer.json()["message_id"]) if ok else 0
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            ok, said, message_id = False, type(exc).__name__, 0
        self.book.attempt(Attempt(CHAT, m.tag, began, time.time(), said, ok))
        m.tries += 1
        if not ok:
            m.next_at = time.time() + delay(m.tries)
            return
        self.book.chat_ids[m.tag] = (m.audience, message_id)
        key = chat.dedupe_key(m.audience, names.DEFAULT_SESSION, m.tag,
                              self.user_ids.get(m.audience))  # fmt: skip
        source = names.source_key(names.SOURCE_CHAT, FRONT)
        self.book.ack(Acked(CHAT, m.tag, source, key, began, time.time()))
        self.unanswered.pop(m.tag, None)

    def _slow(self) -> str:
        """Sometimes a model step that takes a while (the local provider's `sleep:`)."""
        if self.rng.random() < self.rates.slow_share:
            return f"\nsleep: {self.rng.choice((1, 2, 3))}"
        return ""

    def _auth(self, audience: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[audience]}"}

    async def _follow(self, audience: str) -> None:
        """Read the audience's event stream as a client would, resuming after a break."""
        last = 0
        url = f"{self.ingress_url}/v1/employees/{FRONT}/chat/events"
        timeout = httpx.Timeout(SEND_TIMEOUT_S, read=30.0)
        while True:
            headers = {**self._auth(audience), "Last-Event-ID": str(last)}
            try:
                async with self.http.stream("GET", url, headers=headers, timeout=timeout) as r:
                    if r.status_code == 200:
                        async for event in sse_events(r.aiter_lines()):
                            self.book.streamed(audience, event)
                            last = max(last, event["pos"])
            except (httpx.HTTPError, ValueError):
                pass  # the ingress died or the stream broke: resume from `last`
            await asyncio.sleep(STREAM_RETRY_S)

    # -- driver ---------------------------------------------------------------------------

    async def _new_driver_event(self) -> None:
        assert self.driver is not None
        tag = self.tag(DRIVER)
        subject = f"meter-{self.rng.randrange(SUBJECTS)}"
        envelope = {"specversion": "1.0", "id": tag, "source": f"/drivers/{DRIVER_ID}",
                    "type": "fx.reading", "subject": subject,
                    "data": {"tag": tag, "reading": self.rng.randrange(1000)}}  # fmt: skip
        seq = await self.driver.enqueue(self._driver_source, tag, "fx.reading", envelope)
        self.seqs[seq] = (tag, time.time())

    @property
    def _driver_source(self) -> str:
        return names.source_key(names.SOURCE_GRPC, DRIVER_ID)

    def _driver_acks(self, results: list[AckResult]) -> None:
        """Called by the driver client's recorder thread for each batch of Acks."""
        now = time.time()
        for r in results:
            tag, began = self.seqs.get(r.seq, ("", now))
            ok = r.status in (AckStatus.ACCEPTED, AckStatus.DUPLICATE)
            self.book.attempt(Attempt(DRIVER, tag, began, now, r.status.name, ok))
            if ok:
                self.book.ack(Acked(DRIVER, tag, self._driver_source, tag, began, now))

    # -- Telegram -------------------------------------------------------------------------

    async def _new_customer_message(self) -> None:
        tag = self.tag(TELEGRAM)
        chat_id = 7_100_000 + self.rng.randrange(CHATS)
        text = f"{tag} where is my order?" + self._slow()
        update = self.telegram.customer_message(self.bot, chat_id, text)
        self.updates[int(update["update_id"])] = (tag, time.time())

    async def _confirm_loop(self) -> None:
        """An update is acknowledged once the reader confirmed it to Telegram."""
        source = names.source_key("telegram", ACCOUNT)
        while True:
            await asyncio.sleep(CONFIRM_POLL_S)
            below = self.telegram.confirmed_offset(self.bot)
            for update_id in sorted(u for u in self.updates if u < below):
                tag, began = self.updates.pop(update_id)
                now = time.time()
                self.book.attempt(Attempt(TELEGRAM, tag, began, now, "confirmed", True))
                key = f"update:{update_id}"
                self.book.ack(Acked(TELEGRAM, tag, source, key, began, now))


class EffectTarget:
    """The outside world of `http_request`: a loopback server counting what reaches each
    path, answering after a pause (so a worker killed meanwhile never hears back)."""

    def __init__(self, seed: int, host: str = "127.0.0.1") -> None:
        self.arrivals: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.server = ThreadingHTTPServer((host, 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> EffectTarget:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def reached(self, path: str) -> int:
        with self.lock:
            return self.arrivals[path]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        target = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with target.lock:
                    target.arrivals[self.path] += 1  # the effect happened here
                    pause = target.rng.uniform(*EFFECT_LATENCY_S)
                time.sleep(pause)  # a slow outside service; its thread alone waits
                body = json.dumps({"done": self.path}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                # A worker killed during the pause has gone: there is no one to answer.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.end_headers()
                    self.wfile.write(body)

        return Handler


class RecordingOutbox(DriverOutbox):
    """The driver's durable outbox, telling the run each Ack as it is recorded."""

    def __init__(self, path: Path, on_acks: Callable[[list[AckResult]], None]) -> None:
        super().__init__(path)
        self.on_acks = on_acks

    def ack_many(self, results: Iterable[AckResult]) -> int:
        batch = list(results)
        recorded = super().ack_many(batch)
        self.on_acks(batch)
        return recorded


async def sse_events(lines: Any) -> Any:
    """The events of a server-sent event stream: {**data, "event", "pos"} (`pos`: the event's
    place, its SSE id, which a reconnect resumes after; the data's `id` is its row's)."""
    event: dict[str, Any] = {}
    async for line in lines:
        if not line:
            if "id" in event and "data" in event:
                yield {**json.loads(event["data"]), "event": event.get("event", ""),
                       "pos": int(event["id"])}  # fmt: skip
            event = {}
        elif not line.startswith(":") and ":" in line:
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")
