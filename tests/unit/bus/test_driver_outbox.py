"""The driver's durable outbox on its own: seq order, durability, ack bookkeeping."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventos.bus.driver_outbox import AckResult, AckStatus, DriverOutbox

SOURCE = "grpc:drv-1"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "outbox.sqlite"


@pytest.fixture
def outbox(path: Path) -> Iterator[DriverOutbox]:
    box = DriverOutbox(path)
    yield box
    box.close()


def envelope(n: int) -> dict[str, str]:
    return {"specversion": "1.0", "id": f"e{n}", "source": "/drv-1", "type": "message"}


def enqueue(box: DriverOutbox, n: int) -> int:
    return box.enqueue(SOURCE, f"k{n}", "message", envelope(n))


def test_enqueue_assigns_increasing_seqs_and_unacked_keeps_them_in_order(
    outbox: DriverOutbox,
) -> None:
    seqs = [enqueue(outbox, n) for n in range(5)]

    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    events = outbox.unacked()
    assert [e.seq for e in events] == seqs
    assert [e.dedupe_key for e in events] == [f"k{n}" for n in range(5)]
    assert json.loads(events[0].envelope) == envelope(0)
    assert [e.seq for e in outbox.unacked(after_seq=seqs[1], limit=2)] == seqs[2:4]


def test_event_fields_and_raw_envelope_round_trip(outbox: DriverOutbox) -> None:
    raw = b'{"specversion":"1.0","id":"x","source":"/s","type":"t"}'
    seq = outbox.enqueue(SOURCE, "k", "t", raw, "blob_1", "chain-1", 3, "cause-1")

    (event,) = outbox.unacked()
    assert event.seq == seq and event.envelope == raw
    assert (event.body_ref, event.chain_id, event.hop, event.causation_id) == (
        "blob_1",
        "chain-1",
        3,
        "cause-1",
    )


def test_enqueue_refuses_an_event_without_keys(outbox: DriverOutbox) -> None:
    with pytest.raises(ValueError, match="dedupe_key"):
        outbox.enqueue(SOURCE, "", "message", envelope(0))
    assert outbox.pending_count() == 0


def test_events_survive_reopening_the_file(path: Path) -> None:
    box = DriverOutbox(path)
    seqs = [enqueue(box, n) for n in range(3)]
    box.close()

    reopened = DriverOutbox(path)
    try:
        assert [e.seq for e in reopened.unacked()] == seqs
    finally:
        reopened.close()


def test_an_enqueued_event_survives_a_crash_of_the_driver(path: Path) -> None:
    # The child enqueues and dies without closing anything, as a crashed driver would.
    script = (
        "import os, sys\n"
        "from eventos.bus.driver_outbox import DriverOutbox\n"
        "box = DriverOutbox(sys.argv[1])\n"
        "seq = box.enqueue('grpc:drv-1', 'crash-key', 'message', {'id': 'c'})\n"
        "print(seq, flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)], check=True, capture_output=True, text=True
    )

    box = DriverOutbox(path)
    try:
        (event,) = box.unacked()
        assert event.seq == int(out.stdout) and event.dedupe_key == "crash-key"
    finally:
        box.close()


def test_seq_keeps_growing_across_reopen_after_every_event_was_acked(path: Path) -> None:
    box = DriverOutbox(path)
    seqs = [enqueue(box, n) for n in range(3)]
    box.ack_many([AckResult(s, AckStatus.ACCEPTED) for s in seqs])
    box.close()

    reopened = DriverOutbox(path)
    try:
        assert reopened.pending_count() == 0
        assert enqueue(reopened, 9) > seqs[-1]
        assert reopened.last_acked_seq() == seqs[-1]
    finally:
        reopened.close()


def test_acked_events_leave_the_queue_and_rejected_ones_keep_their_reason(
    outbox: DriverOutbox,
) -> None:
    a, b, c = (enqueue(outbox, n) for n in range(3))

    assert outbox.ack(a, AckStatus.ACCEPTED)
    assert outbox.ack(b, AckStatus.REJECTED, "envelope is not JSON")
    assert outbox.ack(c, AckStatus.DUPLICATE)

    assert outbox.unacked() == []
    (rejected,) = outbox.rejected()
    assert rejected.event.seq == b and rejected.event.dedupe_key == "k1"
    assert rejected.reason == "envelope is not JSON"
    assert outbox.last_acked_seq() == c


def test_an_ack_for_a_seq_not_waiting_changes_nothing(outbox: DriverOutbox) -> None:
    a = enqueue(outbox, 0)
    assert outbox.ack(a, AckStatus.REJECTED, "first answer")

    assert not outbox.ack(a, AckStatus.ACCEPTED)
    assert not outbox.ack(a + 100, AckStatus.ACCEPTED)
    assert [r.reason for r in outbox.rejected()] == ["first answer"]
    assert outbox.last_acked_seq() == a


def test_acked_through_is_the_highest_contiguous_answered_seq(outbox: DriverOutbox) -> None:
    assert outbox.acked_through() == 0
    a, b, c = (enqueue(outbox, n) for n in range(3))
    assert outbox.acked_through() == 0

    outbox.ack_many([AckResult(a, AckStatus.ACCEPTED), AckResult(c, AckStatus.DUPLICATE)])
    assert outbox.acked_through() == a
    assert outbox.last_acked_seq() == c

    outbox.ack(b, AckStatus.REJECTED, "unknown source")
    assert outbox.acked_through() == c

    d = enqueue(outbox, 3)
    assert outbox.acked_through() == c
    outbox.ack(d, AckStatus.ACCEPTED)
    assert outbox.acked_through() == d
