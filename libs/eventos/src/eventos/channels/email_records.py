"""Mail as the email channel reads and writes it (SPEC §6.4): an inbound mail as an ingress
record, a reply as a message, and the Message-IDs both are known by.

Every mail is hostile. Its raw bytes are parsed by the stdlib `email` package twice: once with
the lenient `compat32` header parser, which takes any bytes, for the dedupe key (so even a mail
that cannot be read is deduplicated), and once with `policy.default` for what the record holds.
Whatever that second parse cannot stand behind — no From, several, one that is not a plain
mailbox, NUL bytes in the headers, a multipart without parts, a mail over the size bound, any
error of the parser itself — makes a dead row with the reason, never a crash; so does a mail
that must not be answered (an auto-reply, a bounce, bulk or list mail, the account's own:
`automatic`). Every mail the channel sends says `Auto-Submitted: auto-replied`.
"""

from __future__ import annotations

import hashlib
import html.parser
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from email import policy
from email.headerregistry import Address
from email.message import EmailMessage
from email.parser import BytesHeaderParser, BytesParser
from email.utils import format_datetime
from typing import Any

from eventos import names
from eventos.bus.envelope import encoded_size, new_event_id
from eventos.bus.inbox import IngressRecord
from eventos.channels.threads import thread_id

DRIVER = "email"
TYPE_MESSAGE = "eventos.email.message"
TEXT_MAX_BYTES = 32 * 1024  # the text an input carries (the envelope holds 64 KiB)
SUBJECT_MAX_CHARS = 500
NAME_MAX_CHARS = 200
MESSAGE_ID_MAX_CHARS = 250  # longer ids are hashed
REFERENCES_MAX = 20  # the last ids of a thread's References kept
HASH_HEX = 32
BOUNCE_SENDERS = frozenset({"mailer-daemon", "postmaster"})
AUTO_SUBMITTED = "auto-replied"  # on every mail the channel sends (RFC 3834 §5)
_ADDRESS = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9.-]{0,253})")
_ID = re.compile(r"<([^<>\s]{1,1000})>")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # keeps \t and \n
_HEADERS = BytesHeaderParser(policy=policy.compat32)
_MAIL = BytesParser(policy=policy.default)
log = logging.getLogger(__name__)


class HostileMail(ValueError):
    """A mail the record cannot stand behind; its message is the dead row's reason."""


def plain_address(value: str) -> str | None:
    """`value` lowercased when it is one plain ASCII mailbox (`local@domain`), else None."""
    value = value.strip()
    if "=?" in value or not _ADDRESS.fullmatch(value) or ".." in value:
        return None
    return value.lower()


def normalise_message_id(value: object) -> str | None:
    """A Message-ID without its brackets, folding or controls; a very long one hashed."""
    if value is None:
        return None
    text = _CONTROL.sub("", str(value)).strip()
    match = _ID.search(text)
    token = match.group(1) if match else (text.split() or [""])[0].strip("<>")
    if not token:
        return None
    if len(token) > MESSAGE_ID_MAX_CHARS:
        return "sha256:" + hashlib.sha256(token.encode("utf-8", "backslashreplace")).hexdigest()
    return token


def dedupe_key(raw: bytes) -> str:
    """`message-id:<id>`; a mail without one, a stable hash of the headers that identify it
    (From, To, Cc, Date, Subject: the ones relays do not add to)."""
    headers = _HEADERS.parsebytes(raw)
    message_id = normalise_message_id(headers.get("Message-ID"))
    if message_id is not None:
        return f"message-id:{message_id}"
    digest = hashlib.sha256()
    for name in ("From", "To", "Cc", "Date", "Subject"):
        value = str(headers.get(name, ""))
        digest.update(f"{name}:{value}\x00".encode("utf-8", "backslashreplace"))
    return f"headers:{digest.hexdigest()[:HASH_HEX]}"


def reply_message_id(idempotency_key: str, domain: str) -> str:
    """The Message-ID of an outbox row's mail: the same for every attempt of the row, so the
    Sent mailbox tells whether an earlier attempt went out."""
    digest = hashlib.sha256(f"eventos-outbox\x00{idempotency_key}".encode()).hexdigest()
    return f"<{digest[:HASH_HEX]}@{domain}>"


def _clean(value: str, limit: int) -> str:
    return _CONTROL.sub("", value.replace("\r", " ").replace("\n", " ")).strip()[:limit]


def _bounded_text(text: str) -> tuple[str, bool]:
    text = _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    data = text.encode("utf-8", "replace")
    if len(data) <= TEXT_MAX_BYTES:
        return text, False
    return data[:TEXT_MAX_BYTES].decode("utf-8", "ignore"), True


class _TextOfHtml(html.parser.HTMLParser):
    """The text of an HTML body: its data, without scripts and styles, blocks on new lines."""

    SKIP = frozenset({"script", "style", "head", "title"})
    BLOCKS = frozenset({"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "blockquote"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP and self.skipping:
            self.skipping -= 1

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def html_text(markup: str) -> str:
    """HTML stripped to its text."""
    parser = _TextOfHtml()
    parser.feed(markup)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).split("\n"))
    return "\n".join(line for line in lines if line)


def _content(part: EmailMessage) -> str:
    try:
        content = part.get_content()
    except (LookupError, UnicodeError):  # an unknown or lying charset: its bytes as UTF-8
        payload = part.get_payload(decode=True)
        content = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
    return content if isinstance(content, str) else ""


def _text(mail: EmailMessage) -> str:
    if mail.get_content_maintype() == "multipart" and not mail.is_multipart():
        raise HostileMail("broken MIME: a multipart without parts")
    body = mail.get_body(preferencelist=("plain", "html"))
    if not isinstance(body, EmailMessage):
        return ""  # no text part (an attachment only): an input with no text
    content = _content(body)
    return html_text(content) if body.get_content_subtype() == "html" else content


def _addresses(mail: EmailMessage) -> tuple[Address, ...]:
    found: tuple[Address, ...] = getattr(mail["From"], "addresses", ())
    return found


def _sender(mail: EmailMessage, raw_from: str) -> tuple[str, str]:
    """The From mailbox (lowercased) and its display name."""
    if len(mail.get_all("From") or []) != 1:
        raise HostileMail("no From header" if not mail.get_all("From") else "several From headers")
    addresses = _addresses(mail)
    if len(addresses) != 1:
        raise HostileMail("no From address" if not addresses else "several From addresses")
    address = plain_address(addresses[0].addr_spec)
    if address is None:
        raise HostileMail("the From address is not a plain mailbox")
    name = _clean(addresses[0].display_name or "", NAME_MAX_CHARS)
    if "=?" in raw_from and ("@" in name or "<" in name):
        raise HostileMail("an encoded From name posing as an address")  # a spoof's classic
    return address, name


def _header_block(raw: bytes) -> bytes:
    cut = [i for i in (raw.find(b"\r\n\r\n"), raw.find(b"\n\n")) if i >= 0]
    return raw[: min(cut)] if cut else raw


def _when(mail: EmailMessage) -> str | None:
    moment = getattr(mail["Date"], "datetime", None) if mail["Date"] is not None else None
    if isinstance(moment, datetime) and moment.tzinfo is not None:
        return moment.isoformat()
    return None


# Headers that only responders put on a mail (vacation programs, Exchange, ticket systems),
# whatever their value.
AUTOREPLY_HEADERS = ("X-Autoreply", "X-Autorespond", "X-Auto-Response-Suppress")
LIST_HEADERS = ("List-Id",)  # a mailing list's: its mail is for the list, not for us to answer


def _header(mail: EmailMessage, name: str) -> str:
    return " ".join(str(mail[name] or "").split())


def automatic(mail: EmailMessage, address: str, own: str | None) -> str | None:
    """Why a mail must not be answered (RFC 3834: an auto-reply, a bounce, a list's mail or
    bulk, the account's own mail), or None. Answering one could start a mail loop with a
    responder (which, like ours, answers every mail it gets)."""
    auto = _header(mail, "Auto-Submitted").lower()
    if auto and not auto.startswith("no"):
        return f"an automatic mail (Auto-Submitted: {auto[:40]}), not answered"
    for name in AUTOREPLY_HEADERS:
        if mail[name] is not None:
            return f"an automatic mail ({name}: {_header(mail, name)[:40]}), not answered"
    precedence = _header(mail, "Precedence").lower()
    if precedence in ("bulk", "junk", "list", "auto_reply"):
        return f"a bulk mail (Precedence: {precedence}), not answered"
    for name in LIST_HEADERS:
        if mail[name] is not None:
            return f"a list's mail ({name}: {_header(mail, name)[:60]}), not answered"
    # The null reverse path: what bounces and auto-replies are sent with (RFC 3834 §3.3),
    # as the delivering server records it.
    if any(_CONTROL.sub("", str(v)).strip() == "<>" for v in mail.get_all("Return-Path") or []):
        return "a mail with no return path (Return-Path: <>), not answered"
    local = address.partition("@")[0]
    if local in BOUNCE_SENDERS or mail.get_content_type() == "multipart/report":
        return "a delivery report (bounce), not answered"
    if own is not None and address == own:
        return "the account's own mail, not answered"
    return None


def read_mail(raw: bytes, own: str | None = None) -> dict[str, Any]:
    """What a record holds of a mail (its sender, subject, text and ids); HostileMail when it
    cannot be read or must not be answered (`own`: the account's address)."""
    if b"\x00" in _header_block(raw):
        raise HostileMail("a NUL byte in the headers")
    mail = _MAIL.parsebytes(raw)
    assert isinstance(mail, EmailMessage)  # policy.default makes EmailMessage
    address, name = _sender(mail, str(_HEADERS.parsebytes(raw).get("From", "")))
    unanswerable = automatic(mail, address, own)
    if unanswerable is not None:
        raise HostileMail(unanswerable)
    text, truncated = _bounded_text(_text(mail))
    references = [normalise_message_id(m) for m in _ID.findall(str(mail["References"] or ""))]
    return {
        "reply_to": address, "from_name": name or None,
        "subject": _clean(str(mail["Subject"] or ""), SUBJECT_MAX_CHARS),
        "text": text, "text_truncated": truncated,
        "message_id": normalise_message_id(mail["Message-ID"]),
        "in_reply_to": normalise_message_id(mail["In-Reply-To"]),
        "references": [r for r in references if r][-REFERENCES_MAX:],
        "date": _when(mail),
    }  # fmt: skip


def mail_record(account_id: str, salt: bytes, item: dict[str, Any]) -> IngressRecord:
    """One mail as an ingress record of source `email:<account>`: its thread the salted hash
    of its sender's address; a mail it cannot stand behind a dead row with the reason."""
    account = account_id.partition(":")[2]
    raw = bytes(item["raw"])
    event_id, key = new_event_id(), dedupe_key(raw)
    envelope: dict[str, Any] = {
        "specversion": "1.0", "id": event_id, "source": f"/channels/{DRIVER}/{account}",
        "type": TYPE_MESSAGE, "datacontenttype": "application/json",
    }  # fmt: skip
    dead = {"account": account, "uid": item.get("uid"), "dedupe_key": key}
    status, error = names.INGRESS_ACCEPTED, None
    try:
        if item.get("too_large") is not None:
            raise HostileMail(f"mail of {item['too_large']} bytes, over the bound")
        data = read_mail(raw, item.get("own"))
    except HostileMail as exc:
        status, error, envelope["data"] = names.INGRESS_DEAD, str(exc), dead
    except Exception as exc:  # the parser's own failure on hostile bytes: this mail's, not ours
        log.warning("email %s uid %s: the parser failed: %r", account, item.get("uid"), exc)
        status, error = names.INGRESS_DEAD, f"unreadable mail: {type(exc).__name__}"
        envelope["data"] = dead
    else:
        envelope["subject"] = thread_id(salt, DRIVER, account, data["reply_to"])
        if data["date"] is not None:
            envelope["time"] = data["date"]
        envelope["data"] = {"account": account, "uid": item.get("uid"), **data}
    size = encoded_size(envelope)
    if size > names.ENVELOPE_MAX_BYTES:
        envelope.pop("subject", None)
        envelope["data"] = dead
        status, error = names.INGRESS_DEAD, f"mail over {names.ENVELOPE_MAX_BYTES} bytes as JSON"
        size = encoded_size(envelope)
    return IngressRecord(
        source_key=account_id, dedupe_key=key, type=TYPE_MESSAGE, chain_id=event_id,
        envelope=envelope, size=size, klass=None, status=status, error=error,
    )  # fmt: skip


def reply_subject(subject: str | None, body: str) -> str:
    """`Re: <subject>` of the mail answered; a first mail, the body's first line."""
    if subject:
        subject = _clean(subject, SUBJECT_MAX_CHARS)
        return subject if subject.lower().startswith("re:") else f"Re: {subject}"
    first = next((line.strip() for line in body.splitlines() if line.strip()), "")
    return _clean(first, 78) or "(no subject)"


@dataclass(frozen=True)
class Answered:
    """The mail a reply answers, as its headers thread the reply."""

    message_id: str
    subject: str
    references: tuple[str, ...]


def answered_by(head: bytes, sender: str) -> Answered | None:
    """The mail whose headers are `head`, when it is from `sender` and has a Message-ID."""
    try:
        mail = BytesParser(policy=policy.default).parsebytes(head, headersonly=True)
        addresses = _addresses(mail)
        message_id = normalise_message_id(mail["Message-ID"])
        if len(addresses) != 1 or plain_address(addresses[0].addr_spec) != sender:
            return None
        if message_id is None or message_id.startswith("sha256:"):
            return None
        chain = [normalise_message_id(m) for m in _ID.findall(str(mail["References"] or ""))]
        refs = tuple(r for r in chain if r and not r.startswith("sha256:"))[-REFERENCES_MAX:]
        return Answered(message_id, _clean(str(mail["Subject"] or ""), SUBJECT_MAX_CHARS), refs)
    except Exception:  # the parser's failure on hostile headers: this reply is not threaded
        return None


def build_reply(sender: str, recipient: str, body: str, message_id: str,
                answered: Answered | None, now: datetime) -> EmailMessage:  # fmt: skip
    """The mail of one send: from the account to the recipient, threaded under the mail it
    answers (its Subject, In-Reply-To and References) when one is known. It says it was
    written by a program (`Auto-Submitted: auto-replied`, RFC 3834), so another responder
    does not answer it and two of them never loop."""
    mail = EmailMessage()
    mail["From"] = sender
    mail["To"] = recipient
    mail["Date"] = format_datetime(now)
    mail["Message-ID"] = message_id
    mail["Auto-Submitted"] = AUTO_SUBMITTED
    mail["Subject"] = reply_subject(answered.subject if answered else None, body)
    if answered is not None:
        mail["In-Reply-To"] = f"<{answered.message_id}>"
        chain = [*answered.references, answered.message_id][-REFERENCES_MAX:]
        mail["References"] = " ".join(f"<{r}>" for r in chain)
    mail.set_content(body)
    return mail
