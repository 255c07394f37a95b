"""Ports picked for the local servers are reserved among this machine's pickers: two stacks
starting at once never get the same port, though both find it free before either binds it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from eventos.local import ports


@pytest.fixture(autouse=True)
def own_reservations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "reservations"
    monkeypatch.setattr(ports, "RESERVATIONS", folder)
    return folder


def test_a_port_one_picker_was_given_is_not_given_to_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both pickers draw the same free port first; the second gets the next one it draws."""
    first = ports.free_port()
    draw = ports.random.randint
    repeats = iter([first, first])
    monkeypatch.setattr(ports.random, "randint", lambda low, high: next(repeats, draw(low, high)))
    second = ports.free_port()
    assert second != first


def test_an_aged_reservation_is_taken_over_once(own_reservations: Path) -> None:
    assert ports.reserve(12345)
    assert not ports.reserve(12345)
    later = time.time() + ports.RESERVED_S + 1
    assert ports.reserve(12345, now=later)
    assert not ports.reserve(12345)  # the taker's reservation is fresh again
    assert sorted(os.listdir(own_reservations)) == ["12345"]


def test_a_renewed_reservation_is_held_past_its_hour() -> None:
    """`make run` runs for days and restarts its processes on their ports: it renews them."""
    assert ports.reserve(23456)
    later = time.time() + ports.RESERVED_S + 1
    ports.renew([23456, 23457], now=later - 60)  # 23457 had none: reserved from then
    assert not ports.reserve(23456, now=later)
    assert not ports.reserve(23457, now=later)
