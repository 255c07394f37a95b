"""The names running histories hold, as this release has them: every workflow type with its
signals, queries and updates, every activity type, the task queues, and the shape of each
workflow id. A history started by one release is finished by the next (docs/upgrades.md): a name
changed here strands every open run that uses it, so the golden file beside this test changes
only with a deliberate decision (add the new name and keep the old one while runs may use it).

After such a decision, write the golden file anew: `python tests/unit/workers/test_identity.py`.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

import temporalio.activity
import temporalio.workflow

from eventos import names
from eventos import workflows as workflows_pkg
from eventos.alarms.activity import AlarmActivities
from eventos.contracts import AdmitRequest
from eventos.control.supervisor import SupervisorActivities
from eventos.delivery.routing import entity_id
from eventos.llm.activity import LlmActivities
from eventos.outbox import approvals
from eventos.polls.activities import PollActivities
from eventos.scheduling.admission import turn_id
from eventos.tools.activity import ToolActivities
from eventos.workers.activities import DbActivities
from eventos.workers.roles import WORKFLOWS

GOLDEN = Path(__file__).with_name("identity.json")
ACTIVITY_CLASSES = (DbActivities, SupervisorActivities, ToolActivities, PollActivities,
                    AlarmActivities, LlmActivities)  # fmt: skip


def _activities() -> list[str]:
    """Each activity type's name (the class that defines it is not in a history)."""
    found: set[str] = set()
    for cls in ACTIVITY_CLASSES:
        for _, fn in inspect.getmembers(cls, inspect.isfunction):
            defn = temporalio.activity._Definition.from_callable(fn)
            if defn is not None and defn.name is not None:
                found.add(defn.name)
    return sorted(found)


def _workflows() -> dict[str, dict[str, list[str]]]:
    found = {}
    for cls in WORKFLOWS:
        defn = temporalio.workflow._Definition.must_from_class(cls)
        assert defn.name is not None
        found[defn.name] = {
            "signals": sorted(n for n in defn.signals if n),
            "queries": sorted(n for n in defn.queries if n),
            "updates": sorted(n for n in defn.updates if n),
        }
    return dict(sorted(found.items()))


def identity() -> dict[str, Any]:
    """What a history of this release names, as JSON."""
    req = AdmitRequest("emp", 3, "front", "t1", names.stream_key("emp", 3, "chat", "t1"), 2)
    ids = {
        "conversation": entity_id("emp", 3, "chat", "t1"),
        "turn": turn_id(req, 7),
        "supervisor": names.supervisor_id("emp", 3),
        "schedule": names.schedule_id("emp", 3, "daily"),
        "poll": names.poll_id("emp", 3, "orders"),
        "approval": approvals.workflow_id(approvals.approval_id("emp", 42)),
    }
    queues = {
        "workflow": names.WORKFLOW_QUEUE,
        "egress": names.EGRESS_QUEUE,
        **{f"llm-c{c}": q for c, q in sorted(names.LLM_QUEUES.items())},
    }
    return {"workflows": _workflows(), "activities": _activities(), "queues": queues, "ids": ids}


def test_the_names_histories_hold_are_unchanged() -> None:
    golden = json.loads(GOLDEN.read_text())
    now = identity()
    for part in ("workflows", "activities", "queues", "ids"):
        assert now[part] == golden[part], (
            f"{part} changed: open runs started by the previous release name {golden[part]}; "
            "keep every old name while runs may use it (docs/upgrades.md), then write the "
            "golden file: python tests/unit/workers/test_identity.py"
        )


def test_every_registered_type_is_in_the_golden_file() -> None:
    golden = json.loads(GOLDEN.read_text())
    assert set(golden["workflows"]) == {
        temporalio.workflow._Definition.must_from_class(c).name for c in WORKFLOWS
    }
    assert len(golden["activities"]) >= 20  # the activities were found, not an empty scan


def test_every_patch_marker_is_listed_in_the_upgrade_docs() -> None:
    """docs/upgrades.md lists each marker the workflows call (its stage is a decision)."""
    source = Path(workflows_pkg.__file__).parent
    markers = set()
    for path in source.glob("*.py"):
        markers |= set(
            re.findall(r'^PATCH_[A-Z_]+ *(?::[^=]+)?= *"([^"]+)"', path.read_text(), re.M)
        )
    assert len(markers) >= 5  # the scan found them
    docs = (Path(__file__).parents[3] / "docs" / "upgrades.md").read_text()
    assert {m for m in markers if f"`{m}`" not in docs} == set()


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(identity(), indent=2) + "\n")
    sys.stdout.write(f"wrote {GOLDEN}\n")
