"""docs/operations.md's Metrics table against what each service serves on /metrics, both ways
(SPEC §12): every family a service serves is in the table under that service, and every family
the table gives a service is served by it.

The six services run as processes on the session's dev server, as `make run` starts them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import E2E_TIMEOUT_S
from metrics_table import documented
from stack import Stack, base_env

from eventos import names
from eventos.settings import DatabaseSettings, TemporalSettings

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

OURS = ("eventos_", "gen_ai_")  # Python's and the process's families are the library's own
TYPE_LINE = re.compile(r"^# TYPE (\S+) \S+$", re.MULTILINE)


def exported(text: str) -> set[str]:
    """Our families in a /metrics answer; prometheus_client's `<counter or histogram>_created`
    timestamps (typed as gauges of their own) go with their family."""
    found = {name for name in TYPE_LINE.findall(text) if name.startswith(OURS)}
    created = {
        n
        for n in found
        if n.endswith("_created")
        and ({n.removesuffix("_created"), n.removesuffix("_created") + "_total"} & found)
    }
    return found - created


@pytest.fixture
def stack(
    db_settings: DatabaseSettings, temporal_settings: TemporalSettings, tmp_path: Path
) -> Iterator[Stack]:
    env = base_env(db_settings.url, temporal_settings.address, temporal_settings.namespace,
                   tmp_path / "blobs")  # fmt: skip
    with Stack(env, tmp_path) as running:
        yield running


def test_the_table_is_what_each_service_serves(stack: Stack) -> None:
    table = documented()
    for service in names.SERVICES:
        answer = httpx.get(f"{stack[service].url}/metrics", timeout=10)
        assert answer.status_code == 200, (service, answer.text)
        served = exported(answer.text)
        undocumented = served - table[service]
        missing = table[service] - served
        assert not undocumented, (
            f"{service} serves families the table does not list: {undocumented}"
        )
        assert not missing, f"the table lists families {service} does not serve: {missing}"
        info = re.search(rf'^eventos_build_info{{[^}}]*service="{service}"[^}}]*}} 1\.0$',
                         answer.text, re.MULTILINE)  # fmt: skip
        assert info, f"{service}: no eventos_build_info naming it"


def test_the_table_parses() -> None:
    """The parser sees every row (a malformed row would silently drop families)."""
    table = documented()
    assert "eventos_dead_letters_total" in table["relay"]
    assert "eventos_build_info" in table["egress"]
    assert all(table[s] for s in names.SERVICES)
