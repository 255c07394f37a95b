"""Real mail servers on loopback for the email channel's tests: an SMTP server (aiosmtpd) that
delivers what it accepts into an IMAP server (pymap, in-memory backend).

Both run on one asyncio loop in one thread of the test process, so the tests' blocking clients
(smtplib, imaplib) and the product's own loop never wait on each other, and nothing outlives
`stop()`. Users are addresses with passwords, valid for SMTP AUTH and IMAP LOGIN alike; each test
makes its own with `new_user()`, so tests sharing a session's servers never see each other's mail.

The SMTP server is a real MTA for the addresses it hosts: RCPT to an unknown address is refused
(550 5.1.1), an accepted message is appended to each recipient's INBOX and, when the envelope
sender is hosted too, to the sender's "Sent" mailbox (as a provider such as Gmail keeps it): a
sender can look a Message-ID up there before it resends. Faults for the next transactions are
scripted with `fail_next()` and `drop_after_data()`.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import imaplib
import itertools
import logging
import re
import secrets
import threading
import time
from argparse import Namespace
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from email.parser import BytesHeaderParser
from email.utils import format_datetime, make_msgid
from typing import Any, Literal, TypeVar

from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from proxyprotocol.reader import ProxyProtocolReader
from proxyprotocol.version import ProxyProtocolVersion
from pymap.backend.dict import Config, DictBackend, Identity, Login
from pymap.backend.dict import Session as ImapSession
from pymap.backend.dict.mailbox import MailboxData
from pymap.concurrent import Subsystem
from pymap.imap import IMAPServer
from pymap.parsing.message import AppendMessage
from pymap.parsing.specials import ExtensionOptions
from pymap.parsing.specials.fetchattr import FetchRequirement
from pymap.user import UserMetadata
from pysasl.hashing import Cleartext

T = TypeVar("T")
HOST = "127.0.0.1"
DOMAIN = "example.test"
HOSTNAME = "mail.example.test"  # the servers' greeting name (no DNS look-up of our own name)
INBOX = "INBOX"
SENT = "Sent"
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 10.0  # a helper's call into the servers' loop
SMTP_IDLE_TIMEOUT_S = 60.0  # an SMTP client silent this long is disconnected
MAX_MESSAGE_BYTES = 25 * 1024 * 1024  # one message, by SMTP DATA or IMAP APPEND (as Gmail's)
SMTP_LOGGER = "mail.log"  # aiosmtpd's
_HEADERS = BytesHeaderParser(policy=email.policy.compat32)
Stage = Literal["MAIL", "RCPT", "DATA"]
FAULT_TEXT = {
    421: "421 4.3.2 Service shutting down, try again later",
    450: "450 4.2.1 Mailbox busy, try again later",
    451: "451 4.3.0 Local error in processing",
    550: "550 5.7.1 Message refused",
    552: "552 5.2.2 Mailbox full",
    554: "554 5.6.0 Transaction failed",
}


@dataclass(frozen=True)
class MailUser:
    """A hosted address; its password is valid for SMTP AUTH and IMAP LOGIN."""

    address: str
    password: str


@dataclass(frozen=True)
class Accepted:
    """A message the SMTP server took (its reply may have been cut: `reply_dropped`)."""

    message_id: str | None
    mail_from: str
    rcpt_tos: tuple[str, ...]
    auth_login: str | None
    content: bytes
    reply_dropped: bool

    @property
    def message(self) -> EmailMessage:
        return _parse(self.content)


@dataclass(frozen=True)
class Stored:
    """A message in a mailbox as the IMAP server holds it."""

    uid: int
    flags: frozenset[str]
    message_id: str | None
    subject: str | None
    content: bytes

    @property
    def seen(self) -> bool:
        return "\\Seen" in self.flags


@dataclass
class _Fault:
    stage: Stage | Literal["DROP"]
    remaining: int
    reply: str = ""


@dataclass
class _State:
    """What the test thread and the servers' thread share, under `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    passwords: dict[str, str] = field(default_factory=dict)
    faults: list[_Fault] = field(default_factory=list)
    accepted: list[Accepted] = field(default_factory=list)

    def take_fault(self, stage: Stage | Literal["DROP"]) -> _Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.stage == stage and fault.remaining > 0:
                    fault.remaining -= 1
                    return fault
        return None


def _parse(content: bytes) -> EmailMessage:
    message = email.message_from_bytes(content, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return message


def _header(content: bytes, name: str) -> str | None:
    """A header's raw value (compat32 parses any bytes without raising: hostile mail too)."""
    value = _HEADERS.parsebytes(content).get(name)
    return None if value is None else str(value).strip()


def _abort(transport: asyncio.BaseTransport) -> None:
    """Cut a connection now, without flushing what is buffered (a crash, not a goodbye)."""
    if isinstance(transport, asyncio.Transport):
        transport.abort()
    else:
        transport.close()


def _not_login_data_notice(record: logging.LogRecord) -> bool:
    # aiosmtpd 1.4.6 logs a warning for its own deprecated Session.login_data at every AUTH.
    return "login_data is deprecated" not in record.getMessage()


class _Smtp(SMTP):
    """aiosmtpd's SMTP, closing the connection after a 421 reply (RFC 5321 §3.8) and cutting it
    instead of replying after a DATA whose reply the handler marked to drop."""

    def __init__(self, handler: _SmtpHandler, connections: set[_Smtp], **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._connections = connections
        self.drop_reply = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._connections.add(self)
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        self._connections.discard(self)
        super().connection_lost(error)

    async def push(self, status: Any) -> None:
        if self.drop_reply and self.transport is not None:
            self.drop_reply = False
            _abort(self.transport)
            return
        await super().push(status)
        text = status.decode() if isinstance(status, bytes) else str(status)
        if text.startswith("421") and self.transport is not None:
            self.transport.close()


class _SmtpHandler:
    """aiosmtpd handler: refuses unknown recipients, applies scripted faults, delivers."""

    def __init__(self, state: _State, deliver: Callable[[str, str, bytes], Awaitable[object]]):
        self._state = state
        self._deliver = deliver

    async def handle_MAIL(
        self, server: _Smtp, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        fault = self._state.take_fault("MAIL")
        if fault is not None:
            return fault.reply
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 2.1.0 OK"

    async def handle_RCPT(
        self, server: _Smtp, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        fault = self._state.take_fault("RCPT")
        if fault is not None:
            return fault.reply
        with self._state.lock:
            hosted = address.lower() in self._state.passwords
        if not hosted:
            return f"550 5.1.1 <{address}>: no such user here"
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(options)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: _Smtp, session: Session, envelope: Envelope) -> str:
        fault = self._state.take_fault("DATA")
        if fault is not None:
            return fault.reply
        content = envelope.original_content or b""
        sender = (envelope.mail_from or "").lower()
        auth = session.auth_data if session.authenticated else None
        login = auth.login.decode() if isinstance(auth, LoginPassword) else None
        message_id = _header(content, "Message-ID")
        for rcpt in envelope.rcpt_tos:
            await self._deliver(rcpt.lower(), INBOX, content)
        with self._state.lock:
            sender_hosted = sender in self._state.passwords
        if sender_hosted:
            await self._deliver(sender, SENT, content)
        dropped = self._state.take_fault("DROP") is not None
        server.drop_reply = dropped
        record = Accepted(
            message_id,
            envelope.mail_from or "",
            tuple(envelope.rcpt_tos),
            login,
            content,
            dropped,
        )
        with self._state.lock:
            self._state.accepted.append(record)
        return "250 2.0.0 OK: queued"

    def authenticate(
        self, server: _Smtp, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        if not isinstance(data, LoginPassword):
            return AuthResult(success=False, handled=False)
        login = data.login.decode("utf-8", "replace").lower()
        with self._state.lock:
            expected = self._state.passwords.get(login)
        given = data.password.decode("utf-8", "replace")
        ok = expected is not None and secrets.compare_digest(expected, given)
        return AuthResult(success=ok, handled=False, auth_data=data if ok else None)


class _ImapConfig(Config):
    """pymap's in-memory configuration with its own greeting name (its default looks up the
    host's FQDN, a DNS query that may stall on an offline machine)."""

    @property
    def greeting(self) -> bytes:
        return b"Server ready " + HOSTNAME.encode()


def _imap_config() -> _ImapConfig:
    # Cleartext: a test user's password is no secret, and pymap's default (PBKDF2, 500,000
    # rounds) would cost a core ~0.3 s per login. No TLS: LOGIN in the clear on loopback. The
    # asyncio subsystem for CPU work too: no thread pool to leak.
    args = Namespace(passlib_cfg=None, proxy_protocol=None, debug=False)
    return _ImapConfig(
        args,
        host=HOST,
        port=0,
        demo_data=False,
        demo_user="",
        demo_password="",
        tls_enabled=False,
        hash_context=Cleartext(),
        cpu_subsystem=Subsystem.for_asyncio(),
        invalid_user_sleep=0.0,
        max_append_len=MAX_MESSAGE_BYTES,
        proxy_protocol=ProxyProtocolVersion.get(None),
    )


class MailServers:
    """An SMTP and an IMAP server on free loopback ports (`smtp_port`, `imap_port`)."""

    def __init__(self) -> None:
        self._state = _State()
        self._config = _imap_config()
        self._login = Login(self._config)
        self._backend = DictBackend(self._login, self._config)
        self._names = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._smtp_connections: set[_Smtp] = set()
        self._imap_writers: set[asyncio.StreamWriter] = set()
        self.smtp_port = 0
        self.imap_port = 0
        self.host = HOST

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start both servers; return once both listen (or raise why they could not)."""
        logging.getLogger(SMTP_LOGGER).addFilter(_not_login_data_notice)
        self._thread = threading.Thread(target=self._run, name="mail-servers", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError(f"the mail servers did not start within {START_TIMEOUT_S}s")
        if self._failure is not None:
            self._thread.join(STOP_TIMEOUT_S)
            raise RuntimeError("the mail servers failed to start") from self._failure

    def stop(self) -> None:
        """Close every connection and both servers; the thread is gone when this returns."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        if loop is not None and stopping is not None and thread.is_alive():
            loop.call_soon_threadsafe(stopping.set)
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            raise RuntimeError(f"the mail servers' thread did not end within {STOP_TIMEOUT_S}s")
        if self._failure is not None:
            raise RuntimeError("the mail servers failed while stopping") from self._failure

    @property
    def running(self) -> bool:
        """True while the servers' thread lives."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> MailServers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start(); the thread must end either way
            self._failure = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._config.apply_context()
        imap_callback = ProxyProtocolReader(self._config.proxy_protocol).get_callback(
            IMAPServer(self._login, self._config)
        )

        async def on_imap_client(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            self._imap_writers = {w for w in self._imap_writers if not w.is_closing()}
            self._imap_writers.add(writer)
            await imap_callback(reader, writer)

        imap = await asyncio.start_server(on_imap_client, HOST, 0)
        smtp = await self._loop.create_server(self._smtp_protocol, HOST, 0)
        self.imap_port = imap.sockets[0].getsockname()[1]
        self.smtp_port = smtp.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            for server in (imap, smtp):
                server.close()
            for writer in list(self._imap_writers):
                _abort(writer.transport)
            for connection in list(self._smtp_connections):
                if connection.transport is not None:
                    _abort(connection.transport)
            # Python 3.12+ waits here for the connections' ends, which the aborts above bring.
            await asyncio.wait_for(imap.wait_closed(), STOP_TIMEOUT_S)
            await asyncio.wait_for(smtp.wait_closed(), STOP_TIMEOUT_S)

    def _smtp_protocol(self) -> _Smtp:
        handler = _SmtpHandler(self._state, self._append)
        return _Smtp(
            handler,
            self._smtp_connections,
            hostname=HOSTNAME,
            data_size_limit=MAX_MESSAGE_BYTES,
            timeout=SMTP_IDLE_TIMEOUT_S,
            auth_required=False,
            auth_require_tls=False,
            authenticator=handler.authenticate,
        )

    def _call(self, coro: Awaitable[T]) -> T:
        """Run `coro` on the servers' loop from the test's thread (or loop) and return its value."""
        assert self._loop is not None, "the mail servers are not started"

        async def run() -> T:
            return await coro

        future: Future[T] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(CALL_TIMEOUT_S)

    # -- users and mailboxes -----------------------------------------------------------------

    def add_user(self, address: str, password: str) -> MailUser:
        """Host `address` (an empty INBOX) with `password`."""
        address = address.lower()
        self._call(self._add_user(address, password))
        with self._state.lock:
            self._state.passwords[address] = password
        return MailUser(address, password)

    def new_user(self, prefix: str = "user") -> MailUser:
        """A fresh hosted address `<prefix>-<n>@example.test` with a random password."""
        address = f"{prefix}-{next(self._names)}-{secrets.token_hex(3)}@{DOMAIN}"
        return self.add_user(address, secrets.token_urlsafe(12))

    async def _add_user(self, address: str, password: str) -> None:
        user = UserMetadata(self._config, address, password=password)
        identity = Identity(address, self._login, None, frozenset())
        await identity.set(user)
        async with identity.new_session() as session:
            await session.mailbox_set.add_mailbox(SENT)

    async def _append(self, address: str, mailbox: str, content: bytes) -> int:
        identity = Identity(address, self._login, None, frozenset())
        async with identity.new_session() as session:
            message = AppendMessage(
                content, datetime.now(UTC), frozenset(), ExtensionOptions.empty()
            )
            append_uid, _ = await session.append_messages(mailbox, [message])
            return next(iter(append_uid.uids))

    def messages(self, user: MailUser | str, mailbox: str = INBOX) -> list[Stored]:
        """What `mailbox` of `user` holds, in UID order, with its flags."""
        address = user.address if isinstance(user, MailUser) else user.lower()
        return self._call(self._messages(address, mailbox))

    async def _messages(self, address: str, mailbox: str) -> list[Stored]:
        identity = Identity(address, self._login, None, frozenset())
        async with identity.new_session() as session:
            stored = await self._read_mailbox(session, mailbox)
        return sorted(stored, key=lambda s: s.uid)

    @staticmethod
    async def _read_mailbox(session: ImapSession, name: str) -> list[Stored]:
        try:
            data = await session.mailbox_set.get_mailbox(name)
        except KeyError:
            return []
        stored = []
        async for msg in data.messages():
            loaded = await msg.load_content(FetchRequirement.CONTENT)
            content = bytes(loaded)
            flags = frozenset(flag.value.decode() for flag in msg.permanent_flags)
            stored.append(
                Stored(
                    msg.uid,
                    flags,
                    _header(content, "Message-ID"),
                    _header(content, "Subject"),
                    content,
                )
            )
        return stored

    def uid_validity(self, user: MailUser, mailbox: str = INBOX) -> int:
        """The UIDVALIDITY of `mailbox` of `user`."""
        return self._call(self._uid_validity(user.address, mailbox))

    async def _uid_validity(self, address: str, mailbox: str) -> int:
        identity = Identity(address, self._login, None, frozenset())
        async with identity.new_session() as session:
            return (await session.mailbox_set.get_mailbox(mailbox)).uid_validity

    def renew_inbox(self, user: MailUser) -> int:
        """Rebuild `user`'s INBOX as a server does after a migration or an index loss: the same
        messages and flags under a new UIDVALIDITY, UIDs counted again from the start. Returns
        the new UIDVALIDITY. A connection that had INBOX selected keeps the old view: reconnect."""
        return self._call(self._renew_inbox(user.address))

    async def _renew_inbox(self, address: str) -> int:
        # pymap's dict backend cannot delete INBOX, so its MailboxSet gets a new one in place
        # (private attributes of pymap 0.36.7, pinned for this).
        identity = Identity(address, self._login, None, frozenset())
        async with identity.new_session() as session:
            boxes = session.mailbox_set
            old = boxes._inbox
            new = MailboxData(boxes._content_cache, boxes._thread_cache)
            while new.uid_validity == old.uid_validity:
                new = MailboxData(boxes._content_cache, boxes._thread_cache)
            async for msg in old.messages():
                loaded = await msg.load_content(FetchRequirement.CONTENT)
                again = AppendMessage(
                    bytes(loaded), msg.internal_date, msg.permanent_flags, ExtensionOptions.empty()
                )
                await new.append(again)
            boxes._inbox = new
            return new.uid_validity

    def deliver_inbound(
        self,
        to: MailUser,
        from_: str,
        subject: str,
        body: str,
        *,
        message_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[str, int]:
        """Put a mail into `to`'s INBOX through the IMAP server (APPEND, as `to`), not through
        SMTP: the SMTP faults and `accepted()` stay the sender's. Returns (Message-ID, UID)."""
        message = EmailMessage()
        message["From"] = from_
        message["To"] = to.address
        message["Subject"] = subject
        message["Date"] = format_datetime(datetime.now(UTC))
        message["Message-ID"] = message_id or make_msgid(domain=DOMAIN)
        for name, value in (headers or {}).items():
            message[name] = value
        message.set_content(body)
        uid = self.imap_append(to, message.as_bytes(policy=email.policy.SMTP))
        return str(message["Message-ID"]), uid

    def imap_append(self, user: MailUser, content: bytes, mailbox: str = INBOX) -> int:
        """APPEND `content` to `mailbox` of `user` over IMAP; returns its UID (UIDPLUS)."""
        with self.imap(user) as client:
            status, data = client.append(
                mailbox, "", imaplib.Time2Internaldate(time.time()), content
            )
        match = re.search(rb"APPENDUID \d+ (\d+)", data[0] or b"") if status == "OK" else None
        if match is None:
            raise RuntimeError(f"IMAP APPEND for {user.address} answered {status} {data!r}")
        return int(match.group(1))

    def imap(self, user: MailUser) -> imaplib.IMAP4:
        """An imaplib client logged in as `user` (close it: `with servers.imap(u) as c:`)."""
        client = imaplib.IMAP4(HOST, self.imap_port, timeout=CALL_TIMEOUT_S)
        try:
            client.login(user.address, user.password)
        except BaseException:
            client.shutdown()
            raise
        return client

    # -- what SMTP took, and its faults -------------------------------------------------------

    def accepted(self, rcpt: MailUser | None = None) -> list[Accepted]:
        """Every message the SMTP server accepted, in order (only those for `rcpt` if given)."""
        with self._state.lock:
            records = list(self._state.accepted)
        if rcpt is None:
            return records
        return [r for r in records if rcpt.address in (a.lower() for a in r.rcpt_tos)]

    def fail_next(
        self, count: int, code: int, *, stage: Stage = "DATA", reply: str | None = None
    ) -> None:
        """Refuse the next `count` transactions at `stage` (MAIL, RCPT or the end of DATA) with
        `code` (421 also closes the connection); nothing of a refused one is delivered."""
        text = reply or FAULT_TEXT.get(code) or f"{code} scripted failure"
        if not text.startswith(str(code)) or not 400 <= code < 600:
            raise ValueError(f"a fault's reply must start with its 4xx/5xx code: {text!r}")
        with self._state.lock:
            self._state.faults.append(_Fault(stage, count, text))

    def drop_after_data(self, count: int = 1) -> None:
        """The next `count` messages are accepted and delivered, but the connection is cut
        where the 250 reply to DATA would be: the client cannot know that they were sent."""
        with self._state.lock:
            self._state.faults.append(_Fault("DROP", count))

    def faults_left(self) -> int:
        """How many scripted transactions are still to fail (or to be cut)."""
        with self._state.lock:
            return sum(fault.remaining for fault in self._state.faults)

    def clear_faults(self) -> None:
        """Forget the scripted faults not used up yet."""
        with self._state.lock:
            self._state.faults.clear()
