"""Images for the cluster: one-binary `scratch` images written as docker archives, and their import.

An image of one static binary needs no builder: a docker archive is a tar of a manifest, a config
and one layer tar, which `ctr images import` reads as `docker save` would have written it.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from layout import COREDNS_IMAGE, METRICS_SERVER_IMAGE, PAUSE_IMAGE, REPO, Layout, read_json

IMAGES_JSON = REPO / ".eventos" / "images" / "images.json"


def layer_tar(binary: Path, target: str) -> bytes:
    """A layer holding the binary at /<target> (mode 755) and the usual empty folders."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("etc", "tmp", "dev", "proc", "sys"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        info = tarfile.TarInfo(target)
        info.size, info.mode = binary.stat().st_size, 0o755
        with binary.open("rb") as source:
            tar.addfile(info, source)
    return buffer.getvalue()


def write_scratch_image(binary: Path, name: str, entrypoint: list[str], out: Path) -> None:
    """A docker archive of image `name` (repo:tag) holding only `binary` as /<binary name>."""
    layer = layer_tar(binary, binary.name)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": f"eventos deploy/cluster/images.py: {binary.name}"}],
    }).encode()  # fmt: skip
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name], "Layers": [layer_name]}])
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out.with_suffix(".tmp"), mode="w") as tar:
        for member, data in ((config_name, config), (layer_name, layer),
                             ("manifest.json", manifest.encode())):  # fmt: skip
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out.with_suffix(".tmp").rename(out)


def full_name(name: str) -> str:
    """The name containerd stores for a docker reference (docker.io/library/ when no registry)."""
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return "docker.io/" + (name if "/" in name else "library/" + name)


def import_archive(layout: Layout, archive: Path, *names: str) -> None:
    """`ctr images import` an archive and check its images are there under their names
    afterwards. A full disk is said as such, with the space left and what takes it."""
    result = subprocess.run([*layout.ctr(), "images", "import", str(archive)],
                            capture_output=True, text=True)  # fmt: skip
    if result.returncode != 0:
        error = result.stderr.strip()
        if "no space left on device" in error:
            free = shutil.disk_usage(layout.state).free / 1e9
            raise RuntimeError(
                f"ctr images import {archive}: the disk holding {layout.state} is full ({free:.1f}"
                " GB free; an image takes about twice its archive's size there, stored and"
                " unpacked): free space and run again (`df -h`; earlier clones' .eventos/k8s,"
                f" /var/lib/containers). {error[-600:]}"
            )
        raise RuntimeError(f"ctr images import {archive} failed: {error}")
    listed = loaded(layout)
    for name in names:
        if full_name(name) not in listed:
            raise RuntimeError(f"{archive} imported, but holds no image named {name}: {listed}")


def loaded(layout: Layout) -> list[str]:
    """The names of the images in the cluster's runtime."""
    return subprocess.run([*layout.ctr(), "images", "ls", "-q"], capture_output=True, text=True,
                          check=True).stdout.split()  # fmt: skip


def remove_stale(layout: Layout, listed: list[str]) -> list[str]:
    """Remove the runtime's images of the listed images' names under other tags (loaded from
    earlier `make images`), so their layers go; the names removed."""
    current = {full_name(name) for name in listed}
    repositories = {name.rpartition(":")[0] for name in current}
    stale = [name for name in loaded(layout)
             if name not in current and name.rpartition(":")[0] in repositories]  # fmt: skip
    if stale:
        subprocess.run([*layout.ctr(), "images", "rm", "--sync", *stale], capture_output=True,
                       text=True, check=True)  # fmt: skip
    return stale


def tag(layout: Layout, source: str, name: str) -> None:
    """The loaded image `source` under the name `name` too (ctr images tag; replaced if there)."""
    result = subprocess.run([*layout.ctr(), "images", "tag", "--force", full_name(source),
                             full_name(name)], capture_output=True, text=True)  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"ctr images tag {source} {name} failed: {result.stderr.strip()}")


def cluster_images(layout: Layout) -> dict[str, Path]:
    """The cluster's own images (pause, CoreDNS, metrics-server) built by `make cluster-tools`."""
    return {
        PAUSE_IMAGE: layout.images / "pause.tar",
        COREDNS_IMAGE: layout.images / "coredns.tar",
        METRICS_SERVER_IMAGE: layout.images / "metrics-server.tar",
    }


def project_images() -> dict[str, Path]:
    """The images engineer's archives listed in .eventos/images/images.json (name:tag -> tar)."""
    listed = read_json(IMAGES_JSON)
    return {name: _resolve(str(path)) for name, path in listed.items()}


def _resolve(path: str) -> Path:
    candidate = Path(path)
    return candidate if candidate.is_absolute() else REPO / candidate


def main() -> None:
    """`images.py BINARY NAME OUT`: write a one-binary scratch image archive."""
    binary, name, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    write_scratch_image(binary, name, ["/" + binary.name, *sys.argv[4:]], out)


if __name__ == "__main__":
    main()
