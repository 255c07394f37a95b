"""`python -m eventos_workers_workflow`: every workflow type and the database activities, on the
instance's workflow queue and on the owner's and the turns' beside it."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from temporalio.client import Client
from temporalio.worker import Worker

from eventos.outbox.keys import OutboxKeys
from eventos.polls.activities import PollActivities
from eventos.runtime.service import run_main
from eventos.runtime.wiring import ConnectedConfig, build_connected
from eventos.scheduling.policy import SchedConfig
from eventos.settings import SecretStore, SupervisionSettings
from eventos.workers.activities import DbActivities
from eventos.workers.roles import run_forever, workflow_worker


async def main() -> None:
    outbox = OutboxKeys.from_env()  # the consuming save seals recipients: no key, no start
    cfg = ConnectedConfig.from_env("workers-workflow")
    service, connected = await build_connected(cfg)
    db = DbActivities(connected.pool, SchedConfig.from_env(), outbox=outbox,
                      supervision=SupervisionSettings.from_env())  # fmt: skip
    polls = PollActivities(connected.pool, SecretStore.from_env())  # poll auth: secret references

    def worker(owner: bool = False, turns: bool = False) -> Callable[[Client], Worker]:
        return lambda c: workflow_worker(c, db=db, polls=polls, owner=owner, turns=turns)

    # The instance's workflow queue, and the owner's and the turns' beside it (slots of their
    # own each).
    builds = [worker(), worker(owner=True), worker(turns=True)]
    service.loops += [partial(run_forever, connected.temporal, build) for build in builds]
    await service.run()


if __name__ == "__main__":
    run_main("workers-workflow", main())
