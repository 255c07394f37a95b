"""`spec.flags` (SPEC §3, EG2): documented names only, booleans, each with its default; a spec
without flags is stored as before flags existed; docs/flags.md lists every flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventos import names
from eventos.employees.lifecycle import spec_digest
from eventos.errors import SpecInvalid
from eventos.spec.model import load_specs, parse_spec, resolve_flags, yaml_documents

DOCS = Path(__file__).parents[3] / "docs" / "flags.md"
SPEC = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: reader}
spec:
  agents:
    - {name: front, model: {provider: local, name: scripted}}
"""


def with_flags(flags: str) -> str:
    return SPEC + f"  flags: {flags}\n"


def errors_of(text: str) -> dict[str, str]:
    with pytest.raises(SpecInvalid) as info:
        load_specs(text)
    return dict(info.value.errors)


def test_absent_flags_take_their_defaults_and_leave_the_stored_spec_as_it_was() -> None:
    (spec,) = load_specs(SPEC)
    assert spec.spec.resolved_flags() == {names.FLAG_CONCURRENT_READ_ONLY_TOOLS: False}
    doc, _ = spec_digest(spec)
    assert "flags" not in doc["spec"]  # the digest of a spec applied before flags is unchanged


def test_a_flag_set_in_the_spec_is_frozen_with_its_snapshot() -> None:
    (spec,) = load_specs(with_flags("{concurrent_read_only_tools: true}"))
    assert spec.spec.resolved_flags()[names.FLAG_CONCURRENT_READ_ONLY_TOOLS] is True
    doc, _ = spec_digest(spec)
    assert resolve_flags(doc["spec"]["flags"]) == spec.spec.resolved_flags()


def test_an_unknown_flag_is_refused_with_its_path_and_the_known_names() -> None:
    errors = errors_of(with_flags("{fast_mode: true}"))
    assert errors == {"spec.flags.fast_mode":
                      "unknown flag 'fast_mode'; known flags: concurrent_read_only_tools"}  # fmt: skip


@pytest.mark.parametrize("value", ['"yes"', "1", "on_weekdays", "null"])
def test_a_flag_is_a_boolean(value: str) -> None:
    errors = errors_of(with_flags(f"{{concurrent_read_only_tools: {value}}}"))
    assert list(errors) == ["spec.flags.concurrent_read_only_tools"]


def test_a_snapshot_with_a_flag_no_longer_documented_reads_the_defaults() -> None:
    assert resolve_flags({"gone": True, names.FLAG_CONCURRENT_READ_ONLY_TOOLS: "x"}) == {
        names.FLAG_CONCURRENT_READ_ONLY_TOOLS: False
    }


def test_every_flag_is_documented_with_its_default() -> None:
    text = DOCS.read_text()
    for name, (default, _) in names.FLAGS.items():
        assert f"| `{name}` | `{str(default).lower()}` |" in text, name


def test_a_stored_spec_with_a_flag_no_longer_documented_still_starts() -> None:
    (spec,) = yaml_documents(with_flags("{gone_in_this_release: true}"))
    stored = parse_spec(spec, stored=True)
    assert stored.spec.resolved_flags() == {names.FLAG_CONCURRENT_READ_ONLY_TOOLS: False}
    with pytest.raises(SpecInvalid):
        parse_spec(spec)  # a new apply still refuses it
