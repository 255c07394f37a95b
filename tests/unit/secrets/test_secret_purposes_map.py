"""The operator's map of secret purposes (EVENTOS_SECRETS_PURPOSES): its grammar, which entry
wins, and the built-in default for drivers' token references."""

from __future__ import annotations

import pytest

from eventos.errors import ConfigError
from eventos.secret_purposes import VAR, SecretOutsidePurpose, SecretPurposes
from eventos.settings import SecretStore


def test_exact_names_win_over_prefixes_and_longer_prefixes_over_shorter() -> None:
    map_ = SecretPurposes.parse(
        "tg-*=channel, tg-ops-*=webhook tg-ops-main=llm\nfeed=poll:a.example"
    )
    assert map_.of("tg-shop") == "channel"
    assert map_.of("tg-ops-x") == "webhook"
    assert map_.of("tg-ops-main") == "llm"
    assert map_.of("feed") == "poll:a.example"
    assert map_.of("other") is None


def test_driver_references_are_drivers_unless_declared_otherwise() -> None:
    assert SecretPurposes().of("driver-drv-1") == "driver"
    assert SecretPurposes.parse("driver-*=webhook").of("driver-drv-1") == "webhook"
    assert SecretPurposes.parse("driver-drv-1=llm").of("driver-drv-1") == "llm"


@pytest.mark.parametrize(
    "text",
    [
        "openai-main",
        "openai-main=",
        "openai-main=anything",
        "Openai=llm",
        "x=http:",
        "x=http:*",
        "x=llm x=webhook",
        "x=poll:https://a.example",
    ],
)
def test_a_bad_entry_fails_at_boot_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigError, match=VAR):
        SecretStore.from_env({VAR: text})


def test_a_secret_is_read_only_for_its_purpose() -> None:
    store = SecretStore(env={VAR: "orders=http:*.orders.example", "EVENTOS_SECRET_ORDERS": "t"})
    assert store.resolve("orders", "http:*.orders.example") == b"t"
    for purpose in ("http:api.orders.example", "poll:api.orders.example", "llm"):
        with pytest.raises(SecretOutsidePurpose, match=r"declared for 'http:\*\.orders\.example'"):
            store.resolve("orders", purpose)
