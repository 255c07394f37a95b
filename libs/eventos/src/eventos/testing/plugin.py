"""pytest plugin: real PostgreSQL and a real Temporal dev server for the whole session.

PostgreSQL: EVENTOS_DATABASE_URL if set, else testcontainers where a Docker engine answers,
else the embedded server. Each test gets a fresh database cloned from a migrated template.
Temporal: TEMPORAL_ADDRESS if set, else the pinned dev server binary (started on first use).
Tier L tests (marker `tier_l`) ask for `tier_l_server` instead: the open-source server `make
tools` built, on the session's PostgreSQL with the chart's configuration, started once.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from eventos.db import Conn, connect, open_pool
from eventos.db.migrate import migrate
from eventos.local.temporal_server import TemporalServer
from eventos.outbox.keys import OutboxKeys, new_key_entry
from eventos.settings import DatabaseSettings, ServerTools, TemporalSettings

TEMPLATE = "eventos_template"
# The embedded server's files go to this tmpfs when it has room. Each test clones the
# template (about 1,300 files) and drops its clone; on ext4 (the CI machine's disk has no
# journal) every file created walks past the inodes deleted in the last half minute, so a
# clone cost ~0.5 s of kernel time, growing as tests went by; in memory it costs ~0.03 s.
MEMORY_FS = Path("/dev/shm")
MEMORY_FS_MIN_FREE = 2 * 1024**3  # the template, one clone at a time, and the bounded WAL
_counter = itertools.count(1)
# A test instance of tier L: fewer history shards than the chart's 64 (they start faster and
# carry a test's load), and fewer connections per store than the chart's 40 (one PostgreSQL
# serves the whole session).
TIER_L_SHARDS = 4
TIER_L_MAX_CONNS = 10
TIER_L_START_S = 120.0
TIER_L_GROUP = "tier-l"
# A test still running after this long prints its pending asyncio tasks' stacks, shortly
# before pytest-timeout (pyproject: timeout) fails it with the threads' stacks.
HANG_DUMP_S = float(os.environ.get("EVENTOS_TEST_HANG_DUMP_S", "240"))


def _dump_tasks(name: str) -> None:
    """Every pending asyncio task's stack (read-only, from a timer thread: diagnostics only),
    on the real stderr (pytest captures sys.stderr during a test)."""
    err = sys.__stderr__ or sys.stderr
    # The registry behind asyncio.all_tasks(), read from this thread (the loop is elsewhere).
    registry: set[asyncio.Task[object]] = getattr(asyncio.tasks, "_all_tasks", set())
    tasks = [t for t in list(registry) if not t.done()]
    err.write(f"\n=== {name} still running: {len(tasks)} tasks\n")
    for task in tasks:
        try:
            task.print_stack(file=err)
        except Exception as exc:  # the task moved on while this thread read its frames
            err.write(f"--- {task!r}: stack not readable ({type(exc).__name__})\n")
    err.flush()


# Each session's temporary folders live under this folder of the system's temp dir, one
# folder a session, not in /tmp/pytest-of-<user>: pytest takes that folder back to mode 0700 at
# every session's start, which locked the embedded PostgreSQL's unprivileged user out of the
# folders of every session already running (its initdb or start then failed).
SESSIONS_DIR = "eventos-tests"
SESSIONS_KEPT = 3  # ended sessions' folders kept (they hold only failed tests' folders)


def _ended_sessions(root: Path) -> list[Path]:
    """Folders of sessions whose process is gone, newest first."""
    ended = []
    for folder in root.glob("s*-*"):
        pid = folder.name[1:].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            ended.append(folder)
    return sorted(ended, key=lambda f: f.stat().st_mtime, reverse=True)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests() -> None:
    """The tests' bytecode is cached even where PYTHONDONTWRITEBYTECODE is set (as on the
    project's machines): without it every pytest process (each xdist worker) parsed and
    assertion-rewrote every test module again, 8 s of CPU a process (`make install` compiles
    the code under test itself). Set before the first conftest or test module is imported;
    the services the tests start as processes keep the environment as it is."""
    sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    """A session folder of its own for the run (its xdist workers take theirs inside it),
    unless --basetemp names one; ended sessions' folders past the newest few are removed."""
    if config.option.basetemp or hasattr(config, "workerinput"):
        return
    root = Path(tempfile.gettempdir()) / SESSIONS_DIR
    root.mkdir(exist_ok=True)
    root.chmod(0o755)
    for folder in _ended_sessions(root)[SESSIONS_KEPT:]:
        shutil.rmtree(folder, ignore_errors=True)
    config.option.basetemp = tempfile.mkdtemp(prefix=f"s{os.getpid()}-", dir=root)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs the suite on several pytest-xdist workers (`--dist loadgroup`), each
    with its own PostgreSQL and dev server: the tier L tests go to one worker, so one tier L
    server starts for the run, not one per worker; so do the tests of each `xdist_group`."""
    for item in items:
        if item.get_closest_marker("tier_l") is not None:
            item.add_marker(pytest.mark.xdist_group(TIER_L_GROUP))
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        for item in items:
            _name_group(item)


def _name_group(item: pytest.Item) -> None:
    """The item's id ends with `@<its xdist_group>`, by which the scheduler sends a group's
    tests to one worker. pytest-xdist 3.8 writes that suffix to `item._nodeid`, which pytest 9
    no longer reads (an item's id is its `_id`): every group was spread over the workers (each
    started its own tier L server, its own upgrade instance). Run last: the markers are all
    there, and a suffix xdist may have set already is not added twice."""
    groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                     for m in item.iter_markers("xdist_group")})  # fmt: skip
    suffix = "@" + "_".join(groups)
    if not groups or item.nodeid.endswith(suffix):
        return
    node_id = getattr(item, "_id", None)
    if node_id is None:  # pytest before 9: the string is the id
        item._nodeid = item.nodeid + suffix  # type: ignore[attr-defined]
    else:
        item._id = type(node_id).parse(item.nodeid + suffix)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    # A test with a longer hang limit of its own (whole stacks) dumps a minute before it.
    marker = item.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker is not None and marker.args else 0.0
    timer = threading.Timer(max(HANG_DUMP_S, limit - 60.0), _dump_tasks, args=(item.nodeid,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@dataclass
class PostgresForTests:
    """A server the tests may create databases on."""

    admin_url: str

    def url(self, database: str) -> str:
        info = psycopg.conninfo.conninfo_to_dict(self.admin_url)
        info["dbname"] = database
        return psycopg.conninfo.make_conninfo(
            **{k: str(v) for k, v in info.items() if v is not None}
        )

    def execute(self, stmt: sql.Composed) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(stmt)

    @contextmanager
    def unavailable(self, database: str) -> Iterator[None]:
        """The database refuses connections and loses its sessions, until the block ends."""
        ident = sql.Identifier(database)
        self.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(ident))
        self.execute(
            sql.SQL(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = {}"
            ).format(sql.Literal(database))
        )
        try:
            yield
        finally:
            self.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(ident))


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
    except Exception:
        return False
    return True


def _memory_fs() -> Path | None:
    """MEMORY_FS when it is a writable directory with room, else None (the system's temp)."""
    try:
        roomy = shutil.disk_usage(MEMORY_FS).free >= MEMORY_FS_MIN_FREE
    except OSError:
        return None
    return MEMORY_FS if roomy and os.access(MEMORY_FS, os.W_OK | os.X_OK) else None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresForTests]:
    """The session's PostgreSQL server.

    The embedded server's data lives outside pytest's /tmp/pytest-of-<user>: every pytest
    session that starts resets that folder to mode 0700, which locks the server user (when
    run as root) out of its own data directory and crashes the server of any session
    already running there."""
    url = os.environ.get("EVENTOS_DATABASE_URL")
    if url:
        yield PostgresForTests(url)
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16", driver=None) as pg:
            yield PostgresForTests(pg.get_connection_url())
        return
    from eventos.local.embedded_pg import EmbeddedPostgres

    data_dir = Path(tempfile.mkdtemp(prefix="eventos-test-pg-", dir=_memory_fs()))
    server = EmbeddedPostgres(data_dir, durable=False)
    server.start()
    try:
        yield PostgresForTests(server.url())
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def template_database(postgres_server: PostgresForTests) -> str:
    """A migrated database every test database is cloned from."""
    name = f"{TEMPLATE}_{os.getpid()}"
    postgres_server.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
    postgres_server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    async def _migrate() -> None:
        conn = await connect(DatabaseSettings(url=postgres_server.url(name)))
        async with conn:
            await migrate(conn)

    asyncio.run(_migrate())
    return name


@pytest.fixture
def db_name(postgres_server: PostgresForTests, template_database: str) -> Iterator[str]:
    """A fresh database cloned from the migrated template; dropped after the test."""
    name = f"t_{os.getpid()}_{next(_counter)}"
    ident = sql.Identifier(name)
    template = sql.Identifier(template_database)
    postgres_server.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(ident, template))
    yield name
    postgres_server.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


@pytest.fixture
def db_settings(postgres_server: PostgresForTests, db_name: str) -> DatabaseSettings:
    """Settings for the test's fresh database."""
    return DatabaseSettings(url=postgres_server.url(db_name), pool_max=20)


@pytest.fixture
async def pool(db_settings: DatabaseSettings) -> AsyncIterator[AsyncConnectionPool[Conn]]:
    """An open pool on the test's database."""
    p = await open_pool(db_settings)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def conn(db_settings: DatabaseSettings) -> AsyncIterator[Conn]:
    """One connection on the test's database."""
    c = await connect(db_settings)
    async with c:
        yield c


@pytest.fixture(scope="session")
def outbox_keys() -> OutboxKeys:
    """Keys sealing outbox recipients, fresh for the session (what EVENTOS_OUTBOX_KEYS gives
    a service)."""
    return OutboxKeys.parse(new_key_entry("test-1"))


@pytest.fixture(scope="session")
def temporal_settings() -> Iterator[TemporalSettings]:
    """A real Temporal frontend: TEMPORAL_ADDRESS, else the pinned dev server."""
    if os.environ.get("TEMPORAL_ADDRESS"):
        yield TemporalSettings.from_env()
        return
    from eventos.local.temporal_dev import TemporalDevServer

    server = TemporalDevServer(Path(tempfile.mkdtemp(prefix="eventos-temporal-")))
    server.start()
    try:
        yield TemporalSettings(address=server.address, namespace=server.namespace)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tier_l_server(
    postgres_server: PostgresForTests,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[TemporalServer]:
    """Tier L: the open-source Temporal server from this checkout's `.tools/bin` (`make tools`),
    its databases on the session's PostgreSQL, its config the chart's; dropped at the end."""
    suffix = os.getpid()
    server = TemporalServer(
        tmp_path_factory.mktemp("temporal-server"),
        ServerTools.from_env(root=request.config.rootpath),
        database_url=postgres_server.admin_url,
        shards=TIER_L_SHARDS,
        max_conns=TIER_L_MAX_CONNS,
        database=f"temporal_{suffix}",
        visibility_database=f"temporal_visibility_{suffix}",
    )
    server.start(timeout=TIER_L_START_S)
    try:
        yield server
    finally:
        server.stop()
        server.drop_databases()


@pytest.fixture
def tier_l_temporal(tier_l_server: TemporalServer) -> TemporalSettings:
    """A namespace of this test's own on the tier L server (7-day retention): workflow ids
    never meet another test's."""
    namespace = f"t-{os.getpid()}-{next(_counter)}"
    tier_l_server.ensure_namespace(namespace)
    return TemporalSettings(address=tier_l_server.address, namespace=namespace)
