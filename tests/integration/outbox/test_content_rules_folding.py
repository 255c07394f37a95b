"""Content rules cannot be slipped past with look-alike letters or separators (issue 25
point 9): on the real stack, a customer's replies that write `refund` with a Cyrillic ie (U+0435), as
`r-e-f-u-n-d` or as `r e f u n d` are held by a `refund` keyword rule; words that only run
into one another across a space are not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from channel_stack import egress_running, now, telegram_stack
from psycopg_pool import AsyncConnectionPool
from test_approvals import RULES, held

from eventos.db import Conn
from eventos.llm.endpoints import LlmEndpoints
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.gauges import EGRESS_STATUSES
from eventos.settings import DatabaseSettings, TemporalSettings
from eventos.testing import wait_for

pytestmark = pytest.mark.temporal


async def test_look_alike_letters_and_separators_are_held_by_a_keyword_rule(
    pool: AsyncConnectionPool[Conn], db_settings: DatabaseSettings, tmp_path: Path,
    temporal_settings: TemporalSettings, outbox_keys: OutboxKeys, llm_endpoints: LlmEndpoints,
) -> None:  # fmt: skip
    async with telegram_stack(pool, db_settings, tmp_path, temporal_settings, outbox_keys,
                              llm_endpoints, spec_extra=RULES) as s, egress_running(s):  # fmt: skip
        for chat, text in [(2101, "I want my r\u0435fund"), (2102, "give me a r-e-f-u-n-d"),
                           (2103, "so: r e f u n d")]:  # fmt: skip
            await held(s, chat, text)
            assert s.fake.sent(s.token, chat) == []
        s.fake.customer_message(s.token, 2104, "we are fun day people")  # no word `refund`
        await wait_for(now(lambda: s.fake.sent(s.token, 2104) or None), timeout=60,
                       what="the reply no rule holds")  # fmt: skip

        # Telegram has the reply before the egress records it sent: wait until no row is
        # still with the egress.
        async def settled() -> list[dict[str, Any]] | None:
            rows = await s.outbox()
            return None if any(r["status"] in EGRESS_STATUSES for r in rows) else rows

        rows = await wait_for(settled, timeout=60, interval=0.1, what="every outbox row settled")
    assert sorted((r["status"], r["held_reason"]) for r in rows) == [
        ("held", "no-refunds"), ("held", "no-refunds"), ("held", "no-refunds"), ("sent", None)
    ]  # fmt: skip
