"""Content rules (SPEC §11): which rules hold an outgoing message, named by rule id only.

`compile_rules` builds a generation's rules once; `Rules.holds` runs them on one message and
returns the ids of the rules it matches, the built-in ones first, then the spec's in its order.
Nothing here returns, logs or raises with the message's text: a hold names its rule, never what
matched.

Every pattern runs on RE2 (`google-re2`), whose matching time is linear in the text whatever the
pattern, so no crafted message makes a send hang on backtracking; at most
`RULES_SCAN_MAX_CHARS` of a message are scanned, and a longer one is held as `too-long-to-scan`.

Before matching, a message is NFKC-normalised (full-width and compatibility forms become the
plain ones) and its invisible format characters (zero-width spaces, soft hyphens, direction
marks) are removed, so `re\u200bfund` is the word `refund`. Keywords compare casefolded.
"""

from __future__ import annotations

import contextlib
import functools
import unicodedata
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from encodings import idna
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import re2

from eventos import names

if TYPE_CHECKING:
    from eventos.spec import ContentRule

OWNER_CHAT = "chat"
EMAIL = "email"
# What a keyword's edge must not touch: a letter, digit, combining mark or underscore.
_NOT_WORD = r"[^\pL\pN\pM_]"
# A spaced keyword phrase matches across any run of white space.
_SPACE = r"[\s\p{Z}]+"
# Scripts written without spaces between words: a keyword edge in one needs no boundary.
_UNSPACED = r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}]"
# A host name as text shows one: labels of letters, digits, marks, `_` and `-`, joined by dots.
_HOST = r"[\pL\pN\pM_-]+(?:\.[\pL\pN\pM_-]+)+"
_LABELS_MAX = 127  # DNS: a name has at most this many labels
_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})  # IDNA's other full stops


def _options() -> Any:
    options = re2.Options()
    options.max_mem = names.RULE_REGEX_MAX_MEM
    options.log_errors = False  # a refused pattern is reported to the owner, not on stderr
    # Only whether (and, for hosts, what) matched is read, never a group: without captures RE2
    # answers from its DFA alone, some 20 times faster on a long message.
    options.never_capture = True
    return options


def compile_regex(pattern: str) -> Any:
    """RE2's program for a pattern; ValueError with RE2's reason when RE2 refuses it."""
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(f"not a regular expression RE2 accepts: {reason}") from None


_FORMAT_CHARS = compile_regex(r"\p{Cf}+")
_UNSPACED_CHAR = compile_regex(_UNSPACED)
_HOSTS = compile_regex(_HOST)
_DOMAIN_LABEL = compile_regex(r"[a-z0-9_-]{1,63}")  # an IDNA (ASCII) label


def normalise_text(text: str) -> str:
    """NFKC, without invisible format characters: the text every rule looks at."""
    return str(_FORMAT_CHARS.sub("", unicodedata.normalize("NFKC", text)))


def _needs_boundary(char: str) -> bool:
    word = unicodedata.category(char)[0] in "LNM" or char == "_"
    return word and _UNSPACED_CHAR.fullmatch(char) is None


def keyword_regex(words: Sequence[str]) -> Any:
    """One RE2 program matching any of the words or phrases as whole words of casefolded text.

    A phrase's words match across any white space; an edge that is punctuation, or a letter of a
    script written without spaces (Chinese, Japanese, Thai …), needs no word boundary there.
    """
    groups: dict[tuple[bool, bool], list[str]] = {}
    for word in words:
        parts = normalise_text(word).casefold().split()
        if not parts:
            raise ValueError("a keyword is blank")
        edges = (_needs_boundary(parts[0][0]), _needs_boundary(parts[-1][-1]))
        groups.setdefault(edges, []).append(_SPACE.join(re2.escape(p) for p in parts))
    alternatives = [
        ("(?:^|" + _NOT_WORD + ")" if left else "")
        + "(?:" + "|".join(body) + ")"
        + ("(?:" + _NOT_WORD + "|$)" if right else "")
        for (left, right), body in sorted(groups.items())
    ]  # fmt: skip
    try:
        return compile_regex("|".join(alternatives))
    except ValueError:
        raise ValueError("the words make too large a pattern: use fewer or shorter ones") from None


def _labels(name: str) -> list[str]:
    """A host's or domain's labels as a message shows them: NFKC, IDNA's other full stops as
    dots, no trailing dot (the text every rule looks at is NFKC too)."""
    return unicodedata.normalize("NFKC", name.strip()).translate(_DOTS).rstrip(".").split(".")


def _ascii_label(label: str) -> str:
    if label.isascii():
        return label.lower()
    try:
        return str(idna.ToASCII(label).decode("ascii"))
    except UnicodeError:
        return label  # not an IDNA label: it stays as written and matches no listed domain


def normalise_host(host: str) -> str:
    """A host name compared as DNS does: casefolded, IDNA labels as punycode, no trailing dot."""
    return ".".join(_ascii_label(label.casefold()) for label in _labels(host))


def normalise_domain(domain: str) -> str:
    """A listed domain as `normalise_host` gives it; ValueError unless it is a domain name."""
    labels = [_ascii_label(label.casefold()) for label in _labels(domain)]
    normal = ".".join(labels)
    if (
        len(labels) < 2
        or len(normal) > names.DOMAIN_MAX_CHARS
        or any(_DOMAIN_LABEL.fullmatch(label) is None for label in labels)
    ):
        raise ValueError(f"{domain!r} is not a domain name such as example.com")
    return normal


def _label_forms(label: str) -> set[str]:
    """How a message may write one label of a listed domain: its IDNA form, casefolded, and
    for a Unicode label also the IDNA 2008 form, which keeps `ß` and `ς` (IDNA 2003 maps them)."""
    ascii_form = _ascii_label(label.casefold())
    forms = {ascii_form, label.casefold()}
    if not label.isascii():
        with contextlib.suppress(UnicodeError):
            forms.add("xn--" + label.lower().encode("punycode").decode("ascii"))
    if ascii_form.startswith("xn--"):
        with contextlib.suppress(UnicodeError):
            forms.add(idna.ToUnicode(ascii_form).casefold())
    return forms


@dataclass(frozen=True)
class _DomainIndex:
    """The listed domains of a generation's rules, for a walk of each host from its last label.

    A message's labels are looked up, never IDNA-encoded, so a crafted text costs at most a
    dictionary lookup per label, and a walk stops at the first suffix no listed domain has.
    """

    aliases: dict[str, str] = field(default_factory=dict)  # a label as written → its IDNA form
    suffixes: frozenset[str] = frozenset()  # every listed domain and each parent domain of it

    @classmethod
    def of(cls, written: Iterable[str]) -> _DomainIndex:
        aliases: dict[str, str] = {}
        suffixes: set[str] = set()
        for domain in written:
            labels = normalise_domain(domain).split(".")
            suffixes.update(".".join(labels[i:]) for i in range(len(labels)))
            for label, form in zip(labels, _labels(domain), strict=True):
                aliases.update(dict.fromkeys(_label_forms(form), label))
        return cls(aliases, frozenset(suffixes))

    def listed_in(self, text: str) -> set[str]:
        """The listed domains, and parents of them, that a host in the text is or is under."""
        found: set[str] = set()
        for host in _HOSTS.findall(text):
            suffix = ""
            for label in reversed(host.casefold().rsplit(".", _LABELS_MAX)):
                key = self.aliases.get(label, label if label.isascii() else None)
                if key is None:
                    break
                suffix = f"{key}.{suffix}" if suffix else key
                if suffix not in self.suffixes:
                    break
                found.add(suffix)
        return found


class _Message:
    """The forms of one message the rules look at, each computed when a rule first needs it."""

    def __init__(self, text: str, index: _DomainIndex) -> None:
        self.text = text
        self.index = index

    @functools.cached_property
    def normal(self) -> str:
        return normalise_text(self.text)

    @functools.cached_property
    def folded(self) -> str:
        return self.normal.casefold()

    @functools.cached_property
    def domains(self) -> frozenset[str]:
        """The listed domains a host in the message is or is under (URLs, e-mail addresses,
        bare names); a percent-encoded host counts too."""
        text = self.normal.translate(_DOTS)
        found = self.index.listed_in(text)
        if "%" in text:
            found |= self.index.listed_in(unquote(text))
        return frozenset(found)


@dataclass(frozen=True)
class _Rule:
    id: str
    applies_to: frozenset[str]

    def matches(self, message: _Message) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class _Keyword(_Rule):
    regex: Any

    def matches(self, message: _Message) -> bool:
        return self.regex.search(message.folded) is not None


@dataclass(frozen=True)
class _Regex(_Rule):
    regex: Any

    def matches(self, message: _Message) -> bool:
        return self.regex.search(message.normal) is not None


@dataclass(frozen=True)
class _Domain(_Rule):
    domains: frozenset[str]

    def matches(self, message: _Message) -> bool:
        return not self.domains.isdisjoint(message.domains)


def _address(address: str) -> str:
    local, at, domain = address.rpartition("@")
    return f"{local}@{normalise_host(domain)}" if at else address


def recipient_outside(kind: str, recipient: str | None, participants: Collection[str]) -> bool:
    """Whether a message to `recipient` leaves its conversation (never so for owner chat).

    A customer-channel message without a recipient counts as outside; e-mail addresses compare
    with their domain normalised, every other recipient exactly.
    """
    if kind == OWNER_CHAT:
        return False
    if recipient is None:
        return True
    if kind == EMAIL:
        return _address(recipient) not in {_address(p) for p in participants}
    return recipient not in participants


@dataclass(frozen=True)
class Rules:
    """A generation's compiled content rules."""

    rules: tuple[_Rule, ...] = ()
    domains: _DomainIndex = _DomainIndex()

    def holds(
        self, kind: str, text: str, recipient: str | None, participants: Collection[str]
    ) -> list[str]:
        """The ids of the rules this message matches: the built-in ones first, then the spec's
        in its order. Empty: nothing holds it."""
        held = []
        if recipient_outside(kind, recipient, participants):
            held.append(names.RULE_RECIPIENT_OUTSIDE)
        applying = [rule for rule in self.rules if kind in rule.applies_to]
        if not applying:
            return held
        if len(text) > names.RULES_SCAN_MAX_CHARS:
            held.append(names.RULE_TOO_LONG)
            text = text[: names.RULES_SCAN_MAX_CHARS]
        message = _Message(text, self.domains)
        return held + [rule.id for rule in applying if rule.matches(message)]


def _compile(rule: ContentRule) -> _Rule:
    applies_to = frozenset(rule.applies_to)
    if rule.kind == "keyword":
        return _Keyword(rule.id, applies_to, keyword_regex(rule.words or ()))
    if rule.kind == "regex":
        return _Regex(rule.id, applies_to, compile_regex(rule.pattern or ""))
    domains = frozenset(normalise_domain(d) for d in rule.domains or ())
    return _Domain(rule.id, applies_to, domains)


def compile_rules(spec_rules: Sequence[ContentRule]) -> Rules:
    """A generation's rules (`spec.content_rules`), compiled once; the spec validated them."""
    listed = [domain for rule in spec_rules for domain in rule.domains or ()]
    return Rules(tuple(_compile(rule) for rule in spec_rules), _DomainIndex.of(listed))
