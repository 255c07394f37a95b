"""The recorded histories of every release: `tests/histories/<release>/*.json` (docs/upgrades.md).

A release is named by the eventos package's version (`version` in libs/eventos/pyproject.toml,
as `/livez` reports it and as UPGRADING.md heads its section). Each release's folder holds
histories its code recorded (record_histories.py); the replay test runs every one of them on
today's code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import WorkflowHistory

from eventos.runtime.build import release

HISTORIES = Path(__file__).resolve().parents[2] / "histories"
VERSION = re.compile(r"^\d+(\.\d+)*$")


def version_key(name: str) -> tuple[int, ...]:
    """A release name's order: `0.10.0` comes after `0.9.1`."""
    if not VERSION.match(name):
        raise ValueError(f"tests/histories/{name}: not a release name (digits and dots)")
    return tuple(int(part) for part in name.split("."))


def release_folders(root: Path = HISTORIES) -> list[Path]:
    """Every release's folder, oldest first."""
    return sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: version_key(p.name))


def this_release_folder(root: Path = HISTORIES) -> Path:
    """Where the recorder writes: the folder of the release this code is."""
    return root / release()


@dataclass(frozen=True)
class Recorded:
    """One recorded history: its file, and the workflow type its first event names."""

    path: Path
    history: WorkflowHistory

    @property
    def label(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"

    @property
    def workflow_type(self) -> str:
        first = self.history.events[0]
        return first.workflow_execution_started_event_attributes.workflow_type.name


def recorded(folder: Path) -> list[Recorded]:
    """The histories of one release's folder, by file name."""
    return [
        Recorded(p, WorkflowHistory.from_json(f"{folder.name}/{p.stem}", p.read_text()))
        for p in sorted(folder.glob("*.json"))
    ]
