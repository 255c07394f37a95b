"""Which calls may run beside others (the flag `concurrent_read_only_tools`): the registry's
effect class for the call's arguments is `read_only`; anything unclear runs alone."""

from __future__ import annotations

import json

import pytest

from eventos.tools.registry import read_only


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("http_request", {"method": "GET", "url": "http://x/"}, True),
        ("http_request", {"method": "head", "url": "http://x/"}, True),
        ("http_request", {"method": "POST", "url": "http://x/"}, False),
        ("http_request", {"method": "PUT", "url": "http://x/", "headers": {"Idempotency-Key": "k"}},
         False),
        ("list_alarms", {}, True),
        ("data_get", {"store": "s", "key": "k"}, True),
        ("data_list", {"store": "s"}, True),
        ("data_put", {"store": "s", "key": "k", "value": 1}, False),
        ("set_alarm", {}, False),
        ("send_to_employee", {"to": "x", "text": "y"}, False),
        ("teleport", {}, False),
    ],
)  # fmt: skip
def test_a_call_is_read_only_by_its_tools_effect_class(
    name: str, args: dict[str, object], expected: bool
) -> None:
    assert read_only(name, json.dumps(args)) is expected


@pytest.mark.parametrize("arguments", ['{"method": ', "[1]", '"GET"', ""])
def test_arguments_that_are_not_a_json_object_run_alone(arguments: str) -> None:
    assert read_only("http_request", arguments) is False
