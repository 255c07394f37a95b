"""`apply`'s line for a spec whose flags changed: the live generation drains (docs/flags.md)."""

from __future__ import annotations

from typing import Any, cast

from eventos.cli.employees import _applied_line
from eventos.client.owner_api import OwnerClient


def test_a_flag_change_says_the_generation_drains() -> None:
    item: dict[str, Any] = {"name": "support", "created": False, "changed": True, "draining": 1}
    client = cast(OwnerClient, None)  # the line needs no other read
    assert _applied_line(client, item) == (
        "employee/support configured (flags changed: generation 1 drains into a new one)"
    )
