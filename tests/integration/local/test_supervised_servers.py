"""A server of the local instance under its supervision (eventos.local.servers), on a real
embedded PostgreSQL: its exit is said with the signal, it is started again on its data and port,
and a start that fails is said and tried again after a longer delay."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import psycopg

from eventos.local.embedded_pg import EmbeddedPostgres
from eventos.local.servers import SupervisedServer

LATER_S = 3600.0  # a `now` past any delay of the back-off (30 s at most)


def test_a_killed_server_is_said_and_comes_back_and_a_failed_start_backs_off(
    tmp_path: Path,
) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg", durable=False)
    pg.start()
    said: list[str] = []
    supervised = SupervisedServer("PostgreSQL", pg, said.append)
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (n int)")
        assert supervised.ports() == [pg.port]
        assert not supervised.check(time.monotonic())  # running: nothing to do
        assert said == []

        # Killed while another process holds its port: the first start fails.
        assert pg.process is not None
        killed = pg.process.pid
        pg.process.kill()
        pg.process.wait(30)
        with socket.socket() as holder:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.bind((pg.host, pg.port))
            holder.listen()
            now = time.monotonic()
            assert not supervised.check(now)
            assert said == [
                f"PostgreSQL (pid {killed}) was killed by SIGKILL; restart 1 in 1s on the same "
                f"state and ports (log: {pg.log_path})"
            ]
            assert not supervised.check(now + 0.5)  # not due yet
            assert not supervised.check(now + LATER_S)
        assert said[1].startswith("PostgreSQL restart 1 failed: PostgreSQL exited; see ")
        assert said[1].endswith("; restart 2 in 2s")
        assert supervised.restarts.due_at - time.monotonic() > 1.0

        # The port is free again: the next start, when due, brings it back on its data.
        assert supervised.check(time.monotonic() + LATER_S)
        assert said[2] == f"PostgreSQL restarted (pid {supervised.pid}, restart 2)"
        with psycopg.connect(pg.url(), connect_timeout=10) as conn:
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
        assert not supervised.check(time.monotonic() + LATER_S)  # running again
        assert len(said) == 3
    finally:
        pg.stop()
