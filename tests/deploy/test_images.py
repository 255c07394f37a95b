"""The images: a Dockerfile per service, built from the lock file, multi-stage, non-root, on the
public Python image or one made from Debian's packages; a Containerfile per other image the charts
reference; `make images` refuses clearly where buildah does not run. (Running the built images:
tests/k8s/test_images_run.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from charts import ROOT

from eventos.settings import TEMPORAL_PIN_VAR

sys.path.insert(0, str(ROOT / "scripts"))
import images as images_script  # scripts/images.py, put on the path above

SERVICES = ["ingress", "router", "relay", "workers-workflow", "workers-llm", "egress"]


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_has_a_locked_multi_stage_non_root_dockerfile(service: str) -> None:
    text = (ROOT / "services" / service / "Dockerfile").read_text()
    package = f"eventos-{service}"
    module = "eventos_" + service.replace("-", "_")
    assert len(re.findall(r"^FROM ", text, re.M)) == 3, "uv, a build stage and a runtime stage"
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in text
    # The interpreter path differs between the public image and Debian's python3.11.
    assert "ARG PYTHON=/usr/local/bin/python3.11" in text and "UV_PYTHON=${PYTHON}" in text
    assert "ARG UV_IMAGE=ghcr.io/astral-sh/uv:" in text and "COPY --from=uv /uv " in text
    syncs = re.findall(r"^RUN uv sync (.*)$", text, re.M)
    assert syncs and all("--frozen" in s and "--all-packages" in s for s in syncs)
    assert all("--no-dev" in s for s in syncs)
    assert (
        f"COPY services/{service}/src " in text
        and package in (ROOT / "services" / service / "pyproject.toml").read_text()
    )
    (user,) = re.findall(r"^USER (\S+)", text, re.M)
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root user (runAsNonRoot can check it)"
    assert f'CMD ["python", "-m", "{module}"]' in text
    assert 'ENTRYPOINT ["/app/entrypoint.sh"]' in text
    assert (ROOT / "services" / service / "src" / module / "__main__.py").is_file()
    # The Temporal version the release pins, which the Kubernetes upgrader reads (TEMPORAL_PIN_VAR).
    runtime = text.rsplit("\nFROM ", 1)[1]
    assert f"ENV {TEMPORAL_PIN_VAR}=${{TEMPORAL_SERVER_VERSION}}" in runtime


def shared_part(service: str) -> str:
    """A service Dockerfile from its first instruction up to where its own settings begin."""
    text = (ROOT / "services" / service / "Dockerfile").read_text()
    start = text.index("\nARG PYTHON_IMAGE=")
    return text[start : text.index("\nENV PATH=", start)]


def test_the_six_dockerfiles_share_every_step_before_their_own_settings() -> None:
    # What lets buildah build the environment once and the six images share their layers.
    first = shared_part(SERVICES[0])
    assert "COPY --from=build /app/.venv /app/.venv" in first
    for service in SERVICES[1:]:
        assert shared_part(service) == first, f"services/{service}/Dockerfile differs"


def test_the_build_steps_images_are_read_from_buildahs_output() -> None:
    # buildah 1.28's lines for a cached step and a new one (ids shortened to 11 characters).
    out = (
        "[2/3] STEP 24/24: RUN find /app/.venv -type f -name '*.so*'\n"
        "--> Using cache 1ef17ab1906a723dbd6dfe544ec6d8861a38b4266db269c6080def089a72bf9a\n"
        "--> 1ef17ab1906\n"
        "[3/3] STEP 2/12: RUN groupadd --system --gid 10001 eventos\n"
        "--> dfb21cf36e5\n"
        "[3/3] COMMIT eventos/ingress:probe\n"
        "--> Pulling image eventos/python:3.11-bookworm\n"
    )
    assert images_script.STEP_IMAGE.findall(out) == [
        "1ef17ab1906a723dbd6dfe544ec6d8861a38b4266db269c6080def089a72bf9a",
        "1ef17ab1906",
        "dfb21cf36e5",
    ]


def test_archives_name_images_as_the_kubelet_resolves_them() -> None:
    assert images_script.qualified("eventos/relay:abc") == "docker.io/eventos/relay:abc"
    assert images_script.qualified("postgres:16") == "docker.io/library/postgres:16"
    assert (
        images_script.qualified("registry.example.com/eventos/relay:1")
        == "registry.example.com/eventos/relay:1"
    )
    assert (
        images_script.qualified("localhost:5000/eventos/relay:1")
        == "localhost:5000/eventos/relay:1"
    )


def test_the_build_context_leaves_out_local_state() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for path in [".venv", ".tools", ".eventos", ".git", "tests"]:
        assert path in ignored


def test_the_entrypoint_reads_secrets_from_files(tmp_path: os.PathLike[str]) -> None:
    url = os.path.join(tmp_path, "url")
    with open(url, "w") as f:
        f.write("postgresql://u:p@db:5432/eventos\n")
    done = subprocess.run(
        ["sh", str(ROOT / "deploy/docker/entrypoint.sh"), "sh", "-c",
         'printf "%s|%s" "$EVENTOS_DATABASE_URL" "${EVENTOS_DATABASE_URL_FILE:-gone}"'],
        env={"PATH": os.environ["PATH"], "EVENTOS_DATABASE_URL_FILE": url},
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "postgresql://u:p@db:5432/eventos|gone")
    missing = subprocess.run(
        ["sh", str(ROOT / "deploy/docker/entrypoint.sh"), "true"],
        env={"PATH": os.environ["PATH"], "EVENTOS_ADMIN_TOKEN_FILE": "/nonexistent"},
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    assert missing.returncode == 1 and "EVENTOS_ADMIN_TOKEN_FILE" in missing.stderr


def test_the_entrypoint_reads_the_internal_token_and_the_outbox_keys(
    tmp_path: os.PathLike[str],
) -> None:
    files = {
        "EVENTOS_INTERNAL_TOKEN": "internal-0123456789",
        "EVENTOS_OUTBOX_KEYS": "k1:AAAA,k0:BBBB",
    }
    env = {"PATH": os.environ["PATH"]}
    for var, value in files.items():
        path = os.path.join(tmp_path, var)
        with open(path, "w") as f:
            f.write(value + "\n")
        env[f"{var}_FILE"] = path
    env["EVENTOS_DRIVER_TOKEN_FILE"] = os.path.join(tmp_path, "EVENTOS_INTERNAL_TOKEN")
    done = subprocess.run(
        ["sh", str(ROOT / "deploy/docker/entrypoint.sh"), "sh", "-c",
         'printf "%s|%s|%s" "$EVENTOS_INTERNAL_TOKEN" "$EVENTOS_OUTBOX_KEYS" "${EVENTOS_DRIVER_TOKEN:-none}"'],
        env=env, capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    # Driver tokens are the employees' secret references now: the entrypoint no longer reads one.
    assert (done.returncode, done.stdout) == (0, "internal-0123456789|k1:AAAA,k0:BBBB|none")


def test_make_images_fails_clearly_without_buildah() -> None:
    env = {**os.environ, "BUILDAH": "/nonexistent/buildah"}
    done = subprocess.run(
        [str(ROOT / ".venv/bin/python"), str(ROOT / "scripts/images.py"), "--tag", "t",
         "--uv-version", "0"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "buildah does not run" in done.stderr


CHART_IMAGES = ["temporal-server", "temporal-admin-tools", "temporal", "collector", "postgres"]


@pytest.mark.parametrize("name", CHART_IMAGES)
def test_each_other_chart_image_has_a_containerfile_with_a_non_root_user(name: str) -> None:
    text = (ROOT / "deploy/images" / name / "Containerfile").read_text()
    (user,) = re.findall(r"^USER (\S+)", text, re.M)
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert re.search(r"^(ENTRYPOINT|CMD) ", text, re.M)
