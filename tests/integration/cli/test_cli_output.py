"""`eventosctl -o json|yaml|wide` on every read against a real ingress on real PostgreSQL: the
JSON and the YAML read back equal the API's own answer; `describe` is the employee with its
open attention, latest timeline and what waits, each part equal to its API answer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ADMIN_TOKEN
from psycopg_pool import AsyncConnectionPool
from test_attention_api import Items, items  # noqa: F401 (a fixture)
from test_dead_letters import Letters, letters  # noqa: F401 (a fixture)
from test_users import user_thread

from eventos import names
from eventos.cli import main
from eventos.db import Conn
from eventos.db.sql import Q

VOLATILE = ("as_of",)  # the horizon a timeline or waiting answer was read at


@pytest.fixture(autouse=True)
def no_ambient_instance(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("EVENTOS_URL", "EVENTOS_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


async def ctl(url: str, *argv: str) -> int:
    """main() in a thread: the ingress under test serves on this test's event loop."""
    return await asyncio.to_thread(main, [*argv, "--url", url, "--token", ADMIN_TOKEN])


def steady(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: v for k, v in doc.items() if k not in VOLATILE}
    return doc


async def sends_of_ann(pool: AsyncConnectionPool[Conn]) -> None:
    """An approval and an outbox row, so those lists are not empty."""
    thread = await user_thread(pool, "ann")
    async with pool.connection() as conn:
        await conn.execute(Q["approval_insert_tool"], {
            "id": "appr-1", "employee": "support", "generation": 1, "thread": thread,
            "turn_id": "turn-a", "tool_call": "turn-a:1", "draft": "send the report",
            "audience": "ann", "expire_after_h": 1})  # fmt: skip
        await conn.execute(Q["outbound_insert"], {
            "key": "out-1", "employee": "support", "thread": thread, "turn_id": "turn-a",
            "account": None, "recipient": None, "recipient_key_id": None, "kind": "chat",
            "class": 1, "body": "hello", "audience": "ann"})  # fmt: skip


async def test_json_and_yaml_of_every_read_equal_the_apis_answer(
    items: Items,  # noqa: F811
    letters: Letters,  # noqa: F811
    pool: AsyncConnectionPool[Conn],
    ingress_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await items.raise_item(names.ATTENTION_DEAD_INPUT, f"{items.stream}#1-1")
    await items.raise_item(names.ATTENTION_BUDGET_HIGH, "support")
    await sends_of_ann(pool)
    (item, *_) = await items.listed()
    reads: list[tuple[list[str], str, str | None]] = [
        (["list"], "/v1/employees", "employees"),
        (["get"], "/v1/employees", "employees"),
        (["get", "support"], "/v1/employees/support", None),
        (["users"], "/v1/users", "users"),
        (["users", "list"], "/v1/users", "users"),
        (["approvals"], "/v1/approvals", "approvals"),
        (["approvals", "--state", "pending"], "/v1/approvals?state=pending", "approvals"),
        (["outbox"], "/v1/outbox", "outbox"),
        (["outbox", "--status", "queued"], "/v1/outbox?status=queued", "outbox"),
        (["attention"], "/v1/attention", None),
        (["attention", "--state", "open", "--limit", "1"], "/v1/attention?state=open&limit=1",
         None),
        (["attention", "get", str(item["id"])], f"/v1/attention/{item['id']}", None),
        (["dead-letters"], "/v1/dead-letters", None),
        (["dead-letters", "--reason", "reset"], "/v1/dead-letters?reason=reset", None),
        (["timeline", "support"], "/v1/employees/support/timeline", None),
        (["timeline", "support", "--kind", "input"],
         "/v1/employees/support/timeline?kind=input", None),
        (["waiting", "support"], "/v1/employees/support/waiting", None),
    ]  # fmt: skip
    for argv, path, key in reads:
        r = await items.admin.get(path)
        assert r.status_code == 200, (path, r.text)
        answer = r.json()[key] if key else r.json()
        assert answer, f"{path} is empty: nothing compared"
        for form, parse in (("json", json.loads), ("yaml", yaml.safe_load)):
            assert await ctl(ingress_url, *argv, "-o", form) == 0, argv
            printed = capsys.readouterr()
            assert printed.err == ""
            assert steady(parse(printed.out)) == steady(answer), (argv, form)
        # --json, kept for scripts, prints the same as -o json.
        assert await ctl(ingress_url, *argv, "--json") == 0
        assert steady(json.loads(capsys.readouterr().out)) == steady(answer)
        for form in ("wide", "text"):
            assert await ctl(ingress_url, *argv, "-o", form) == 0
            assert capsys.readouterr().out.strip()


async def test_describe_shows_the_employee_its_attention_timeline_and_waits(
    items: Items,  # noqa: F811
    ingress_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await items.raise_item(names.ATTENTION_BUDGET_HIGH, "support")
    assert await ctl(ingress_url, "describe", "support", "-o", "yaml") == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    api = items.admin
    parts = {
        "employee": "/v1/employees/support",
        "attention": "/v1/attention?state=open,acked&employee=support&limit=10",
        "timeline": "/v1/employees/support/timeline?limit=10",
        "waiting": "/v1/employees/support/waiting?limit=10",
    }
    assert set(doc) == set(parts)
    for part, path in parts.items():
        assert steady(doc[part]) == steady((await api.get(path)).json()), part
    assert [i["kind"] for i in doc["attention"]["attention"]] == ["budget_high"]
    assert doc["timeline"]["timeline"] and doc["waiting"]["waiting"]

    assert await ctl(ingress_url, "describe", "support") == 0
    text = capsys.readouterr().out
    for line in ("name:        support", "state:       running", "degraded:    no",
                 "attention (1 open or acked):", "timeline (the latest ", "waiting (1 inputs):",
                 "spec:"):  # fmt: skip
        assert line in text
    assert "budget_high" in text and "input.routed" in text


async def test_wide_shows_more_columns(
    items: Items,  # noqa: F811
    ingress_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert await ctl(ingress_url, "list") == 0
    narrow = capsys.readouterr().out.splitlines()
    assert await ctl(ingress_url, "list", "-o", "wide") == 0
    wide = capsys.readouterr().out.splitlines()
    assert narrow[0].split() == ["NAME", "STATE", "GENERATION", "INTENT"]
    assert wide[0].split() == ["NAME", "STATE", "GENERATION", "INTENT", "PAUSE", "REASON",
                               "REVISION", "DAILY", "USD", "INTENT", "ID", "SPEC"]  # fmt: skip
    assert wide[1].split()[:3] == narrow[1].split()[:3] == ["support", "running", "1"]
    (row,) = (await items.admin.get("/v1/employees")).json()["employees"]
    assert wide[1].split()[-1] == row["spec_sha256"][:12]
    assert await ctl(ingress_url, "timeline", "support", "-o", "wide") == 0
    line = capsys.readouterr().out.splitlines()[0]
    chain = (await items.admin.get("/v1/employees/support/timeline")).json()["timeline"][-1]
    assert chain["chain_id"] in line  # the chain column, only in the wide form
