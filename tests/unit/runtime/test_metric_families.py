"""The metric families as each service registers them, and the labels a dead letter takes."""

from __future__ import annotations

import pytest
from metrics_table import documented, sample

from eventos import names
from eventos.runtime import metrics


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        ("reset", "reset"),
        ("malformed: holds a NUL character", "malformed"),
        ("filter_error: no such path a.b", "filter_error"),
        ("placement_invalid: thread is empty", "placement_invalid"),
        ("loop_suppressed: hop 9", "loop_suppressed"),
        ("rejected: INVALID_ARGUMENT: bad", "rejected"),
        ("turn_failed: 400 from the provider", "turn_failed"),
        ("parked for 7 days (budget)", "parked"),
        ("Someone's free text with an id emp-42", "other"),
        ("", "other"),
        (None, "other"),
    ],
)
def test_a_dead_letter_reason_becomes_a_fixed_word(reason: str | None, label: str) -> None:
    assert metrics.dead_reason(reason) == label


def test_count_dead_counts_by_the_word_only() -> None:
    before = sample(metrics.DEAD_LETTERS, reason="turn_failed")
    metrics.count_dead("turn_failed: customer +49 151 0000 wrote 'secret'", 2)
    metrics.count_dead("turn_failed: again", 0)  # nothing written: nothing counted
    assert sample(metrics.DEAD_LETTERS, reason="turn_failed") == before + 2
    labels = {s.labels["reason"] for m in metrics.DEAD_LETTERS.collect() for s in m.samples}
    assert labels <= metrics.DEAD_REASONS | {"other"}


def test_every_family_is_served_by_a_service_and_documented_for_it() -> None:
    table = documented()
    for service in names.SERVICES:
        mine = {f._name + ("_total" if f._type == "counter" else "")
                for f in (*metrics.COMMON, *metrics.SERVED[service])}  # fmt: skip
        assert mine == table[service], service
    served = {id(f) for fams in metrics.SERVED.values() for f in fams}
    declared = {
        id(v) for v in vars(metrics).values() if hasattr(v, "_type") and hasattr(v, "_name")
    }
    assert declared == served | {id(f) for f in metrics.COMMON}, "a family no service serves"


def test_register_is_idempotent_and_names_the_service() -> None:
    metrics.register("egress")
    metrics.register("egress")  # a second service object in one process: no duplicate error
    (info,) = [
        s for m in metrics.BUILD_INFO.collect() for s in m.samples
        if s.labels["service"] == "egress"
    ]  # fmt: skip
    assert (
        info.value == 1 and info.labels["version"] and info.labels["build"].startswith("eventos-")
    )
