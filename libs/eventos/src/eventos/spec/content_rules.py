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

Keywords also match after two foldings a sender could use to slip past them (issue 25):
- confusables: the message and the keyword are compared as UTS #39 skeletons (`disarm`'s
  `skeleton_key`, Unicode's confusables.txt; digits fold too, `0` as `o` and `1` as `l`), so a
  Cyrillic `\u0435` in `r\u0435fund`, or `refund` in mathematical bold letters, is the
  word `refund`;
- separators inside a word: up to three punctuation or symbol characters between two runs of
  letters are dropped (`re-fund`, `re..fund`), and a one-word keyword of three or more letters
  also matches spelled out, one letter at a time with up to three separators (white space
  included) between them (`r-e-f-u-n-d`, `r.e.f.u.n.d`, `r e f u n d`, `a r e f u n d`).
  White space between longer words is never dropped, so `are fun day` or `re fund` stay
  separate words, and a spelled-out word needs a word boundary at both ends
  (`prer-e-f-u-n-d` does not hold `refund`; `r e f u n d s` does, as `refund s` would).
Regex rules see the NFKC text only (their patterns are the owner's); domain rules look for
hosts as written.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import unicodedata
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from encodings import idna
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import re2
from disarm import skeleton_key

from eventos import names

if TYPE_CHECKING:
    from eventos.spec.model import ContentRule

OWNER_CHAT = "chat"
EMAIL = "email"
# What a keyword's edge must not touch: a letter, digit, combining mark or underscore.
_NOT_WORD = r"[^\pL\pN\pM_]"
# A spaced keyword phrase matches across any run of white space.
_SPACE = r"[\s\p{Z}]+"
# Scripts written without spaces between words: a keyword edge in one needs no boundary.
_UNSPACED = r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}]"
# What a host's edge must not touch: a character of a label (as a message writes one).
_NOT_LABEL = r"[^\pL\pN\pM_-]"
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
_DOMAIN_LABEL = compile_regex(r"[a-z0-9_-]{1,63}")  # an IDNA (ASCII) label


def normalise_text(text: str) -> str:
    """NFKC, without invisible format characters: the text every rule looks at."""
    return str(_FORMAT_CHARS.sub("", unicodedata.normalize("NFKC", text)))


def skeleton(text: str) -> str:
    """The casefolded UTS #39 skeleton of NFKC text (confusables folded, digits included)."""
    return str(skeleton_key(text, digit_policy="tr39")).casefold()


SEPARATOR_RUN_MAX = 3  # separator characters between two letters of one word
SPELLED_MIN = 3  # letters written one by one before they are joined into a word


def _is_letter(char: str) -> bool:
    return unicodedata.category(char)[0] in "LNM"


def _runs(text: str) -> Iterator[tuple[bool, str]]:
    """The text as alternating runs of letters (letters, digits, marks) and of separators."""
    for letters, run in itertools.groupby(text, _is_letter):
        yield letters, "".join(run)


def joined(text: str) -> str:
    """The text with separators inside words normalised: letters spelled one by one with up to
    SEPARATOR_RUN_MAX separators between them (`r-e-f-u-n-d`, `r  e  f`) written one space
    apart (a keyword's spelled form matches them: `a r e f u n d` cannot tell the article from
    the word), and short punctuation between longer runs of letters (`re-fund`) dropped. One
    pass over the text (no backtracking)."""
    runs = list(_runs(text))
    out: list[str] = []
    i = 0
    while i < len(runs):
        letters, run = runs[i]
        if letters and len(run) == 1:
            j, spelled = i, [run]
            while (j + 2 < len(runs) and len(runs[j + 1][1]) <= SEPARATOR_RUN_MAX
                   and len(runs[j + 2][1]) == 1):  # fmt: skip
                spelled.append(runs[j + 2][1])
                j += 2
            if len(spelled) >= SPELLED_MIN:
                out.append(" ".join(spelled))
                i = j + 1
                continue
        inside = 0 < i < len(runs) - 1 and len(run) <= SEPARATOR_RUN_MAX
        if not letters and inside and not any(c.isspace() for c in run):
            i += 1  # punctuation between two runs of letters: the word goes on
            continue
        out.append(run)
        i += 1
    return "".join(out)


def _needs_boundary(char: str) -> bool:
    word = unicodedata.category(char)[0] in "LNM" or char == "_"
    return word and _UNSPACED_CHAR.fullmatch(char) is None


def keyword_regex(words: Sequence[str]) -> Any:
    """One RE2 program matching any of the words or phrases as whole words of casefolded text.

    A phrase's words match across any white space; an edge that is punctuation, or a letter of a
    script written without spaces (Chinese, Japanese, Thai …), needs no word boundary there.
    """
    groups: dict[tuple[bool, bool], list[str]] = {}
    for parts in _forms(words):
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


def _forms(words: Sequence[str]) -> list[tuple[str, ...]]:
    """Each keyword as the parts (words) of its forms, once each: casefolded, as its skeleton,
    and a one-word keyword of SPELLED_MIN or more letters also spelled out letter by letter as
    `joined` writes a spelled word (one part: its letters one space apart, matched as is)."""
    forms: dict[tuple[str, ...], None] = {}
    for word in words:
        folded = normalise_text(word).casefold()
        if not folded.split():
            raise ValueError("a keyword is blank")
        forms[tuple(folded.split())] = None
        skel = skeleton(folded).split()
        if skel:
            forms[tuple(skel)] = None
        if len(skel) == 1 and len(skel[0]) >= SPELLED_MIN and all(map(_is_letter, skel[0])):
            forms[(" ".join(skel[0]),)] = None
    return list(forms)


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


def domain_regex(domains: Sequence[str]) -> Any:
    """One RE2 program matching, in casefolded text, a host at any of the domains or under one.

    The host must stand alone: no label character (letter, digit, mark, `_`, `-`) before it, and
    after it none either, nor a dot that starts another label (`example.com.evil.org`).
    """
    alternatives = []
    for domain in domains:
        normalise_domain(domain)
        labels = [sorted(map(re2.escape, _label_forms(label))) for label in _labels(domain)]
        alternatives.append(r"\.".join("(?:" + "|".join(forms) + ")" for forms in labels))
    before = "(?:^|" + _NOT_LABEL + ")"
    after = r"(?:$|[^\pL\pN\pM_.-]|\.(?:$|" + _NOT_LABEL + "))"
    try:
        return compile_regex(before + "(?:" + "|".join(alternatives) + ")" + after)
    except ValueError:
        raise ValueError(
            "the domains make too large a pattern: use fewer or shorter ones"
        ) from None


class _Message:
    """The forms of one message the rules look at, each computed when a rule first needs it."""

    def __init__(self, text: str) -> None:
        self.text = text

    @functools.cached_property
    def normal(self) -> str:
        return normalise_text(self.text)

    @functools.cached_property
    def folded(self) -> str:
        return self.normal.casefold()

    @functools.cached_property
    def keyword_texts(self) -> tuple[str, ...]:
        """Where keywords look: the folded text, its skeleton, and the skeleton with
        separators inside words dropped."""
        skel = skeleton(self.normal)
        return self.folded, skel, joined(skel)

    @functools.cached_property
    def hosts(self) -> list[str]:
        """The folded text with IDNA's full stops as dots, and percent-decoded if it has a `%`:
        where domain rules look for hosts."""
        text = self.folded.translate(_DOTS)
        if "%" not in text:
            return [text]
        return [text, normalise_text(unquote(text)).casefold().translate(_DOTS)]


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
        return any(self.regex.search(text) is not None for text in message.keyword_texts)


@dataclass(frozen=True)
class _Regex(_Rule):
    regex: Any

    def matches(self, message: _Message) -> bool:
        return self.regex.search(message.normal) is not None


@dataclass(frozen=True)
class _Domain(_Rule):
    regex: Any

    def matches(self, message: _Message) -> bool:
        return any(self.regex.search(text) is not None for text in message.hosts)


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
        message = _Message(text)
        return held + [rule.id for rule in applying if rule.matches(message)]


def _compile(rule: ContentRule) -> _Rule:
    applies_to = frozenset(rule.applies_to)
    if rule.kind == "keyword":
        return _Keyword(rule.id, applies_to, keyword_regex(rule.words or ()))
    if rule.kind == "regex":
        return _Regex(rule.id, applies_to, compile_regex(rule.pattern or ""))
    return _Domain(rule.id, applies_to, domain_regex(rule.domains or ()))


def compile_rules(spec_rules: Sequence[ContentRule]) -> Rules:
    """A generation's rules (`spec.content_rules`), compiled once; the spec validated them."""
    return Rules(tuple(_compile(rule) for rule in spec_rules))
