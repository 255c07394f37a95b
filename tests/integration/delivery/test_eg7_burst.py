"""EG7 (SPEC §16), counted: a burst of 10,000 inputs to one conversation, appended and routed
before the relay runs, costs the entity fewer than 1,000 Signals over all its continue-as-new
runs, and no run's history reaches 10 MB.

The parts are bench/conversation_burst.py's (the driver that prints the same figures); the
turns run on the instant local model. Signals and bytes are read from the runs' histories, not
timed: the `deliver` batches (about 625, full batches of 16) are the only Signals, whatever the
machine's pace (a turn tells its entity nothing by Signal: it ends with its result). The drain
takes 6-8 minutes on the shared 2-core machine (SPEC §8's 4 Signals per entity per second cap it
at 64 inputs/s). Before the patches `consumed-without-signal` and `consumed-from-database` each
turn also sent `inputs_consumed`, and the test failed (1,098-1,184 Signals: 625 batches and
470-560 turns).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from psycopg_pool import AsyncConnectionPool

from eventos.db import Conn
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.payload_guard import connect
from eventos.settings import TemporalSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from conversation_burst import (
    HISTORY_MAX_BYTES,
    SIGNALS_MAX,
    drain,
    entity_runs,
    prepare,
    signals_by_name,
)

BURST = 10_000
DRAIN_TIMEOUT_S = 1500.0  # a hang limit, not a speed: 10,000 inputs at 7 inputs/s

pytestmark = [pytest.mark.temporal, pytest.mark.timeout(DRAIN_TIMEOUT_S + 300)]


async def test_a_10000_input_burst_to_one_conversation_costs_under_1000_signals_and_10_mb(
    pool: AsyncConnectionPool[Conn], temporal_settings: TemporalSettings, outbox_keys: OutboxKeys
) -> None:
    employee = f"burst-{uuid.uuid4().hex[:8]}"  # entity ids no other test's workflows share
    async with pool.connection() as conn:
        await prepare(conn, employee, BURST)
    client = await connect(temporal_settings.address, temporal_settings.namespace)
    entity_id, _ = await drain(
        pool, client, temporal_settings, BURST, outbox=outbox_keys,
        queue=f"wf-{uuid.uuid4().hex[:8]}", timeout_s=DRAIN_TIMEOUT_S, say=lambda line: None,
    )  # fmt: skip

    runs = await entity_runs(client, entity_id)
    current = (await client.get_workflow_handle(entity_id).describe()).run_id
    assert runs[-1].run_id == current, "the chain of runs was not followed to the current run"
    signals = sum(r.signals for r in runs)
    per_run = [(r.signals, r.events, round(r.bytes / 1e6, 2)) for r in runs]
    by_name = signals_by_name(runs)
    print(f"EG7: {signals} Signals in {len(runs)} runs, by name {by_name}; per run (signals, "
          f"events, MB): {per_run}")  # fmt: skip
    assert signals < SIGNALS_MAX, (
        f"{signals} Signals for {BURST} inputs ({BURST / signals:.1f} inputs per Signal; full "
        f"batches of 16 make 625), by name {by_name}; per run (signals, events, MB): {per_run}"
    )
    assert max(r.bytes for r in runs) < HISTORY_MAX_BYTES, f"per run: {per_run}"
