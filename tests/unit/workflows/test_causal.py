"""A merged turn's causal context (I8): the max hop and the union of the inputs' paths, and
the delegated tasks among its inputs (`complete_task`'s default)."""

from __future__ import annotations

from typing import Any

from eventos import names
from eventos.contracts import DeliveryItem
from eventos.workflows.turn import causal, task_ids


def item(seq: int, hop: int, path: list[str] | None, kind: str = names.TYPE_IPC_MESSAGE,
         data: dict[str, Any] | None = None) -> DeliveryItem:  # fmt: skip
    payload: dict[str, Any] = {"data": data or {}}
    if path is not None:
        payload[names.ATTR_PATH] = path
    return DeliveryItem(seq, seq, 3, kind, {}, f"chain-{seq}", hop, 10, payload)


def test_a_merged_turn_carries_the_max_hop_and_the_union_of_paths() -> None:
    items = [item(1, 2, ["a"]), item(2, 5, ["b", "a"]), item(3, 0, None), item(4, 1, ["c"])]
    assert causal(items) == ("chain-1", 5, ["a", "b", "c"])


def test_the_path_keeps_at_most_16_employees() -> None:
    long = [f"e{n}" for n in range(30)]
    assert causal([item(1, 1, long)])[2] == long[: names.STORM_PATH_MAX]


def test_task_ids_are_the_consumed_tasks_in_order() -> None:
    items = [item(1, 1, ["a"], names.TYPE_IPC_TASK, {"task_id": "task_1"}),
             item(2, 1, ["a"], names.TYPE_IPC_MESSAGE, {"task_id": "not_a_task"}),
             item(3, 1, ["b"], names.TYPE_IPC_TASK, {"task_id": "task_2"}),
             item(4, 1, ["b"], names.TYPE_IPC_TASK, {"task_id": "task_1"})]  # fmt: skip
    assert task_ids(items) == ["task_1", "task_2"]
