"""The console's settings: whether the admin may read what the model was asked and answered in
a turn (`EVENTOS_CONSOLE_TRANSCRIPTS`, off by default: a transcript holds message text)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from eventos.settings import env_bool

TRANSCRIPTS_VAR = "EVENTOS_CONSOLE_TRANSCRIPTS"


@dataclass(frozen=True)
class ConsoleSettings:
    """`transcripts`: the admin-only transcript view of a turn is served (each view is recorded
    on the employee's timeline)."""

    transcripts: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ConsoleSettings:
        env = os.environ if env is None else env
        return cls(transcripts=env_bool(env, TRANSCRIPTS_VAR, False))
