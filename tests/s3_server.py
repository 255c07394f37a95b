"""A real S3-compatible server for the backup tests: SeaweedFS (`make seaweedfs` builds `weed`
into .tools/bin), as `weed server -filer -s3`, every port on loopback from eventos.local.ports,
telemetry off, one identity with the test's keys; its data in a temporary folder."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from minio import Minio

from eventos.local.ports import free_port
from eventos.settings import ServerTools
from eventos.testing import wait_for_sync

HOST = "127.0.0.1"
START_S = 120.0  # on a loaded 2-core machine the master, volume, filer and S3 take a while
STOP_S = 15.0


@dataclass
class S3Server:
    """A running SeaweedFS with an S3 gateway."""

    endpoint: str
    access_key: str
    secret_key: str
    process: subprocess.Popen[bytes]
    log: Path

    def client(self) -> Minio:
        return Minio(self.endpoint.removeprefix("http://"), access_key=self.access_key,
                     secret_key=self.secret_key, secure=False)  # fmt: skip

    def bucket(self) -> str:
        """A new empty bucket."""
        name = f"backups-{secrets.token_hex(4)}"
        self.client().make_bucket(name)
        return name


def _ready(endpoint: str, process: subprocess.Popen[bytes], log: Path) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"weed exited {process.returncode}:\n{log.read_text()[-3000:]}")
    try:
        # Unsigned: any HTTP answer of the S3 gateway (403 AccessDenied) says it serves.
        return httpx.get(endpoint + "/", timeout=2).status_code in (200, 403)
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="session")
def s3_server(request: pytest.FixtureRequest) -> Iterator[S3Server]:
    """The session's SeaweedFS S3 server."""
    weed = ServerTools.from_env(root=request.config.rootpath).binary("weed")
    folder = Path(tempfile.mkdtemp(prefix="eventos-s3-"))
    access, secret = "eventos-test", secrets.token_hex(16)
    config = folder / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "eventos", "credentials": [{"accessKey": access, "secretKey": secret}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }]}))  # fmt: skip
    taken: list[int] = []

    def port() -> int:
        taken.append(free_port(HOST, taken))
        return taken[-1]

    s3_port = port()
    args = [
        str(weed), "server", f"-dir={folder / 'data'}", f"-ip={HOST}", f"-ip.bind={HOST}",
        f"-master.port={port()}", f"-master.port.grpc={port()}", "-master.telemetry=false",
        "-master.volumeSizeLimitMB=64", f"-volume.port={port()}", f"-volume.port.grpc={port()}",
        "-volume.max=4", "-filer", f"-filer.port={port()}", f"-filer.port.grpc={port()}",
        f"-filer.localSocket={folder / 'filer.sock'}", "-s3", f"-s3.port={s3_port}",
        f"-s3.port.grpc={port()}", "-s3.port.iceberg=0", "-s3.port.lance=0",
        f"-s3.config={config}", f"-s3.localSocket={folder / 's3.sock'}",
    ]  # fmt: skip
    (folder / "data").mkdir()
    log = folder / "weed.log"
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    endpoint = f"http://{HOST}:{s3_port}"
    try:
        wait_for_sync(lambda: _ready(endpoint, process, log), timeout=START_S, interval=0.2,
                      what="the SeaweedFS S3 gateway answering")  # fmt: skip
        yield S3Server(endpoint, access, secret, process, log)
    finally:
        process.terminate()
        try:
            process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)
