"""The console's static files, read once at boot: each with its gzip form, all under one
version (a digest of every file), so their URLs can be cached for a year and a new release is a
new URL. `index.html` names the version through its `{{version}}` placeholders, and its
`{{modulepreload}}` becomes a preload link per module (the browser fetches them all at once,
not import by import)."""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable

INDEX = "index.html"
VERSION = b"{{version}}"
PRELOAD = b"{{modulepreload}}"
TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
}


@dataclass(frozen=True)
class Asset:
    """One file as served: its bytes, their gzip form and its media type."""

    body: bytes
    gzipped: bytes
    media_type: str


def _asset(name: str, body: bytes) -> Asset:
    media = TYPES[name[name.rindex(".") :]]
    return Asset(body, gzip.compress(body, compresslevel=9, mtime=0), media)


@dataclass(frozen=True)
class Assets:
    """Every console file by its path under `static/`, the version and the index page."""

    files: dict[str, Asset]
    version: str
    index: Asset = field(repr=False)

    @classmethod
    def load(cls) -> Assets:
        """Read `eventos/console/static/` (the package's own files)."""
        root = resources.files("eventos.console") / "static"
        raw = dict(_walk(root, ""))
        digest = hashlib.sha256()
        for name in sorted(raw):
            digest.update(name.encode() + b"\0" + raw[name] + b"\0")
        version = digest.hexdigest()[:16]
        links = [f'<link rel="modulepreload" href="/console/assets/{version}/{name}">'
                 for name in sorted(raw) if name.endswith(".js")]  # fmt: skip
        page = raw.pop(INDEX).replace(PRELOAD, "\n".join(links).encode())
        page = page.replace(VERSION, version.encode())
        files = {name: _asset(name, body) for name, body in raw.items()}
        return cls(files, version, _asset(INDEX, page))

    def largest_script(self) -> tuple[str, int]:
        """The biggest JavaScript file and its size in bytes (the bench reports it)."""
        scripts = {n: len(a.body) for n, a in self.files.items() if n.endswith(".js")}
        name = max(scripts, key=lambda n: scripts[n])
        return name, scripts[name]


def _walk(folder: Traversable, prefix: str) -> list[tuple[str, bytes]]:
    found: list[tuple[str, bytes]] = []
    for entry in folder.iterdir():
        name = prefix + entry.name
        if entry.is_dir():
            found += _walk(entry, name + "/")
        elif entry.name[entry.name.rfind(".") :] in TYPES:
            found.append((name, entry.read_bytes()))
    return found
