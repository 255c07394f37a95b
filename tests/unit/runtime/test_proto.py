"""The committed gRPC code is what proto/eventos/v1 generates (run `make proto` after a change)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_generated_code_matches_the_protos() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "protogen.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
