"""The thread of a target that holds one conversation of a sender (issue 25, EG17): one per
origin conversation, named without personal data, a shape the router places."""

from __future__ import annotations

from eventos import names
from eventos.delivery.routing import PLACED_THREAD


def test_one_thread_per_origin_conversation_in_a_placeable_shape() -> None:
    alice = names.peer_thread("sales", "customer", "t_" + "a" * 16)
    bob = names.peer_thread("sales", "customer", "t_" + "b" * 16)
    assert alice != bob and alice == names.peer_thread("sales", "customer", "t_" + "a" * 16)
    assert alice.startswith("peer_sales_") and len(alice) == len("peer_sales_") + 12
    # The same thread id in another lane is another conversation.
    assert names.peer_thread("sales", "talk", "main") != names.peer_thread(
        "sales", "worker", "main"
    )
    longest = names.peer_thread("a" + "-" * 39, "talk", "u_" + "0" * 16)
    for thread in (alice, bob, longest, "peer_sales"):  # the bare form of older rows still routes
        assert PLACED_THREAD.match(thread), thread
    for bad in ("peer_sales_", "peer_sales_ABCDEF012345", "peer_sales_0123", "peer_Sales"):
        assert not PLACED_THREAD.match(bad), bad
