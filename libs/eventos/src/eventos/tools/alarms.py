"""Tools of the alarms family (filled in by issue 13)."""

from __future__ import annotations

from eventos.tools.base import Tool

TOOLS: list[Tool] = []
