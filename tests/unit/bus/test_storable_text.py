"""Model output made storable (issue 25 point 9): NUL and lone surrogates become U+FFFD, in
text and in every string of a JSON value, keys included; other text is left as it is."""

from __future__ import annotations

from eventos.bus.jsonsafe import REPLACEMENT, storable_fault, storable_text, storable_value


def test_nul_and_lone_surrogates_become_the_replacement_character() -> None:
    assert storable_text("a\x00b\ud800c") == f"a{REPLACEMENT}b{REPLACEMENT}c"
    assert storable_text("plain") == "plain"
    assert storable_text("caf\u00e9 \U0001f600") == "caf\u00e9 \U0001f600"


def test_every_string_of_a_value_is_made_storable() -> None:
    value = {"k\x00": ["x\x00", {"deep": "\udfff"}], "n": 1, "ok": None}
    fixed = storable_value(value)
    assert fixed == {f"k{REPLACEMENT}": [f"x{REPLACEMENT}", {"deep": REPLACEMENT}], "n": 1,
                     "ok": None}  # fmt: skip
    assert storable_fault(fixed) is None and storable_fault(value) is not None
