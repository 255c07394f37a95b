"""`eventosctl dead-letters`, `replay` and `attention` against a real ingress on real PostgreSQL:
what they print, what they do, their exit codes."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from conftest import ADMIN_TOKEN
from test_attention_api import Items, items  # noqa: F401 (a fixture)
from test_dead_letters import Letters, letters  # noqa: F401 (a fixture)

from eventos import names
from eventos.cli import main
from eventos.cli.operator import parse_selector


@pytest.fixture(autouse=True)
def no_ambient_instance(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("EVENTOS_URL", "EVENTOS_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


async def ctl(url: str, *argv: str, token: str = ADMIN_TOKEN) -> int:
    """main() in a thread: the ingress under test serves on this test's event loop."""
    return await asyncio.to_thread(main, [*argv, "--url", url, "--token", token])


def test_a_selector_is_key_values_or_json() -> None:
    assert parse_selector("id=ingress-1, id=delivery-2,reason=reset") == {
        "ids": ["ingress-1", "delivery-2"], "reason": "reset"}  # fmt: skip
    assert parse_selector('{"source": "webhook"}') == {"source": "webhook"}
    for bad in ("colour=red", "reason", "reason=", "", "{oops", "[1]"):
        with pytest.raises(Exception, match="--selector"):
            parse_selector(bad)


async def test_dead_letters_and_replay_asking_first(
    letters: Letters,  # noqa: F811
    ingress_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert await ctl(ingress_url, "dead-letters", "--reason", "reset") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["ID", "REASON", "AT", "SOURCE", "EMPLOYEE", "REPLAYED"]
    assert [line.split()[1] for line in out[1::2]] == ["reset", "reset"]
    assert await ctl(ingress_url, "dead-letters", "--limit", "4", "--json") == 0
    page = json.loads(capsys.readouterr().out)
    assert len(page["dead_letters"]) == 4 and page["next_cursor"]

    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    assert await ctl(ingress_url, "replay", "--selector", "reason=filter_error") == 1
    out = capsys.readouterr().out
    assert "3 dead letters would be replayed" in out and out.rstrip().endswith("nothing replayed")
    assert await letters.listed(replayed="true") == []
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert await ctl(ingress_url, "replay", "--selector", "reason=filter_error") == 0
    assert capsys.readouterr().out.rstrip().endswith("replayed 3")
    assert len(await letters.listed(replayed="true")) == 3
    assert await ctl(ingress_url, "replay", "--selector", "source=webhook", "--yes") == 0
    out = capsys.readouterr().out
    assert "1 dead letters would be replayed (3 already replayed)" in out
    assert out.rstrip().endswith("replayed 1")
    assert await ctl(ingress_url, "replay", "--selector", "source=webhook", "--yes") == 0
    assert capsys.readouterr().out.strip() == "nothing to replay (4 already replayed)"
    assert await ctl(ingress_url, "replay", "--selector", "reason=late") == 1
    assert "must be one of" in capsys.readouterr().err


async def test_attention_list_ack_resolve_and_act(
    items: Items,  # noqa: F811
    ingress_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await items.raise_item(names.ATTENTION_DEAD_INPUT, f"{items.stream}#1-1")
    await items.raise_item(names.ATTENTION_BUDGET_HIGH, "support")
    high, dead = sorted(await items.listed(), key=lambda i: str(i["kind"]))
    assert await ctl(ingress_url, "attention") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["ID", "EMPLOYEE", "KIND"]
    assert [line.split()[:3] for line in out[1::2]] == [
        [str(high["id"]), "support", "budget_high"], [str(dead["id"]), "support", "dead_input"]]  # fmt: skip
    assert (out[1].split()[-1], out[3].split()[-1]) == ("-", "replay")
    assert out[4].strip() == "dead_input happened"
    assert await ctl(ingress_url, "attention", "ack", str(high["id"])) == 0
    assert capsys.readouterr().out.split()[4] == "acked"
    assert await ctl(ingress_url, "attention", "--state", "acked", "--json") == 0
    assert [i["id"] for i in json.loads(capsys.readouterr().out)["attention"]] == [high["id"]]
    assert await ctl(ingress_url, "attention", "act", str(high["id"])) == 1
    assert "offers: none" in capsys.readouterr().err
    # The item's only action needs no --action: its inputs (none left dead) are replayed.
    assert await ctl(ingress_url, "attention", "act", str(dead["id"]), "--json") == 0
    done = json.loads(capsys.readouterr().out)
    assert (done["action"], done["replayed"]) == ("replay", 0)
    assert await ctl(ingress_url, "attention", "resolve", str(high["id"])) == 0
    assert await ctl(ingress_url, "attention", "resolve", str(high["id"])) == 1
    assert "is resolved (409)" in capsys.readouterr().err
    assert await ctl(ingress_url, "attention", "ack") == 2
    assert "needs the item's ID" in capsys.readouterr().err
