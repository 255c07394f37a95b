"""The k8s suite runs only when asked for (`pytest -m k8s`, `make test-images`): `make test` runs
every test under tests/, and these need the images `make images` builds and podman."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "k8s" in (config.getoption("markexpr") or ""):
        return
    skipped = [item for item in items if item.get_closest_marker("k8s") is not None]
    if skipped:
        config.hook.pytest_deselected(items=skipped)
        items[:] = [item for item in items if item.get_closest_marker("k8s") is None]
