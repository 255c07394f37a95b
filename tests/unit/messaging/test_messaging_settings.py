"""The staleness bound of messaging between employees is a setting (SPEC §15: 24 h)."""

from __future__ import annotations

import pytest

from eventos.errors import ConfigError
from eventos.settings import MessagingSettings


def test_the_bound_defaults_to_24_h_and_is_read_once_from_its_variable() -> None:
    assert MessagingSettings.from_env({}).stale_after_s == 86400.0
    got = MessagingSettings.from_env({"EVENTOS_MESSAGING_STALE_AFTER_S": "90"})
    assert got.stale_after_s == 90.0


@pytest.mark.parametrize("raw", ["0", "-5", "soon"])
def test_a_bound_that_is_not_a_positive_number_fails_at_boot_naming_its_variable(raw: str) -> None:
    with pytest.raises(ConfigError, match="EVENTOS_MESSAGING_STALE_AFTER_S"):
        MessagingSettings.from_env({"EVENTOS_MESSAGING_STALE_AFTER_S": raw})
