"""Temporal's sandbox runs a workflow's module anew for each workflow instance it creates (after
every eviction from the sticky cache too); what the module imports inside
`workflow.unsafe.imports_passed_through()` must come from the host, loaded once per process.
`from eventos import failures, names` did not: `eventos` is the sandbox's own package there (the
workflow module's parent), so importlib loaded each name afresh from the file, bypassing the
pass-through, and `eventos.failures` alone was 10% of workers-workflow's busy samples in the
tier L fleet (py-spy, 2026-12-06). The workflows import such modules by their full name."""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from release_histories import recorded, this_release_folder
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from eventos.runtime.payload_guard import GUARDED_DATA_CONVERTER
from eventos.workers.roles import WORKFLOWS

EVENTOS = Path(sys.modules["eventos"].__file__ or "").resolve().parent
INSTANCES = 3  # of each recorded workflow type
# What the sandbox may run again for each instance: the workflow modules and their packages.
PER_INSTANCE = {"__init__.py", "workflows/__init__.py"} | {
    f"workflows/{Path(sys.modules[w.__module__].__file__ or '').name}" for w in WORKFLOWS
}


@contextmanager
def module_runs() -> Iterator[collections.Counter[str]]:
    """How often each module of eventos ran its body, on every thread, while in the block."""
    runs: collections.Counter[str] = collections.Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "<module>":
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(EVENTOS):
                runs[path.relative_to(EVENTOS).as_posix()] += 1

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        yield runs
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


async def test_a_new_workflow_instance_runs_only_its_own_modules_again() -> None:
    histories = recorded(this_release_folder())
    types = {r.workflow_type: r.history for r in histories}
    assert len(types) == len(WORKFLOWS), sorted(types)

    async def each(instances: int) -> AsyncIterator[WorkflowHistory]:
        for n in range(instances):
            for kind, history in sorted(types.items()):
                yield WorkflowHistory(f"{kind}-{n}", history.events)

    async def replay(instances: int) -> list[Exception]:
        replayer = Replayer(workflows=WORKFLOWS, data_converter=GUARDED_DATA_CONVERTER)
        async with replayer.workflow_replay_iterator(each(instances)) as results:
            return [r.replay_failure async for r in results if r.replay_failure]

    assert await replay(1) == []  # the host loads what the workflows pass through, once
    with module_runs() as runs:
        assert await replay(INSTANCES) == []
    again = {path: n for path, n in runs.items() if path not in PER_INSTANCE}
    assert again == {}, f"modules run again for new workflow instances: {again}"
    assert runs["workflows/turn.py"] >= INSTANCES  # the sandbox did run the workflow modules
