"""`eventosctl apply -f FILE` against a real ingress: a YAML error or a duplicate key names the
file, its line and column, and nothing is stored; a cron expression that cannot run is refused
by its field path (issue 26 point 2)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import ADMIN_TOKEN
from psycopg_pool import AsyncConnectionPool
from test_owner_api_refusals import SPEC, count

from eventos.cli import main
from eventos.db import Conn


@pytest.fixture(autouse=True)
def no_ambient_instance(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("EVENTOS_URL", "EVENTOS_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


async def ctl(url: str, *argv: str) -> int:
    """main() in a thread: the ingress under test serves on this test's event loop."""
    return await asyncio.to_thread(main, [*argv, "--url", url, "--token", ADMIN_TOKEN])


async def test_a_duplicate_key_names_the_file_and_line_and_stores_nothing(
    ingress_url: str, pool: AsyncConnectionPool[Conn], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    team = tmp_path / "team"
    team.mkdir()
    twice = SPEC.replace("  timezone: Europe/Paris\n",
                         "  budget: {daily_usd: 20}\n  timezone: Europe/Paris\n"
                         "  budget: {daily_usd: 2000}\n")  # fmt: skip
    (team / "nightly.yaml").write_text(twice)
    assert await ctl(ingress_url, "apply", "-f", "team/nightly.yaml") == 1
    err = capsys.readouterr().err
    assert "error: team/nightly.yaml: " in err
    assert ("  (yaml): team/nightly.yaml:7:3: duplicate key 'budget' (first at line 5)") in err  # fmt: skip
    assert "<unicode string>" not in err
    (team / "broken.yaml").write_text(SPEC.replace("{kind: chat}", "{kind: chat"))
    assert await ctl(ingress_url, "apply", "-f", "team/broken.yaml") == 1
    assert ("  (yaml): team/broken.yaml:9:7: while parsing a flow mapping (from line 8, column "
            "7); expected ',' or '}', but got '{'") in capsys.readouterr().err  # fmt: skip
    assert await count(pool, "SELECT count(*) AS n FROM employees") == 0


async def test_a_cron_that_cannot_run_is_refused_by_field_path(
    ingress_url: str, pool: AsyncConnectionPool[Conn], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    (tmp_path / "nightly.yaml").write_text(SPEC.replace('"0 3 * * *"', '"61 * * * *"'))
    assert await ctl(ingress_url, "apply", "-f", "nightly.yaml") == 1
    err = capsys.readouterr().err
    assert "  spec.triggers[1].schedule: '61 * * * *' is invalid: Bad minute" in err
    assert await count(pool, "SELECT count(*) AS n FROM employees") == 0
    (tmp_path / "nightly.yaml").write_text(SPEC)
    assert await ctl(ingress_url, "apply", "-f", "nightly.yaml") == 0
    assert "employee/nightly created" in capsys.readouterr().out
