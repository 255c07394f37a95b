"""`python -m eventos_relay`: deliver streams to their entities, apply owner intents,
re-arm Temporal from the database at boot, watch running turns, approvals, failing
threads, degraded employees, the router, windows and retries, and sweep the instance every 5
minutes (overdue alarms, workflow tasks that keep failing)."""

from __future__ import annotations

import os
import socket

from eventos import names
from eventos.control.intent_deliverer import Deliverer, deliverer_loop
from eventos.delivery.relay import Relay, lanes_loop
from eventos.health.loop import supervise_loop
from eventos.health.turn_watchdog import watchdog_loop
from eventos.health.upkeep import upkeep_loop
from eventos.outbox.approvals import approvals_loop
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.gauges import gauge_loop, read_backlog
from eventos.runtime.service import run_main
from eventos.runtime.wiring import ConnectedConfig, build_connected
from eventos.scheduling.policy import SchedConfig
from eventos.settings import AlarmSettings, SupervisionSettings, TurnTimeouts


async def main() -> None:
    outbox = OutboxKeys.from_env()  # re-arm makes orphaned sends: no key, no start
    cfg = ConnectedConfig.from_env("relay", wake=True)
    service, connected = await build_connected(cfg)
    relay_id = os.environ.get("EVENTOS_RELAY_ID") or f"{socket.gethostname()}:{os.getpid()}"
    relay = Relay(connected.pool, connected.temporal, relay_id,
                  owner_task_queue=names.owner_queue(names.WORKFLOW_QUEUE),
                  turn_task_queue=names.turn_queue(names.WORKFLOW_QUEUE),
                  turn_timeouts=TurnTimeouts.from_env())  # fmt: skip
    service.loops.append(lambda: lanes_loop(relay, connected.signal, cfg.service.poll_interval_s))
    deliverer = Deliverer(connected.pool, connected.temporal, sched=SchedConfig.from_env(),
                          outbox=outbox)  # fmt: skip
    service.loops.append(lambda: deliverer_loop(deliverer, cfg.service.poll_interval_s))
    service.loops.append(lambda: watchdog_loop(connected.pool, connected.temporal))
    supervision = SupervisionSettings.from_env()
    service.loops.append(lambda: supervise_loop(connected.pool, connected.temporal, supervision))
    alarms = AlarmSettings.from_env()
    service.loops.append(lambda: upkeep_loop(connected.pool, connected.temporal, supervision,
                                             alarms))  # fmt: skip
    service.loops.append(lambda: approvals_loop(connected.pool, connected.temporal))
    service.loops.append(lambda: gauge_loop(read_backlog, connected.pool))
    await service.run()


if __name__ == "__main__":
    run_main("relay", main())
