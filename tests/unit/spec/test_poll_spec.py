"""Poll triggers in the spec: a valid one compiles to its `poll:` source; every bad field is
refused at its field path."""

from __future__ import annotations

import pytest

from eventos import names
from eventos.employees.lifecycle import compile_subscriptions
from eventos.errors import SpecInvalid
from eventos.spec.model import load_specs


def spec(trigger: str) -> str:
    return f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: watcher}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}}}]
  triggers:
    - {{kind: chat}}
    - {trigger}
"""


GOOD = ("{kind: poll, name: orders, interval_s: 60, url: 'https://api.example.com/orders?x=1', "
        "cursor_param: after, items_path: data.items, cursor_path: meta.next, id_path: id, "
        "auth: {scheme: header, secret: orders-token, header: X-Api-Key}}")  # fmt: skip


def errors_of(trigger: str) -> dict[str, str]:
    with pytest.raises(SpecInvalid) as info:
        load_specs(spec(trigger))
    return dict(info.value.errors)


def test_a_poll_trigger_parses_and_listens_to_its_poll_source() -> None:
    (parsed,) = load_specs(spec(GOOD))
    poll = parsed.spec.triggers[1]
    assert (poll.url, poll.items_path, poll.cursor_path, poll.klass) == (
        "https://api.example.com/orders?x=1", "data.items", "meta.next", names.C4_BACKGROUND)  # fmt: skip
    assert poll.auth is not None and poll.auth.secret == "orders-token"
    subs = {s["trigger_name"]: s for s in compile_subscriptions(parsed, 1)}
    assert subs["orders"]["source_key"] == "poll:watcher/orders"


def test_the_minimal_poll_has_no_cursor_and_no_auth() -> None:
    (parsed,) = load_specs(spec("{kind: poll, interval_s: 30, url: 'http://127.0.0.1:9/x', "
                                "items_path: items}"))  # fmt: skip
    assert parsed.trigger_names()[1] == "poll-1"
    assert parsed.spec.triggers[1].cursor_param is None


@pytest.mark.parametrize(
    ("trigger", "path", "message"),
    [
        ("{kind: poll, interval_s: 10, url: 'https://a.example', items_path: i}",
         "spec.triggers[1].interval_s", "must be at least 30 s"),
        ("{kind: poll, interval_s: 60, url: 'ftp://a.example/x', items_path: i}",
         "spec.triggers[1].url", "must be an http or https URL with a host"),
        ("{kind: poll, interval_s: 60, url: 'https://u:p@a.example/x', items_path: i}",
         "spec.triggers[1].url", "must not carry credentials (use auth with a secret reference)"),
        ("{kind: poll, interval_s: 60, items_path: i}",
         "spec.triggers[1].url", "a poll trigger needs it"),
        ("{kind: poll, interval_s: 60, url: 'https://a.example'}",
         "spec.triggers[1].items_path", "a poll trigger needs it"),
        ("{kind: poll, interval_s: 60, url: 'https://a.example', items_path: 'a..b'}",
         "spec.triggers[1].items_path", "String should match pattern"),
        ("{kind: poll, interval_s: 60, url: 'https://a.example', items_path: i, cursor_param: c}",
         "spec.triggers[1].cursor_path", "cursor_param and cursor_path go together"),
        ("{kind: poll, interval_s: 60, url: 'https://a.example', items_path: i, "
         "auth: {scheme: bearer, secret: sk-live-123}}",
         "spec.triggers[1].auth.secret", "must be a secret reference (a name), not a secret value"),
        ("{kind: poll, interval_s: 60, url: 'https://a.example', items_path: i, "
         "auth: {scheme: header, secret: tok}}",
         "spec.triggers[1].auth", "scheme header needs a header; scheme bearer takes none"),
        ("{kind: poll, interval_s: 60, url: 'https://a.example', items_path: i, "
         "auth: {scheme: bearer, token: abc}}",
         "spec.triggers[1].auth.token", "Extra inputs are not permitted"),
        ("{kind: cron, schedule: '0 3 * * *', url: 'https://a.example'}",
         "spec.triggers[1].url", "only a poll trigger takes it"),
    ],
)  # fmt: skip
def test_bad_poll_fields_are_refused_at_their_paths(trigger: str, path: str, message: str) -> None:
    errors = errors_of(trigger)
    assert path in errors, errors
    assert errors[path].startswith(message), errors


def test_a_poll_without_interval_is_refused() -> None:
    errors = errors_of("{kind: poll, url: 'https://a.example', items_path: i}")
    assert errors == {"spec.triggers[1]": "a poll trigger needs 'interval_s'"}
