"""The tier L server's small parts: the PostgreSQL login it is given, its ports, its tools."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventos.errors import ConfigError
from eventos.fleet.temporal_sql import SqlLogin, SqlToolError
from eventos.local.ports import LISTEN_FLOOR, ephemeral_range, free_port
from eventos.settings import ServerTools


def test_the_login_comes_from_the_instance_url_and_hides_its_password() -> None:
    login = SqlLogin.of_url("postgresql://tem:p%40ss@db.internal:6543/eventos")
    assert (login.host, login.port, login.user, login.password) == (
        "db.internal", 6543, "tem", "p@ss")  # fmt: skip
    assert "p@ss" not in repr(login)
    assert SqlLogin.of_url("postgresql://127.0.0.1/x").port == 5432


def test_a_socket_path_is_refused() -> None:
    with pytest.raises(SqlToolError, match="over TCP"):
        SqlLogin.of_url("postgresql:///eventos?host=/run/postgresql")


def test_ports_fit_the_servers_smallint_column_stay_below_the_ephemeral_range_and_avoid_those_taken() -> (
    None
):
    taken: set[int] = set()
    for _ in range(20):
        port = free_port("127.0.0.1", taken)
        assert LISTEN_FLOOR <= port < min(ephemeral_range()[0], 32768)
        assert port not in taken
        taken.add(port)


def test_tools_come_from_the_variables_else_the_checkout(tmp_path: Path) -> None:
    mine = ServerTools.from_env({"EVENTOS_TOOLS_BIN": "/opt/t", "EVENTOS_CHART": "/c"}, tmp_path)
    assert (mine.bin_dir, mine.chart) == (Path("/opt/t"), Path("/c"))
    checkout = ServerTools.from_env({}, tmp_path)
    assert checkout.bin_dir == tmp_path / ".tools" / "bin"
    assert checkout.chart == tmp_path / "deploy" / "helm" / "eventos"
    with pytest.raises(ConfigError, match="run `make tools`"):
        checkout.binary("temporal-server")
