"""`eventosctl`: the owner's command line (SPEC §17 CLI; docs/cli.md).

One module per family of commands (`employees`, `chat`, `sends`, `operator`, `timeline`,
`migrate`), what they print (`output`: `-o json|yaml|wide`), the instance they talk to
(`instance`), `--watch` over the operator event stream (`watch`), shell completion
(`completion`), and the parser with `main` and its exit codes (`app`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (the `eventosctl` entry point)."""
    from eventos.cli.app import main as run  # the commands import this package's modules

    return run(argv)


def build_parser() -> argparse.ArgumentParser:
    """The `eventosctl` parser."""
    from eventos.cli.app import build_parser as build

    return build()
