"""`eventosctl`'s exit codes, which scripts rely on (docs/cli.md#exit-codes), against a real
ingress: 0 done, 1 refused or failed, 2 bad usage, 3 not found, 4 unauthorized, 5 nothing
answers; every error on stderr, nothing on stdout. Run as the installed command too."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ADMIN_TOKEN
from test_attention_api import Items, items  # noqa: F401 (a fixture)

from eventos import names
from eventos.cli import main
from eventos.local.ports import free_port


@pytest.fixture(autouse=True)
def no_ambient_instance(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("EVENTOS_URL", "EVENTOS_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


async def test_each_outcome_has_its_exit_code(
    items: Items,  # noqa: F811
    ingress_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    user_token = (await items.admin.post("/v1/users", json={"name": "cal"})).json()["token"]
    await items.raise_item(names.ATTENTION_BUDGET_HIGH, "support")
    (item,) = await items.listed()
    here = ["--url", ingress_url]
    nowhere = ["--url", f"http://127.0.0.1:{free_port()}"]
    admin, user = ["--token", ADMIN_TOKEN], ["--token", user_token]
    cases: list[tuple[list[str], int, str]] = [
        (["list", *here, *admin], 0, ""),
        (["attention", "resolve", str(item["id"]), *here, *admin], 0, ""),
        (["attention", "resolve", str(item["id"]), *here, *admin], 1, "is resolved (409)"),
        (["replay", "--selector", "reason=late", *here, *admin], 1, "must be one of"),
        (["attention", "ack", *here, *admin], 2, "needs the item's ID"),
        (["replay", "--selector", "colour=red", *here, *admin], 2, "--selector"),
        (["users", "add", *here, *admin], 2, "users add needs a NAME"),
        (["get", "nobody", *here, *admin], 3, "no employee named 'nobody' (404)"),
        (["describe", "nobody", *here, *admin], 3, "(404)"),
        (["attention", "get", "999999", *here, *admin], 3, "(404)"),
        (["list", *here, "--token", "wrong-token-0123456789"], 4, "refused the token (401)"),
        (["list", *here, *user], 4, "(403)"),
        (["dead-letters", *here, *user], 4, "(403)"),
        (["list", *nowhere, *admin], 5, "no local instance answers at"),
        (["attention", "--watch", *nowhere, *admin], 5, "no local instance answers at"),
        (["list"], 5, "no local instance found"),
    ]
    for argv, code, said in cases:
        assert await asyncio.to_thread(main, argv) == code, argv
        printed = capsys.readouterr()
        assert said in printed.err, (argv, printed.err)
        if code:
            assert printed.out == "" and printed.err.startswith("error: "), argv


def test_bad_usage_exits_2_with_its_message_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["list", "--no-such-flag"], ["attention", "frobnicate"], ["-o", "xml", "list"],
                 ["completion", "fish"], ["timeline"]):  # fmt: skip
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2, argv
        printed = capsys.readouterr()
        assert printed.out == "" and "usage: eventosctl" in printed.err, argv
    assert main([]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and "usage: eventosctl" in printed.err


async def test_the_installed_command_exits_with_the_same_codes(
    ingress_url: str, tmp_path: Path
) -> None:
    ctl = Path(sys.executable).parent / "eventosctl"  # the entry point pyproject installs
    env = {**os.environ, "EVENTOS_URL": ingress_url, "EVENTOS_ADMIN_TOKEN": ADMIN_TOKEN}
    for argv, code in ((["list", "-o", "json"], 0), (["get", "nobody"], 3), (["frob"], 2),
                       (["list", "--token", "wrong-token-0123456789"], 4)):  # fmt: skip
        done = await asyncio.to_thread(subprocess.run, [str(ctl), *argv], capture_output=True,
                                       text=True, env=env, cwd=tmp_path, timeout=60)  # fmt: skip
        assert done.returncode == code, (argv, done.stderr)
        assert (done.stdout == "") == (code != 0), argv
