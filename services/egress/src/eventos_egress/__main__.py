"""`python -m eventos_egress`: the send activities on queue `egress` (owner chat for now)."""

from __future__ import annotations

from eventos.activities import DbActivities
from eventos.gauges import gauge_loop, read_outbox
from eventos.outbox_keys import OutboxKeys
from eventos.service import run_main
from eventos.wiring import ConnectedConfig, build_connected
from eventos.workers import egress_worker, run_forever


async def main() -> None:
    outbox = OutboxKeys.from_env()  # egress opens recipients: no key, no start
    cfg = ConnectedConfig.from_env("egress")
    service, connected = await build_connected(cfg)
    db = DbActivities(connected.pool, outbox=outbox)
    service.loops.append(lambda: run_forever(connected.temporal, lambda c: egress_worker(c, db)))
    service.loops.append(lambda: gauge_loop(read_outbox, connected.pool))
    await service.run()


if __name__ == "__main__":
    run_main("egress", main())
