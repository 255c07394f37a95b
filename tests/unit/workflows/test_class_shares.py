"""Deficit round-robin between classes while Temporal pushes back (SPEC §8 step 3)."""

from __future__ import annotations

from collections import Counter

import pytest

from eventos import names
from eventos.contracts import DeliveryItem
from eventos.delivery.relay import STREAMS_AT_ONCE, ClassShares, Pushback
from eventos.workflows.conversation import next_inputs

EVERYONE_WAITING = {c: 1000 for c in names.CLASSES}


def shares_over(passes: int, budget: int, waiting: dict[int, int]) -> Counter[int]:
    drr = ClassShares()
    total: Counter[int] = Counter()
    for _ in range(passes):
        grant = drr.split(waiting, budget)
        assert sum(grant.values()) == min(budget, sum(waiting.values()))
        assert all(grant[c] <= waiting[c] for c in grant)
        total.update(grant)
    return total


@pytest.mark.parametrize("budget", [1, 3, 7, 64])
def test_calls_follow_the_floors_whatever_the_budget(budget: int) -> None:
    total = shares_over(200, budget, EVERYONE_WAITING)
    calls = sum(total.values())
    for klass, floor in names.CLASS_FLOORS.items():
        assert total[klass] / calls == pytest.approx(floor, abs=0.02)


def test_no_class_starves_even_with_one_call_per_pass() -> None:
    drr = ClassShares()
    seen = [next(iter(drr.split(EVERYONE_WAITING, 1))) for _ in range(10)]
    assert set(seen) == set(names.CLASSES)  # all four classes within ten passes


def test_an_idle_class_share_flows_to_the_others_and_keeps_no_credit() -> None:
    total = shares_over(100, 10, {1: 1000, 4: 1000})
    assert total[1] / total[4] == pytest.approx(0.30 / 0.15, rel=0.05)
    drr = ClassShares()
    drr.split({1: 1000, 2: 1000}, 5)
    assert drr.split({2: 3}, 10) == {2: 3}  # fewer waiting than the budget: all served
    assert drr.deficit.get(1, 0.0) == 0.0  # class 1 had nothing waiting: no credit saved


def test_pushback_pauses_the_lowest_class_and_halves_the_calls() -> None:
    pushback = Pushback()
    assert not pushback.shaping() and pushback.active() == list(names.CLASSES)
    assert pushback.push_back() == names.C4_BACKGROUND
    assert pushback.shaping() and pushback.budget == STREAMS_AT_ONCE // 2
    assert pushback.push_back() == names.C3_INTERNAL  # C4 is paused: the next lowest
    assert pushback.active() == [names.C1_OWNER, names.C2_CUSTOMER]
    pushback.relax(names.C1_OWNER)
    assert pushback.budget == STREAMS_AT_ONCE // 4 + 1


def item(seq: int, klass: int, route: str) -> DeliveryItem:
    return DeliveryItem(seq=seq, ingress_id=seq, klass=klass, type="msg",
                        route={"agent": "a", "kind": "grpc", "trigger": route}, chain_id="c",
                        hop=0, size=10)  # fmt: skip


def test_the_next_turn_takes_the_top_class_and_its_route_only() -> None:
    pending = [item(1, 4, "low"), item(2, 1, "high"), item(3, 4, "low"), item(4, 1, "high"),
               item(5, 1, "other"), item(6, 1, "high")]  # fmt: skip
    # The oldest owner input, the next ones on its route (lower classes passed over), up to
    # another route of that class.
    assert [i.seq for i in next_inputs(pending)] == [2, 4]
    assert [i.seq for i in next_inputs([i for i in pending if i.klass == 4])] == [1, 3]
    assert next_inputs([]) == []
