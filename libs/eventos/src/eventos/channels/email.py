"""Email (SPEC §6.4): an IMAP poller as the reader, SMTP submission as the sender.

The account's credential is one JSON secret (`EmailAccount`). IMAP and SMTP are spoken by the
stdlib's `imaplib` and `smtplib`, each call in a thread of this channel's own bounded pool with
a socket timeout on every operation: the protocols' most used clients, no new dependency, and a
hung server costs one thread for at most the timeout, never the event loop.

Reader: each read logs in, SELECTs the mailbox read-only and asks `UID SEARCH UID <n+1>:<m>
UNSEEN` in windows of UIDs up to UIDNEXT (an answer never grows with the mailbox), then fetches
with `BODY.PEEK[]` (nothing is marked read) at most `page_messages` mails or `page_bytes` per
page; a mail over `mail_max_bytes` is fetched as its first 64 KiB of headers only (a dead row
that still deduplicates). The cursor `{uidvalidity, uid}` commits with the page
(the framework's transaction); `confirm` then marks the page `\\Seen` in a second session, only
if UIDVALIDITY is still the page's. A new UIDVALIDITY (a rebuilt mailbox) starts again from UID
1: the mails already confirmed are seen, and any other the reader had taken is a duplicate of its
Message-ID. A login per read, not a kept connection: a poll every few seconds costs one round
trip more, and no connection state (a stale SELECT, a server's idle cut) survives between reads.

Sender: a reply's Message-ID is made from the outbox row's idempotency key, so before it submits
a mail the sender looks that Message-ID up in the Sent mailbox (the provider's copy of what it
sent) and answers Delivered without sending when it is there: a row Egress sends again after an
attempt that may have gone out is never mailed twice (`idempotent`). The same IMAP session finds
the latest mail from the recipient, which the reply answers (`Re:` its subject, `In-Reply-To`,
`References`). SMTP 4xx is Deferred, 5xx Refused, a connection that breaks once DATA was sent is
Unclear (the next attempt's Sent check settles it).
"""

from __future__ import annotations

import asyncio
import contextlib
import imaplib
import json
import logging
import re
import smtplib
import ssl
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email import policy
from typing import Any, TypeVar

from eventos.bus.inbox import IngressRecord
from eventos.channels.email_records import (
    DRIVER,
    Answered,
    answered_by,
    build_reply,
    mail_record,
    plain_address,
    reply_message_id,
)
from eventos.channels.readers import Page
from eventos.channels.senders import Deferred, Delivered, Outgoing, Refused, SendOutcome, Unclear
from eventos.errors import EventOSError
from eventos.failures import AUTH, INVALID_REQUEST

T = TypeVar("T")
TLS_MODES = ("none", "starttls", "tls")
IMAP_TIMEOUT_S = 30.0  # every socket operation of a read
PAGE_MESSAGES = 20
SEARCH_WINDOW = 5000  # UIDs per UID SEARCH (an answer line of at most ~50 KB)
SEARCH_WINDOWS = 20  # windows searched per read
PAGE_BYTES = 10 * 1024 * 1024
MAIL_MAX_BYTES = 5 * 1024 * 1024
HEAD_PEEK_BYTES = 64 * 1024  # what is fetched of a mail over the bound
THREADS = 8  # this channel's blocking calls at once, per process
LOOKBACK = 5  # the recipient's latest mails looked at for the one a reply answers
RETRY_421_S = 5.0  # a server closing its service: the account waits
_FETCHED = re.compile(rb"UID (\d+)")
_SIZE = re.compile(rb"RFC822\.SIZE (\d+)")
log = logging.getLogger(__name__)


class EmailError(EventOSError):
    """The mail server said no, or did not speak IMAP."""


class EmailConfigError(EmailError):
    """The account's credential secret is not a valid email account."""


class MailboxMissing(EmailError):
    """The account's mailbox (or Sent mailbox) does not exist."""


def _text(doc: dict[str, Any], name: str, default: str | None = None) -> str:
    value = doc.get(name, default)
    if not isinstance(value, str) or not value.strip() or any(c in value for c in "\r\n\x00"):
        raise EmailConfigError(f"email account: {name!r} must be a non-empty single-line string")
    return value.strip()


def _port(doc: dict[str, Any], name: str) -> int:
    value = doc.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise EmailConfigError(f"email account: {name!r} must be a port number (1-65535)")
    return value


@dataclass(frozen=True)
class EmailAccount:
    """An account's credential secret: `{address, username, password, imap_host, imap_port,
    smtp_host, smtp_port, tls: none|starttls|tls, mailbox: INBOX, sent_mailbox: Sent}`."""

    address: str
    username: str
    password: str = field(repr=False)
    imap_host: str
    imap_port: int
    smtp_host: str
    smtp_port: int
    tls: str
    mailbox: str = "INBOX"
    sent_mailbox: str = "Sent"

    @property
    def domain(self) -> str:
        return self.address.rpartition("@")[2]

    @classmethod
    def parse(cls, credential: bytes) -> EmailAccount:
        """The account, or EmailConfigError naming what is wrong (never the password)."""
        try:
            doc = json.loads(credential)
        except (ValueError, UnicodeDecodeError):
            raise EmailConfigError("email account: the secret is not JSON") from None
        if not isinstance(doc, dict):
            raise EmailConfigError("email account: the secret must be a JSON object")
        unknown = set(doc) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise EmailConfigError(f"email account: unknown fields {sorted(unknown)}")
        address = plain_address(_text(doc, "address"))
        if address is None:
            raise EmailConfigError("email account: 'address' must be a plain mailbox a@b")
        tls = _text(doc, "tls")
        if tls not in TLS_MODES:
            raise EmailConfigError(f"email account: 'tls' must be one of {', '.join(TLS_MODES)}")
        password = doc.get("password")
        if not isinstance(password, str) or not password:
            raise EmailConfigError("email account: 'password' must be a non-empty string")
        return cls(address, _text(doc, "username", address), password,
                   _text(doc, "imap_host"), _port(doc, "imap_port"), _text(doc, "smtp_host"),
                   _port(doc, "smtp_port"), tls, _text(doc, "mailbox", "INBOX"),
                   _text(doc, "sent_mailbox", "Sent"))  # fmt: skip


# -- IMAP ------------------------------------------------------------------------------------


def _said(exc: imaplib.IMAP4.error) -> str:
    """An imaplib error's text (its argument is the server's line, often bytes)."""
    arg = exc.args[0] if exc.args else ""
    text = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
    return " ".join(text.split())[:300]


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _ok(answer: tuple[str, list[Any]], what: str) -> list[Any]:
    typ, data = answer
    if typ != "OK":
        detail = b" ".join(d for d in data if isinstance(d, bytes)).decode("utf-8", "replace")
        raise EmailError(f"IMAP {what}: {typ} {detail[:200]}")
    return data


@contextlib.contextmanager
def imap_session(account: EmailAccount, timeout_s: float) -> Iterator[imaplib.IMAP4]:
    """A logged-in IMAP client, logged out after; IMAP's errors as EmailError."""
    where = f"{account.imap_host}:{account.imap_port}"
    try:
        if account.tls == "tls":
            client: imaplib.IMAP4 = imaplib.IMAP4_SSL(
                account.imap_host, account.imap_port,
                ssl_context=ssl.create_default_context(), timeout=timeout_s,
            )  # fmt: skip
        else:
            client = imaplib.IMAP4(account.imap_host, account.imap_port, timeout=timeout_s)
    except imaplib.IMAP4.error as exc:
        raise EmailError(f"IMAP {where}: {_said(exc)}") from None
    try:
        if account.tls == "starttls":
            client.starttls(ssl.create_default_context())
        client.login(account.username, account.password)
        yield client
    except imaplib.IMAP4.error as exc:
        raise EmailError(f"IMAP {where}: {_said(exc)}") from None
    finally:
        with contextlib.suppress(imaplib.IMAP4.error, OSError):
            client.logout()


def select(client: imaplib.IMAP4, mailbox: str, readonly: bool) -> int:
    """SELECT (or EXAMINE) `mailbox`; its UIDVALIDITY."""
    typ, _ = client.select(_quote(mailbox), readonly=readonly)
    if typ != "OK":
        raise MailboxMissing(f"IMAP mailbox {mailbox!r} cannot be selected")
    _, values = client.response("UIDVALIDITY")
    if not values or not isinstance(values[0], bytes) or not values[0].isdigit():
        raise EmailError(f"IMAP mailbox {mailbox!r} has no UIDVALIDITY")
    return int(values[0])


def _uids(data: list[Any]) -> list[int]:
    words = b" ".join(d for d in data if isinstance(d, bytes)).split()
    return sorted({int(w) for w in words if w.isdigit()})


def _literal(data: list[Any]) -> bytes | None:
    """The first literal of a FETCH answer (None: the message is gone)."""
    for part in data:
        if isinstance(part, tuple) and len(part) == 2 and isinstance(part[1], bytes):
            return part[1]
    return None


def _sizes(client: imaplib.IMAP4, uids: list[int]) -> dict[int, int]:
    data = _ok(client.uid("FETCH", ",".join(map(str, uids)), "(RFC822.SIZE)"), "FETCH size")
    sizes = {}
    for line in data:
        head = line[0] if isinstance(line, tuple) else line
        uid, size = _FETCHED.search(head or b""), _SIZE.search(head or b"")
        if uid and size:
            sizes[int(uid.group(1))] = int(size.group(1))
    return sizes


def _cursor_uid(cursor: dict[str, Any], validity: int) -> int:
    uid = cursor.get("uid")
    if cursor.get("uidvalidity") != validity or not isinstance(uid, int) or uid < 0:
        return 0  # a first read, or a rebuilt mailbox: from its start
    return uid


# -- the reader ------------------------------------------------------------------------------


class _Threads:
    """This channel's bounded pool of threads for blocking IMAP and SMTP calls."""

    def __init__(self, executor: ThreadPoolExecutor | None) -> None:
        self.executor = executor or ThreadPoolExecutor(THREADS, thread_name_prefix="email")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)


class EmailReader(_Threads):
    """One page of unread mail per call, from the account's cursor."""

    driver = DRIVER
    holds_unread = True  # unread mail stays in the mailbox

    def __init__(self, poll_s: float, *, timeout_s: float = IMAP_TIMEOUT_S,
                 page_messages: int = PAGE_MESSAGES, page_bytes: int = PAGE_BYTES,
                 mail_max_bytes: int = MAIL_MAX_BYTES, search_window: int = SEARCH_WINDOW,
                 executor: ThreadPoolExecutor | None = None) -> None:  # fmt: skip
        super().__init__(executor)
        self.poll_s, self.timeout_s = poll_s, timeout_s
        self.page_messages, self.page_bytes = page_messages, page_bytes
        self.mail_max_bytes, self.search_window = mail_max_bytes, search_window

    async def read(self, token: bytes, cursor: dict[str, Any], limit: int = PAGE_MESSAGES) -> Page:
        """The next page (at most `limit` mails) and the cursor after it; an empty one after
        waiting the poll interval."""
        account = EmailAccount.parse(token)
        items, after = await self.run(self._read_page, account, cursor, max(1, limit))
        if not items:
            await asyncio.sleep(self.poll_s)
        return items, after

    def _read_page(self, account: EmailAccount, cursor: dict[str, Any], limit: int) -> Page:
        with imap_session(account, self.timeout_s) as client:
            validity = select(client, account.mailbox, readonly=True)
            last, uids = self._unseen(client, _cursor_uid(cursor, validity))
            uids = uids[:limit]  # the rest stays unread for the next page
            if not uids:
                return [], {"uidvalidity": validity, "uid": last}
            sizes, budget = _sizes(client, uids), self.page_bytes
            items: list[dict[str, Any]] = []
            for uid in uids:
                size = sizes.get(uid, 0)
                if items and size > budget:
                    break  # the next page takes it
                item = self._fetch(client, uid, size)
                if item is not None:
                    items.append({**item, "uidvalidity": validity, "own": account.address})
                    budget -= len(item["raw"])
                last = uid
            return items, {"uidvalidity": validity, "uid": last}

    def _unseen(self, client: imaplib.IMAP4, last: int) -> tuple[int, list[int]]:
        """The first unseen UIDs above `last`, searched in windows of `search_window` UIDs up
        to UIDNEXT (no answer line grows with the mailbox), and the UID below which nothing is
        left to read (the end of the windows that had none)."""
        _, values = client.response("UIDNEXT")
        if not values or not isinstance(values[0], bytes) or not values[0].isdigit():
            found = _ok(client.uid("SEARCH", f"UID {last + 1}:*", "UNSEEN"), "SEARCH")
            return last, [u for u in _uids(found) if u > last][: self.page_messages]
        top, low = int(values[0]) - 1, last + 1
        for _ in range(SEARCH_WINDOWS):
            if low > top:
                break
            high = min(low + self.search_window - 1, top)
            found = _ok(client.uid("SEARCH", f"UID {low}:{high}", "UNSEEN"), "SEARCH")
            uids = [u for u in _uids(found) if low <= u <= high]
            if uids:
                return last, uids[: self.page_messages]
            last, low = high, high + 1
        return last, []

    def _fetch(self, client: imaplib.IMAP4, uid: int, size: int) -> dict[str, Any] | None:
        """A mail's bytes (at most the bound: a mail lying about its size is cut there), or the
        head of one over the bound."""
        if size <= self.mail_max_bytes:
            part = f"(BODY.PEEK[]<0.{self.mail_max_bytes + 1}>)"
            raw = _literal(_ok(client.uid("FETCH", str(uid), part), "FETCH"))
            if raw is None or len(raw) <= self.mail_max_bytes:
                return None if raw is None else {"uid": uid, "raw": raw, "too_large": None}
            size = len(raw)
        part = f"(BODY.PEEK[HEADER]<0.{HEAD_PEEK_BYTES}>)"
        head = _literal(_ok(client.uid("FETCH", str(uid), part), "FETCH header"))
        return None if head is None else {"uid": uid, "raw": head, "too_large": size}

    def record(self, account_id: str, salt: bytes, item: dict[str, Any]) -> IngressRecord:
        return mail_record(account_id, salt, item)

    async def confirm(self, token: bytes, items: list[dict[str, Any]]) -> None:
        """Mark the committed page read (`\\Seen`)."""
        await self.run(self._mark_seen, EmailAccount.parse(token), items)

    def _mark_seen(self, account: EmailAccount, items: list[dict[str, Any]]) -> None:
        validity = items[0]["uidvalidity"]
        with imap_session(account, self.timeout_s) as client:
            if select(client, account.mailbox, readonly=False) != validity:
                log.info("email %s: UIDVALIDITY changed; the page stays unread", account.address)
                return
            uid_set = ",".join(str(item["uid"]) for item in items)
            _ok(client.uid("STORE", uid_set, "+FLAGS.SILENT", r"(\Seen)"), "STORE")


# -- the sender ------------------------------------------------------------------------------


def _refusal(code: int, reply: bytes | str) -> SendOutcome:
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
    reason = f"SMTP {code}: {' '.join(text.split())[:300]}"
    if 400 <= code < 500:
        return Deferred(reason, RETRY_421_S if code == 421 else None)
    # 530 and 535: authentication required or refused (RFC 4954).
    return Refused(reason, AUTH if code in (530, 535) else INVALID_REQUEST)


def _close(client: smtplib.SMTP) -> None:
    try:
        client.quit()
    except (smtplib.SMTPException, OSError):
        client.close()


class EmailSender(_Threads):
    """A reply by SMTP, unless the Sent mailbox shows an earlier attempt already sent it."""

    driver = DRIVER
    idempotent = True  # the Message-ID is the key; the Sent mailbox is where it is looked up

    def __init__(self, timeout_s: float, executor: ThreadPoolExecutor | None = None) -> None:
        super().__init__(executor)
        self.timeout_s = timeout_s

    async def send(self, out: Outgoing) -> SendOutcome:
        try:
            account = EmailAccount.parse(out.credential)
        except EmailConfigError as exc:
            return Refused(str(exc))
        recipient = plain_address(out.recipient)
        if recipient is None:
            return Refused("the recipient is not a plain email address")
        message_id = reply_message_id(out.idempotency_key, account.domain)
        try:
            sent, answered = await self.run(self._look_up, account, message_id, recipient)
        except MailboxMissing as exc:
            return Refused(str(exc))
        except (EmailError, OSError) as exc:  # not knowing, sending could mail it twice
            return Deferred(f"the Sent mailbox could not be checked: {exc}"[:500])
        if sent:
            log.info("outbox row %d: %s is in the Sent mailbox already", out.outbound_id,
                     message_id)  # fmt: skip
            return Delivered(message_id)
        mail = build_reply(account.address, recipient, out.body, message_id, answered,
                           datetime.now(UTC))  # fmt: skip
        content = mail.as_bytes(policy=policy.SMTP)
        return await self.run(self._submit, account, recipient, content, message_id)

    def _look_up(self, account: EmailAccount, message_id: str,
                 recipient: str) -> tuple[bool, Answered | None]:  # fmt: skip
        """Whether `message_id` is in the Sent mailbox; else the mail the reply answers."""
        with imap_session(account, self.timeout_s) as client:
            select(client, account.sent_mailbox, readonly=True)
            found = client.uid("SEARCH", "HEADER", "Message-ID", _quote(message_id))
            if _uids(_ok(found, "SEARCH Sent")):
                return True, None
            try:
                select(client, account.mailbox, readonly=True)
            except MailboxMissing:
                return False, None
            theirs = _uids(_ok(client.uid("SEARCH", "FROM", _quote(recipient)), "SEARCH"))
            part = "(BODY.PEEK[HEADER.FIELDS (FROM SUBJECT MESSAGE-ID REFERENCES)])"
            for uid in reversed(theirs[-LOOKBACK:]):
                head = _literal(_ok(client.uid("FETCH", str(uid), part), "FETCH header"))
                answered = answered_by(head, recipient) if head is not None else None
                if answered is not None:
                    return False, answered
            return False, None

    def _connect(self, account: EmailAccount) -> smtplib.SMTP:
        context = ssl.create_default_context()
        host, port, name = account.smtp_host, account.smtp_port, account.domain
        if account.tls == "tls":
            client: smtplib.SMTP = smtplib.SMTP_SSL(
                host, port, local_hostname=name, timeout=self.timeout_s, context=context
            )
        else:
            client = smtplib.SMTP(host, port, local_hostname=name, timeout=self.timeout_s)
        try:
            client.ehlo()
            if account.tls == "starttls":
                client.starttls(context=context)
                client.ehlo()
            client.login(account.username, account.password)
        except BaseException:
            client.close()
            raise
        return client

    def _submit(self, account: EmailAccount, recipient: str, content: bytes,
                message_id: str) -> SendOutcome:  # fmt: skip
        where = f"{account.smtp_host}:{account.smtp_port}"
        try:
            client = self._connect(account)
        except smtplib.SMTPResponseException as exc:  # a refused greeting or login
            return _refusal(exc.smtp_code, exc.smtp_error)
        except smtplib.SMTPNotSupportedError as exc:
            return Refused(f"SMTP {where}: {exc}"[:300])
        except (smtplib.SMTPException, OSError) as exc:
            return Deferred(f"SMTP {where} unreachable: {type(exc).__name__}")
        try:
            code, reply = client.mail(account.address)
            if code != 250:
                return _refusal(code, reply)
            code, reply = client.rcpt(recipient)
            if code not in (250, 251):
                return _refusal(code, reply)
            try:
                code, reply = client.data(content)  # raises only when DATA itself is refused
            except smtplib.SMTPDataError as exc:  # the server answered: not taken
                return _refusal(exc.smtp_code, exc.smtp_error)
            except (smtplib.SMTPException, OSError) as exc:
                return Unclear(f"SMTP {where}: the connection broke after DATA: "
                               f"{type(exc).__name__}")  # fmt: skip
            return Delivered(message_id) if code == 250 else _refusal(code, reply)
        except (smtplib.SMTPException, OSError) as exc:  # before DATA: nothing was sent
            return Deferred(f"SMTP {where}: the connection broke: {type(exc).__name__}")
        finally:
            _close(client)
