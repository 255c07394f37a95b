"""The images `make images` built run as the charts run them: a read-only root filesystem, the
chart's non-root user, only /tmp (and the chart's volumes) writable, no capabilities.

Needs the images in the local container storage and podman (`make images && make test-images`).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from charts import INSTANCE_CHART, REQUIRED, TIER_FILES, named, of_kind, pod_spec, render

from eventos.local.ports import free_port
from eventos.testing import ConditionTimeout, wait_for_sync

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
IMAGES_JSON = ROOT / ".eventos" / "images" / "images.json"
SERVICES = ["ingress", "router", "relay", "workers-workflow", "workers-llm", "egress"]
# What the charts' containers get: securityContext readOnlyRootFilesystem, drop ALL, no
# privilege escalation, and an emptyDir on /tmp.
AS_THE_CHART = ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "--tmpfs", "/tmp:rw,size=64m"]  # fmt: skip
NPROC_CAP = 32768


def limits() -> list[str]:
    """Explicit rlimits: podman's defaults raise them past what runc may set here.

    The open files limit is the machine's own; processes are capped at 32768 (buildah's default),
    as runc's init was refused 65536 and the shell's 96368 ("error setting rlimit type 6").
    """
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], NPROC_CAP)
    return ["--ulimit", f"nofile={nofile[0]}:{nofile[1]}", "--ulimit", f"nproc={nproc}:{nproc}"]


def podman(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A podman command (runc: crun refuses this machine's hybrid cgroups)."""
    return subprocess.run(["podman", "--runtime", "runc", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip


def run(ref: str, *cmd: str, user: str = "10001:10001", options: tuple[str, ...] = (),
        timeout: float = 60) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run `cmd` in a fresh container of `ref` as the chart would, without a network."""
    return podman("run", "--rm", "--network", "none", "--user", user, *limits(), *AS_THE_CHART,
                  *options, ref, *cmd, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """`name` → `name:tag` of every image `make images` listed."""
    assert IMAGES_JSON.exists(), "run `make images` first"
    refs = json.loads(IMAGES_JSON.read_text())
    for ref, tar in refs.items():
        assert Path(tar).is_file(), f"{ref}: its archive {tar} is missing"
    # The previous Temporal minor's two images come first: the pinned ones are kept here.
    return {ref.split("/")[-1].split(":")[0]: ref for ref in refs}


def test_every_image_the_charts_reference_was_built(images: dict[str, str]) -> None:
    expected = {*SERVICES, "temporal", "temporal-server", "temporal-admin-tools", "collector",
                "postgres"}  # fmt: skip
    assert set(images) == expected


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_image_imports_its_code_on_a_read_only_root(
    images: dict[str, str], service: str
) -> None:
    module = "eventos_" + service.replace("-", "_")
    done = run(images[service], "python", "-c",
               f"import os, {module}.__main__; print(os.getuid(), os.getgid(), os.getcwd())")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == ["10001", "10001"]


# Every service waits for its database and Temporal instead of exiting (a pod keeps running and
# its readiness probe says why): these lines show it started and is waiting on them.
WAITING = ("Connection refused", "reconnection attempt", "connection failed", "127.0.0.1:1")


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_starts_and_waits_only_on_the_missing_database(
    images: dict[str, str], service: str, container_name: str
) -> None:
    env = {"EVENTOS_DATABASE_URL": "postgresql://eventos:x@127.0.0.1:1/eventos",
           "EVENTOS_ADMIN_TOKEN": "admin-0123456789abcdef",
           "EVENTOS_OUTBOX_KEYS": "k1:" + "A" * 43 + "=",
           "EVENTOS_INGRESS_GRPC_INSECURE": "true",
           "TEMPORAL_ADDRESS": "127.0.0.1:2"}  # fmt: skip
    options = ["-d", "--name", container_name]
    options += [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    started = run(images[service], options=tuple(options))
    assert started.returncode == 0, started.stderr

    def waiting_output() -> str:
        """The container's output once it says it waits on the database, else nothing."""
        logs = podman("logs", container_name)
        text = logs.stdout + logs.stderr
        return text if any(line in text for line in WAITING) else ""

    output = wait_for_sync(waiting_output, timeout=90, interval=1,
                           what=f"{service} waiting on the database")  # fmt: skip
    print("\n".join(output.splitlines()[:6]))
    assert "Read-only file system" not in output and "Permission denied" not in output
    assert "ModuleNotFoundError" not in output and "ImportError" not in output


def test_the_temporal_server_prints_its_version(images: dict[str, str]) -> None:
    ref = images["temporal-server"]
    done = run(ref, "--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"temporal version {ref.split(':')[1]}")
    # The chart's command: a shell that reads the password file, then execs the server.
    shell = run(ref, "-c", 'export P="$(cat /etc/hostname)" && exec temporal-server --version',
                options=("--entrypoint", "/bin/sh"))  # fmt: skip
    assert shell.returncode == 0, shell.stderr


def test_the_admin_tools_hold_the_sql_tool_the_cli_and_the_schemas(
    images: dict[str, str],
) -> None:
    script = ("set -eu; temporal-sql-tool --version; temporal --version; "
              "ls /etc/temporal/schema/postgresql/v12/temporal/versioned "
              "/etc/temporal/schema/postgresql/v12/visibility/versioned | grep -c '^v'; "
              "echo x | grep -qw x && sleep 0 && echo tools-ok")  # fmt: skip
    done = run(images["temporal-admin-tools"], "/bin/sh", "-c", script)
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    assert "temporal-sql-tool version 1.32.0" in done.stdout
    assert "temporal version 1.9.1" in done.stdout and "tools-ok" in done.stdout


def test_the_collector_prints_its_version(images: dict[str, str]) -> None:
    ref = images["collector"]
    done = run(ref, "--version")
    assert done.returncode == 0, done.stderr
    assert ref.split(":")[1] in done.stdout


def volume(path: Path, uid: int) -> str:
    """A host folder owned by `uid`, as the chart's volumes are for the pod's user (fsGroup)."""
    path.mkdir(mode=0o700, exist_ok=True)
    os.chown(path, uid, uid)
    return str(path)


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture
def container_name() -> Iterator[str]:
    """A name for a detached container, removed at the end."""
    name = f"eventos-test-{uuid.uuid4().hex[:8]}"
    yield name
    podman("rm", "--force", "--time", "2", name)


def test_the_dev_server_serves_as_the_chart_starts_it(
    images: dict[str, str], container_name: str, tmp_path: Path
) -> None:
    port = free_port()
    # The chart's volume for the SQLite file; the chart's args, on loopback only.
    args = ["server", "start-dev", "--db-filename", "/var/lib/temporal/temporal.db",
            "--ip", "127.0.0.1", "--port", str(port), "--http-port", str(free_port()),
            "--metrics-port", str(free_port()), "--headless", "--namespace", "default",
            "--log-level", "warn"]  # fmt: skip
    started = podman("run", "-d", "--name", container_name, "--network", "host",
                     "--user", "10001:10001", *limits(), *AS_THE_CHART,
                     "-v", f"{volume(tmp_path / 'data', 10001)}:/var/lib/temporal",
                     images["temporal"], *args)  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        wait_for_sync(lambda: port_open(port), timeout=60, interval=0.3, what=f"port {port} open")
    except ConditionTimeout:
        logs = podman("logs", container_name)
        raise AssertionError(logs.stdout + logs.stderr) from None


PASSWORD = "s3cret-for-the-test"


def psql(container: str, sql: str, password: str = PASSWORD, database: str = "eventos") -> (
    subprocess.CompletedProcess[str]
):  # fmt: skip
    """psql over TCP with a password, inside the PostgreSQL container."""
    return podman("exec", "-e", f"PGPASSWORD={password}", container, "psql", "-h", "127.0.0.1",
                  "-U", "postgres", "-d", database, "-Atc", sql)  # fmt: skip


def start_postgres(image: str, name: str, tmp_path: Path,
                   sockets: Path) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """A detached PostgreSQL container as the chart's StatefulSet runs it, its data in
    tmp_path/data (shared by every container of the test, as pods share the claim), the
    password file tmp_path/password."""
    return podman("run", "-d", "--name", name, "--network", "none",
                  "--user", "999:999", *limits(), *AS_THE_CHART,
                  "-v", f"{volume(tmp_path / 'data', 999)}:/var/lib/postgresql/data",
                  "-v", f"{volume(sockets, 999)}:/var/run/postgresql",
                  "-v", f"{tmp_path / 'password'}:/var/run/secrets/postgresql/password:ro",
                  "-e", "POSTGRES_PASSWORD_FILE=/var/run/secrets/postgresql/password",
                  "-e", "POSTGRES_DB=eventos",
                  "-e", "PGDATA=/var/lib/postgresql/data/pgdata",
                  image)  # fmt: skip


@pytest.fixture
def postgres(images: dict[str, str], container_name: str, tmp_path: Path) -> Iterator[str]:
    """The bundled PostgreSQL started as the chart's StatefulSet starts it; its container name."""
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o444)
    started = start_postgres(images["postgres"], container_name, tmp_path, tmp_path / "run")
    assert started.returncode == 0, started.stderr
    probe = ["exec", container_name, "pg_isready", "-U", "postgres", "-h", "127.0.0.1"]
    try:  # the chart's probe
        wait_for_sync(lambda: podman(*probe).returncode == 0, timeout=60, interval=0.5,
                      what="pg_isready")  # fmt: skip
    except ConditionTimeout:
        logs = podman("logs", container_name)
        raise AssertionError(logs.stdout + logs.stderr) from None
    yield container_name


def test_postgresql_initialises_starts_and_answers_as_its_user(postgres: str) -> None:
    # A password login over TCP, as the services and Temporal connect.
    query = psql(postgres, "SELECT 1, current_user, version()")
    print(query.stdout)
    assert query.returncode == 0, query.stderr
    assert query.stdout.startswith("1|postgres|PostgreSQL 16.")
    owner = podman("exec", postgres, "sh", "-c", "id -u; stat -c %u $PGDATA")
    assert owner.stdout.split() == ["999", "999"]
    wrong = psql(postgres, "SELECT 1", password="wrong")
    assert wrong.returncode != 0 and "password authentication failed" in wrong.stderr


def test_a_second_postgresql_on_the_same_data_waits_until_the_first_has_exited(
    images: dict[str, str], postgres: str, tmp_path: Path
) -> None:
    """A StatefulSet makes a force-deleted pod again at once, while the old pod's server may
    still run and commit: the new server must not start on the data directory before the old
    one has exited, or the commits only the old one's WAL holds are lost (what the cluster's
    fault run found, docs/faults.md). Here two containers share the data volume, as the two
    pods share the claim."""
    second = f"{postgres}-second"
    try:
        started = start_postgres(images["postgres"], second, tmp_path, tmp_path / "run2")
        assert started.returncode == 0, started.stderr

        def log(name: str) -> str:
            done = podman("logs", name)
            return done.stdout + done.stderr

        wait_for_sync(lambda: "another server holds" in log(second), timeout=30, interval=0.5,
                      what="the second server waiting for the first")  # fmt: skip
        assert psql(postgres, "CREATE TABLE last_words AS SELECT 1 AS n").returncode == 0
        ready = ["exec", second, "pg_isready", "-U", "postgres", "-h", "127.0.0.1"]
        assert podman(*ready).returncode != 0, log(second)  # not serving beside the first
        podman("kill", "--signal", "KILL", postgres)  # no shutdown checkpoint: crash recovery
        wait_for_sync(lambda: psql(second, "SELECT n FROM last_words").stdout.strip() == "1",
                      timeout=60, interval=0.5, what="the first server's last commit served")  # fmt: skip
        print(log(second))
    finally:
        podman("rm", "--force", "--time", "2", second)


# Tier L with the bundled PostgreSQL, but every address is the pod's loopback: here the Job and
# server containers join the PostgreSQL container's network namespace instead of a Service.
TIER_L_HERE = (*REQUIRED, "postgresql.bundled.enabled=true", "postgresql.existingSecret=acme-pg",
               "temporal.server.sql.host=127.0.0.1", "temporal.server.sql.user=postgres",
               "temporal.server.sql.existingSecret=acme-pg")  # fmt: skip


def chart_container(docs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    """The one container of the workload whose name ends with `suffix`."""
    (doc,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"].endswith(suffix)]
    (container,) = pod_spec(doc)["containers"]
    return dict(container)


def run_like_the_chart(image: str, container: dict[str, Any], network: str,
                       mounts: dict[str, Path], env: dict[str, str], detach: str = "",
                       timeout: float = 300) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """The chart's container (command, args, env, mounts) as uid 10001 in `network`."""
    values = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    values.update(env)
    options = ["--network", f"container:{network}", "--entrypoint", container["command"][0]]
    options += [arg for key, value in values.items() for arg in ("-e", f"{key}={value}")]
    options += [arg for dest, src in mounts.items() for arg in ("-v", f"{src}:{dest}:ro")]
    options += ["-d", "--name", detach] if detach else ["--rm"]
    return podman("run", "--user", "10001:10001", *limits(), *AS_THE_CHART, *options, image,
                  *container["command"][1:], *container.get("args", []), timeout=timeout)  # fmt: skip


def test_tier_l_schema_job_server_and_namespace_job_run_on_the_bundled_postgresql(
    images: dict[str, str], postgres: str, tmp_path: Path
) -> None:
    """The tier L pods' own commands (rendered by helm) in these images: the schema step creates
    both databases and brings both schemas to their newest version (visibility needs btree_gin),
    the server starts on them with the chart's config, and the namespace Job creates the
    namespace and search attributes through it with the `temporal` CLI."""
    docs = render(INSTANCE_CHART, (TIER_FILES["L"],), TIER_L_HERE)
    secrets = tmp_path / "temporal-secret"
    secrets.mkdir()
    (secrets / "password").write_text(PASSWORD)
    (secrets / "password").chmod(0o444)
    password = {"/var/run/secrets/temporal": secrets}

    # With the bundled PostgreSQL the schema step is the server Deployment's init container.
    server_doc = named(docs, "Deployment", "acme-eventos-temporal")
    (schema,) = pod_spec(server_doc)["initContainers"]
    done = run_like_the_chart(images["temporal-admin-tools"], schema, postgres, password, {})
    assert done.returncode == 0, done.stderr[-3000:]
    for database in ("temporal", "temporal_visibility"):
        version = psql(postgres, "SELECT curr_version FROM schema_version", database=database)
        assert version.returncode == 0 and version.stdout.strip(), version.stderr
        print(database, "schema", version.stdout.strip())
    extension = psql(postgres, "SELECT extname FROM pg_extension", database="temporal_visibility")
    assert "btree_gin" in extension.stdout

    (config_map,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("temporal-config")]  # fmt: skip
    config = tmp_path / "temporal-config"
    config.mkdir()
    for name, text in config_map["data"].items():
        (config / name).write_text(text)
        (config / name).chmod(0o444)
    server = chart_container(docs, "Deployment", "-temporal")
    config_dir = next(m["mountPath"] for m in server["volumeMounts"] if m["name"] == "config")
    name = f"{postgres}-temporal"
    try:
        started = run_like_the_chart(images["temporal-server"], server, postgres,
                                     {**password, config_dir: config}, {"POD_IP": "127.0.0.1"},
                                     detach=name)  # fmt: skip
        assert started.returncode == 0, started.stderr
        namespace = chart_container(docs, "Job", "temporal-namespace-1")  # of revision 1
        done = run_like_the_chart(images["temporal-admin-tools"], namespace, postgres, {},
                                  {"TEMPORAL_ADDRESS": "127.0.0.1:7233"}, timeout=240)  # fmt: skip
        logs = podman("logs", name)
        print(done.stdout[-1500:])
        assert done.returncode == 0, done.stderr[-2000:] + logs.stderr[-3000:]
        namespaces = psql(postgres, "SELECT name FROM namespaces", database="temporal")
        assert "default" in namespaces.stdout.split(), namespaces.stderr
    finally:
        podman("rm", "--force", "--time", "5", name)
