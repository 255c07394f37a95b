"""The embedded server restarted from a thread while other threads run (the fault run's bug).

The fault run restarts PostgreSQL from its schedule thread while the load's threads run. The
server was spawned as the service user by changing credentials between fork and exec of that
busy process (a `preexec_fn`, then Popen's `user=`); a restart's child died of SIGSEGV there,
so PostgreSQL never came back. It is now spawned (posix_spawn) through eventos.local.drop_exec, a
fresh single-threaded process that changes what it must and execs the server.
"""

from __future__ import annotations

import os
import pwd
import threading
from pathlib import Path

import psycopg

from eventos.local.embedded_pg import SERVICE_USER, EmbeddedPostgres

RESTARTS = 6
BUSY_THREADS = 4


def _churn(stop: threading.Event) -> None:
    """Allocate and free Python objects until told to stop (what a loaded parent does)."""
    while not stop.is_set():
        [{"k": str(i)} for i in range(2000)]


def _server_user(pg: EmbeddedPostgres) -> str:
    """The user the running server's process is, once it answers a query."""
    with psycopg.connect(pg.url(), connect_timeout=10) as conn:
        conn.execute("SELECT 1")
    assert pg.process is not None
    assert os.getsid(pg.process.pid) == pg.process.pid  # its own session: no Ctrl-C of ours
    return Path(f"/proc/{pg.process.pid}").owner()


def test_a_server_restarted_from_a_thread_among_busy_threads_comes_back(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg", durable=False)
    stop = threading.Event()
    busy = [threading.Thread(target=_churn, args=(stop,), daemon=True) for _ in range(BUSY_THREADS)]
    for t in busy:
        t.start()
    errors: list[BaseException] = []
    expected = SERVICE_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

    def restarts() -> None:
        try:
            for _ in range(RESTARTS):
                pg.start()
                assert _server_user(pg) == expected
                pg.stop()
        except BaseException as exc:  # reported on the test's thread
            errors.append(exc)

    runner = threading.Thread(target=restarts)
    try:
        runner.start()
        runner.join(timeout=300)
        assert not runner.is_alive(), "the restarts did not finish in 300 s"
        assert not errors, errors
    finally:
        stop.set()
        pg.stop()
