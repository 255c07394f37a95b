"""The embedded server started again: from a thread while other threads run (the fault run's
bug), and after a SIGKILL (what `make run`'s supervision does, on its data and port).

The fault run restarts PostgreSQL from its schedule thread while the load's threads run. The
server was spawned as the service user by changing credentials between fork and exec of that
busy process (a `preexec_fn`, then Popen's `user=`); a restart's child died of SIGSEGV there,
so PostgreSQL never came back. It is now spawned (posix_spawn) through eventos.local.drop_exec, a
fresh single-threaded process that changes what it must and execs the server.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
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


def test_a_killed_server_starts_again_on_its_data_and_port(tmp_path: Path) -> None:
    """A SIGKILL leaves postmaster.pid behind and a connected backend orphaned. Here the dead
    server's pid has since been taken by another process (a live stranger named in the lock
    file): that process is left alone, and the server starts on its data and port again."""
    pg = EmbeddedPostgres(tmp_path / "pg", durable=True)
    pg.start()
    stranger = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                stdin=subprocess.PIPE)  # fmt: skip
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (n int)")
            conn.execute("INSERT INTO kept VALUES (7)")
        orphan = psycopg.connect(pg.url(), autocommit=True)  # its backend outlives the kill
        assert pg.process is not None
        port, killed = pg.port, pg.process.pid
        pg.process.kill()
        pg.process.wait(30)
        lock = pg.pgdata / "postmaster.pid"
        lines = lock.read_text().splitlines()
        assert lines[0] == str(killed)
        lock.write_text("\n".join([str(stranger.pid), *lines[1:]]) + "\n")

        pg.start()
        assert pg.port == port and pg.process.pid != killed
        assert stranger.poll() is None, "a process that is no server of ours was signalled"
        with psycopg.connect(pg.url(), connect_timeout=10) as conn:
            assert conn.execute("SELECT n FROM kept").fetchall() == [(7,)]
        orphan.close()
    finally:
        pg.stop()
        stranger.kill()
        stranger.wait()


def test_an_initdb_that_fails_says_why(tmp_path: Path) -> None:
    """A refused initdb raises with its own words (it was a bare CalledProcessError, whose
    output nobody saw)."""
    pg = EmbeddedPostgres(tmp_path / "pg", durable=False)
    pg.pgdata.mkdir(parents=True)
    (pg.pgdata / "left-behind").write_text("not a cluster")
    try:
        pg.init()
    except RuntimeError as exc:
        said = str(exc)
    else:
        raise AssertionError("initdb into a non-empty folder succeeded")
    assert said.startswith(f"initdb of {pg.pgdata} failed (exit 1):"), said
    assert "exists but is not empty" in said, said
