"""The release's deployment parts and the drill switch are read by one settings object."""

from __future__ import annotations

from eventos.settings import DRILL_READINESS_FAILURE_VAR, ReleaseSettings


def test_the_drill_switch_is_off_unless_set() -> None:
    assert ReleaseSettings.from_env({}).drill_readiness_failure is False
    assert ReleaseSettings.from_env({DRILL_READINESS_FAILURE_VAR: "1"}).drill_readiness_failure
    tagged = ReleaseSettings.from_env(
        {"EVENTOS_IMAGE_TAG": " v2 ", DRILL_READINESS_FAILURE_VAR: "0"}
    )
    assert (tagged.image_tag, tagged.drill_readiness_failure) == ("v2", False)
