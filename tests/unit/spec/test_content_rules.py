"""Content rules (SPEC §11): each kind matches what it should and nothing else, the built-in
recipient rule spares owner chat, holds name rule ids in a stable order, a crafted message cannot
hang the scan, and a bad rule is refused at its field path."""

from __future__ import annotations

import pytest

from eventos import names
from eventos.errors import SpecInvalid
from eventos.spec.content_rules import Rules, compile_rules, recipient_outside
from eventos.spec.model import load_specs

OUTSIDE = names.RULE_RECIPIENT_OUTSIDE


def wide(text: str) -> str:
    """ASCII text in its full-width forms (U+FF01…U+FF5E)."""
    return "".join(chr(ord(c) + 0xFEE0) for c in text)


def spec(rules: str) -> str:
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: support}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}}}]
  content_rules:
{rules}
"""


def compiled(*rules: str) -> Rules:
    (parsed,) = load_specs(spec("".join(f"    - {r}\n" for r in rules)))
    return compile_rules(parsed.spec.content_rules)


def errors_of(*rules: str) -> dict[str, str]:
    with pytest.raises(SpecInvalid) as info:
        compiled(*rules)
    return dict(info.value.errors)


def held(rules: Rules, text: str, kind: str = "telegram") -> list[str]:
    """The holds of a message to a participant (the built-in rule stays quiet)."""
    return rules.holds(kind, text, "u1", {"u1"})


KEYWORDS = compiled(
    "{id: refunds, kind: keyword, words: [refund, 'money back', Straße, café, 退款]}"
)


@pytest.mark.parametrize(
    "text",
    [
        "You get a refund.",
        "REFUND!",
        "(Refund)",
        "we give your Money   back",  # a phrase matches across any white space
        "money\u00a0back",  # … no-break space included
        wide("refund"),  # full-width letters are NFKC-normalised
        "re\u200bfund",  # a zero-width space does not split the word
        "re\u00adfund",  # nor a soft hyphen
        "STRASSE",  # casefolded: ß is ss
        "un CAFÉ noir",
        "un cafe\u0301 noir",  # e + combining acute is é
        "请申请退款谢谢",  # no word boundary in a script without spaces
        "line one\nrefund",
    ],
)
def test_a_keyword_matches_as_a_whole_word_in_any_case(text: str) -> None:
    assert held(KEYWORDS, text) == ["refunds"]


@pytest.mark.parametrize(
    "text",
    [
        "refunds are not possible",  # another word that starts with it
        "prerefund",
        "refund_id",  # the underscore is a word character
        "refund2",
        "money-back",  # a phrase's words need white space between them
        "moneyback",
        "cafés",
        "caféteria",
        "Strasser",
        "退",
        "",
    ],
)
def test_a_keyword_does_not_match_inside_a_longer_word(text: str) -> None:
    assert held(KEYWORDS, text) == []


def test_a_keyword_edge_of_punctuation_needs_no_boundary() -> None:
    rules = compiled("{id: lang, kind: keyword, words: [c++, '#promo']}")
    assert held(rules, "we write c++code") == ["lang"]
    assert held(rules, "tag:#promo") == ["lang"]
    assert held(rules, "c+ and promo") == []


REGEX = compiled(r"{id: cards, kind: regex, pattern: '(?:\d[ -]?){13,15}\d'}")


def test_a_regex_matches_where_its_pattern_does() -> None:
    assert held(REGEX, "card 4111 1111 1111 1111 exp 12/29") == ["cards"]
    assert held(REGEX, "card " + wide("4111111111111111")) == ["cards"]  # full-width digits
    assert held(REGEX, "order 4111-1111") == []
    assert held(compiled("{id: ci, kind: regex, pattern: '(?i)secret'}"), "SeCrEt") == ["ci"]
    assert held(compiled("{id: cs, kind: regex, pattern: 'secret'}"), "SECRET") == []


def test_a_crafted_message_does_not_hang_a_backtracking_pattern() -> None:
    rules = compiled("{id: redos, kind: regex, pattern: '(a+)+$'}", "{id: nested, kind: regex, "
                     "pattern: '^(\\w+\\s?)*$'}")  # fmt: skip
    hostile = "a" * names.RULES_SCAN_MAX_CHARS + "!"  # one past the scan: scanned up to the cap
    assert held(rules, "a" * 50_000 + "!") == []
    assert held(rules, "a" * 50_000) == ["redos", "nested"]
    assert held(rules, hostile) == [names.RULE_TOO_LONG, "redos", "nested"]
    assert held(rules, "word " * 10_000 + "!") == []


DOMAINS = compiled("{id: rivals, kind: domain, domains: [Example.COM, bücher.example]}")


@pytest.mark.parametrize(
    "text",
    [
        "see example.com",
        "see EXAMPLE.com.",  # trailing dot and case
        "https://example.com",
        "https://www.example.com/path?q=1#top",  # subdomains count
        "http://shop.eu.example.com:8080/cart",  # port and path
        "http://user:pw@example.com/",  # userinfo
        "https://good.org@example.com/",  # the real host after a userinfo that looks like one
        "https://example.com@good.org/",  # … and a userinfo naming the domain mentions it too
        "write to sales@example.com",
        "mailto:Sales@Mail.Example.Com",
        wide("example.com"),  # full-width letters and dot
        "example。com",  # the ideographic full stop is a dot to IDNA
        "exa\u200bmple.com",  # a zero-width space inside
        "https://%65xample.com/",  # percent-encoded host
        "https://bücher.example/",
        "https://BÜCHER.example/",
        "https://xn--bcher-kva.example/",  # the punycode form of the listed Unicode domain
        "shop.xn--bcher-kva.example",
    ],
)
def test_a_domain_matches_its_links_mentions_and_addresses(text: str) -> None:
    assert held(DOMAINS, text) == ["rivals"]


@pytest.mark.parametrize(
    "text",
    [
        "evil-example.com",  # a look-alike, not a subdomain
        "https://notexample.com/",
        "example.com.evil.org",  # the domain as a label of another
        "https://example.company/",
        "example.co",
        "example com",
        "example",
        "sales@evil-example.com",
        "buecher.example",
        "https://xn--bcher-kva.example.org/",
    ],
)
def test_a_domain_does_not_match_look_alikes(text: str) -> None:
    assert held(DOMAINS, text) == []


def test_a_host_longer_than_dns_allows_still_matches_the_domain_it_ends_in() -> None:
    longest = ".".join(["x" * 63, "y" * 63, "z" * 63, "w" * 61])  # 253 characters
    rules = compiled(f"{{id: long, kind: domain, domains: [{longest}]}}")
    assert held(rules, f"https://{'a' * 400}.{longest}/") == ["long"]
    assert held(rules, f"https://abc{longest}/") == []  # its first label is abcxxx…, not xxx…


def test_a_domain_written_with_compatibility_dots_is_the_same_domain() -> None:
    rules = compiled(f"{{id: dots, kind: domain, domains: [example\u2024com, {wide('ex.')}org]}}")
    assert held(rules, "mail me at a@example.com") == ["dots"]
    assert held(rules, "https://ex.org/") == ["dots"]


def test_punycode_listed_matches_unicode_written() -> None:
    rules = compiled("{id: idn, kind: domain, domains: [XN--BCHER-KVA.example]}")
    assert held(rules, "https://www.bücher.example/") == ["idn"]


@pytest.mark.parametrize(
    "host", ["straße.example", "STRASSE.example", "xn--strae-oqa.example", "a.Straße.example"]
)
def test_a_sharp_s_domain_matches_in_idna_2003_and_2008_forms(host: str) -> None:
    rules = compiled("{id: idn, kind: domain, domains: [Straße.example]}")
    assert held(rules, f"https://{host}/") == ["idn"]
    assert held(rules, "https://strase.example/") == []


def test_the_built_in_rule_holds_a_recipient_outside_the_conversation() -> None:
    assert recipient_outside("telegram", "u2", {"u1"})
    assert not recipient_outside("telegram", "u1", {"u1", "u3"})
    assert recipient_outside("whatsapp_business", None, {"u1"})  # no recipient: outside
    assert recipient_outside("discord", "U1", {"u1"})  # ids compare exactly
    assert not recipient_outside("email", "Ann@Example.COM", ["Ann@example.com"])
    assert recipient_outside("email", "ann@example.com", ["Ann@example.com"])
    assert recipient_outside("email", "ann@example.com.evil.org", ["ann@example.com"])


def test_owner_chat_is_never_outside_its_conversation() -> None:
    assert not recipient_outside("chat", "someone-else", set())
    assert not recipient_outside("chat", None, set())
    assert Rules().holds("chat", "hello", "someone-else", ()) == []
    assert Rules().holds("telegram", "hello", "someone-else", ()) == [OUTSIDE]


def test_holds_name_every_matching_rule_built_in_first_in_spec_order() -> None:
    rules = compiled(
        "{id: zeta, kind: domain, domains: [example.com]}",
        "{id: alpha, kind: keyword, words: [refund]}",
        "{id: quiet, kind: keyword, words: [never-said]}",
        "{id: mid, kind: regex, pattern: '\\d{4}'}",
    )
    text = "refund 1234 at example.com"
    assert rules.holds("telegram", text, "u9", {"u1"}) == [OUTSIDE, "zeta", "alpha", "mid"]
    assert rules.holds("telegram", text, "u1", {"u1"}) == ["zeta", "alpha", "mid"]
    assert rules.holds("telegram", "nothing here", "u1", {"u1"}) == []


def test_holds_never_carry_the_matched_text() -> None:
    rules = compiled("{id: secret-word, kind: keyword, words: [hunter2]}")
    holds = rules.holds("email", "the password is hunter2", "a@b.example", ["a@b.example"])
    assert holds == ["secret-word"]
    assert not any("hunter2" in h for h in holds)


def test_rules_apply_to_customer_channels_unless_owner_chat_is_named() -> None:
    default = compiled("{id: word, kind: keyword, words: [refund]}")
    for kind in names.CHANNEL_KINDS:
        assert held(default, "refund", kind) == ["word"]
    assert held(default, "refund", "chat") == []
    chosen = compiled("{id: word, kind: keyword, words: [refund], applies_to: [chat, email]}")
    assert [held(chosen, "refund", k) for k in ("chat", "email", "telegram")] == [
        ["word"],
        ["word"],
        [],
    ]


def test_a_message_past_the_scan_is_held_only_where_rules_apply() -> None:
    long = "x " * names.RULES_SCAN_MAX_CHARS
    assert held(compiled("{id: word, kind: keyword, words: [refund]}"), long) == [
        names.RULE_TOO_LONG
    ]
    assert held(Rules(), long) == []  # no rule scans it
    tail = "x" * names.RULES_SCAN_MAX_CHARS + " refund"
    assert held(compiled("{id: word, kind: keyword, words: [refund]}"), tail) == [
        names.RULE_TOO_LONG
    ]


def test_a_spec_without_rules_compiles_to_none() -> None:
    (parsed,) = load_specs(spec("    []"))
    assert compile_rules(parsed.spec.content_rules) == Rules()


@pytest.mark.parametrize(
    ("rules", "path", "fragment"),
    [
        (["{id: a, kind: keyword, words: [x]}", "{id: a, kind: regex, pattern: y}"],
         "spec.content_rules[1].id", "duplicate rule id 'a'"),
        (["{id: bad, kind: regex, pattern: '(?<=a)b'}"],
         "spec.content_rules[0].pattern", "RE2 accepts: invalid perl operator"),
        (["{id: bad, kind: regex, pattern: '(a'}"],
         "spec.content_rules[0].pattern", "missing )"),
        (["{id: big, kind: regex, pattern: '(\\pL{100}){10}'}"],
         "spec.content_rules[0].pattern", "pattern too large"),
        (["{id: bad, kind: regex, words: [x]}"],
         "spec.content_rules[0].words", "only a keyword rule takes it"),
        (["{id: bad, kind: regex}"], "spec.content_rules[0].pattern", "a regex rule needs it"),
        (["{id: bad, kind: keyword, words: []}"],
         "spec.content_rules[0].words", "at least 1 item"),
        (["{id: bad, kind: keyword, words: [ok, '\u200b ']}"],
         "spec.content_rules[0].words[1]", "a keyword is blank"),
        (["{id: bad, kind: domain, domains: [example.com, 'https://example.com']}"],
         "spec.content_rules[0].domains[1]", "not a domain name"),
        (["{id: bad, kind: domain, domains: [localhost]}"],
         "spec.content_rules[0].domains[0]", "not a domain name"),
        (["{id: bad, kind: domain, domains: ['*.example.com']}"],
         "spec.content_rules[0].domains[0]", "not a domain name"),
        (["{id: bad, kind: spam, words: [x]}"], "spec.content_rules[0].kind", "'keyword'"),
        (["{id: Bad_Id, kind: keyword, words: [x]}"], "spec.content_rules[0].id", "pattern"),
        (["{id: recipient-outside, kind: keyword, words: [x]}"],
         "spec.content_rules[0].id", "built-in rule"),
        (["{id: bad, kind: keyword, words: [x], applies_to: [grpc]}"],
         "spec.content_rules[0].applies_to[0]", "'chat'"),
        (["{id: bad, kind: keyword, words: [x], applies_to: [chat, chat]}"],
         "spec.content_rules[0].applies_to", "twice"),
        (["{id: bad, kind: keyword, words: [x], applies_to: []}"],
         "spec.content_rules[0].applies_to", "at least 1 item"),
        (["{id: bad, kind: keyword, words: [x], text: y}"],
         "spec.content_rules[0].text", "Extra inputs"),
        ([f"{{id: bad, kind: regex, pattern: '{'a' * (names.RULE_PATTERN_MAX_CHARS + 1)}'}}"],
         "spec.content_rules[0].pattern", "at most 1000 characters"),
        ([f"{{id: bad, kind: keyword, words: [{'w' * (names.RULE_WORD_MAX_CHARS + 1)}]}}"],
         "spec.content_rules[0].words[0]", "at most 200 characters"),
        ([f"{{id: bad, kind: keyword, words: [{', '.join(['w'] * (names.RULE_ITEMS_MAX + 1))}]}}"],
         "spec.content_rules[0].words", "at most 100 items"),
        ([f"{{id: r{i}, kind: keyword, words: [x]}}" for i in range(names.CONTENT_RULES_MAX + 1)],
         "spec.content_rules", "at most 100 items"),
        ([f"{{id: r{i}, kind: keyword, words: [{', '.join(['w' * 200] * 10)}]}}"
          for i in range(33)],
         "spec.content_rules", "total 66000 characters; at most 65536"),
    ],
)  # fmt: skip
def test_a_bad_rule_is_refused_at_its_field(rules: list[str], path: str, fragment: str) -> None:
    errors = errors_of(*rules)
    assert path in errors, errors
    assert fragment in errors[path]


def test_the_largest_keyword_rule_compiles() -> None:
    words = ", ".join(f"w{i:03d}{'x' * 196}" for i in range(names.RULE_ITEMS_MAX))
    rules = compiled(f"{{id: many, kind: keyword, words: [{words}]}}")
    assert held(rules, f"say w042{'x' * 196}!") == ["many"]
    assert held(rules, f"say w042{'x' * 195}!") == []


def test_the_largest_domain_rule_compiles() -> None:
    tail = ".".join(["x" * 63, "y" * 63, "w" * 61])
    domains = ", ".join(f"d{i:03d}{'ü' * 50}.{tail}" for i in range(names.RULE_ITEMS_MAX))
    rules = compiled(f"{{id: many, kind: domain, domains: [{domains}]}}")
    assert held(rules, f"https://www.d042{'Ü' * 50}.{tail}/") == ["many"]
    assert held(rules, f"https://d042{'ü' * 49}.{tail}/") == []


REFUND = compiled("{id: refunds, kind: keyword, words: [refund, 'money back']}")


@pytest.mark.parametrize(
    "text",
    [
        "I want a r\u0435fund",  # Cyrillic ie
        "R\u0415FUND please",  # Cyrillic capital ie
        "\U0001d42b\U0001d41e\U0001d41f\U0001d42e\U0001d427\U0001d41d",  # mathematical bold
        "r\u0435f\u057dnd",  # Cyrillic ie and Armenian seh
        "r-e-f-u-n-d",
        "r.e.f.u.n.d now",
        "r e f u n d",
        "r_e_f_u_n_d",
        "r - e - f - u - n - d",
        "re-fund",
        "re..fund!",
        "r-e-fund",
        "r-\u0435-f-u-n-d",  # both at once
        "give me a r-e-f-u-n-d",  # a one-letter word just before it
        "give me a r e f u n d",
        "m\u043eney back",  # a phrase's words fold too
    ],
)
def test_a_keyword_matches_confusables_and_separators_inside_the_word(text: str) -> None:
    assert held(REFUND, text) == ["refunds"]


@pytest.mark.parametrize(
    "text",
    [
        "are fun day",  # white space between longer words is never dropped
        "re fund",
        "prer-e-f-u-n-d",  # the joined word still needs its boundaries
        "a refunder",
        "we are fun, d",
        "money-back",
        "RE: fund transfer",
    ],
)
def test_separators_between_words_are_not_dropped(text: str) -> None:
    assert held(REFUND, text) == []


def test_digits_fold_as_their_look_alikes_in_keywords_only() -> None:
    rules = compiled("{id: drugs, kind: keyword, words: [cocaine]}")
    assert held(rules, "c0caine for sale") == ["drugs"]
    assert held(rules, "c0c4ine") == []  # 4 looks like no letter
    regex = compiled("{id: pins, kind: regex, pattern: '[0-9]{4}'}")
    assert held(regex, "pin 1234") == ["pins"]  # regexes see the text as written
