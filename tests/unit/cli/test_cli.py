"""`eventosctl`: parsing, error messages, and each owner command against a real ingress."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import psycopg
import pytest
from conftest import ADMIN_TOKEN
from tcp_relay import relay

from eventos.cli import build_parser, main
from eventos.local.ports import free_port
from eventos.settings import DatabaseSettings

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
HELLO = str(EXAMPLES / "hello.yaml")

BAD_SPEC = """
apiVersion: eventos/v1
kind: Employee
metadata: {name: Bad_Name}
spec:
  agents: []
"""


@pytest.fixture(autouse=True)
def no_ambient_instance(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No stack file or instance variables leak in from the machine running the tests."""
    for name in ("EVENTOS_URL", "EVENTOS_ADMIN_TOKEN", "EVENTOS_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


async def ctl(*argv: str) -> int:
    """main() in a thread: the ingress under test serves on this test's event loop."""
    return await asyncio.to_thread(main, list(argv))


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for command in ("apply", "get", "list", "start", "stop", "resume", "reset", "chat", "migrate"):
        assert f"    {command} " in out


def test_instance_options_work_after_the_command_too() -> None:
    args = build_parser().parse_args(["list", "--url", "http://x", "--token", "t", "-o", "yaml"])
    assert (args.url, args.token, args.output) == ("http://x", "t", "yaml")
    # --json, kept for scripts, is -o json.
    assert build_parser().parse_args(["--json", "list"]).output == "json"


def test_apply_requires_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["apply"])
    assert done.value.code == 2
    assert "-f/--filename" in capsys.readouterr().err


def test_without_a_stack_file_it_says_how_to_start_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 5
    err = capsys.readouterr().err
    assert "no local instance found" in err
    assert "make run" in err


def test_refused_connection_names_the_address(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["list", "--url", url, "--token", ADMIN_TOKEN]) == 5
    assert capsys.readouterr().err.strip() == (
        f"error: no local instance answers at {url}; start one with `make run`"
    )


def test_missing_stack_file_given_by_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--stack", str(tmp_path / "nope.json"), "list"]) == 5
    assert "no stack file at" in capsys.readouterr().err


async def test_apply_list_start_chat(ingress_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    at = ["--url", ingress_url, "--token", ADMIN_TOKEN]
    assert await ctl("apply", "-f", HELLO, *at) == 0
    assert capsys.readouterr().out.strip() == "employee/hello created"
    assert await ctl("apply", "-f", HELLO, *at) == 0
    assert capsys.readouterr().out.strip() == "employee/hello unchanged"

    assert await ctl("list", *at) == 0
    assert capsys.readouterr().out.split("\n")[1].split() == ["hello", "stopped", "-", "-"]
    # No deliverer runs here: the start is committed and its intent waits, `applying`.
    assert await ctl("start", "hello", *at) == 0
    started = capsys.readouterr().out.strip()
    assert started == "hello: generation 1 starting (intent 1 start applying)"
    assert await ctl("get", "hello", *at) == 0
    assert capsys.readouterr().out.split("\n")[1].split() == [
        "hello", "starting", "1", "start", "applying",
    ]  # fmt: skip
    assert await ctl("describe", "hello", *at) == 0
    shown = capsys.readouterr().out
    assert "state:       starting" in shown and "intent:      1 start applying" in shown
    assert "degraded:    no" in shown and "attention (0 open or acked):" in shown
    assert await ctl("list", *at) == 0
    assert capsys.readouterr().out.split("\n")[1].split() == [
        "hello", "starting", "1", "start", "applying",
    ]  # fmt: skip
    assert await ctl("stop", "hello", "--wait", "--timeout", "0.3", *at) == 1
    waited = capsys.readouterr()
    assert waited.out.strip() == "hello: generation 1 paused (intent 2 stop applying)"
    assert "intent 2 still applying after 0.3s" in waited.err
    assert await ctl("resume", "hello", *at) == 0
    capsys.readouterr()

    assert await ctl("chat", "hello", "hi there", "--id", "m-1", *at) == 0
    first = capsys.readouterr().out.strip()
    assert first.startswith("message ") and first.endswith(" queued")
    # No relay or worker runs here: --wait gives up at its deadline and says why.
    assert (
        await ctl("chat", "hello", "hi there", "--id", "m-1", "--wait", "--timeout", "0.3", *at)
        == 1
    )
    again = capsys.readouterr()
    assert again.out.strip() == f"{first} (already sent with this id)"
    assert "no reply within 0.3s" in again.err and "queued" in again.err


async def test_json_output(ingress_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    at = ["--url", ingress_url, "--token", ADMIN_TOKEN, "--json"]
    assert await ctl("apply", "-f", HELLO, *at) == 0
    assert json.loads(capsys.readouterr().out) == {
        "name": "hello",
        "created": True,
        "changed": True,
    }
    assert await ctl("list", *at) == 0
    assert [e["name"] for e in json.loads(capsys.readouterr().out)] == ["hello"]


async def test_invalid_spec_errors_name_field_paths(
    ingress_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_SPEC)
    assert await ctl("apply", "-f", str(bad), "--url", ingress_url, "--token", ADMIN_TOKEN) == 1
    err = capsys.readouterr().err
    assert "error: " in err and "spec is invalid" in err
    assert "  metadata.name: " in err
    assert "  spec.agents: " in err


async def test_refusals_are_explained(ingress_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert await ctl("list", "--url", ingress_url, "--token", "wrong-token-0123456789") == 4
    assert "refused the token (401)" in capsys.readouterr().err
    assert await ctl("start", "nobody", "--url", ingress_url, "--token", ADMIN_TOKEN) == 3
    assert "no employee named 'nobody' (404)" in capsys.readouterr().err


async def test_stack_file_gives_url_and_token(
    ingress_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stack = tmp_path / ".eventos" / "stack.json"
    stack.parent.mkdir()
    stack.write_text(json.dumps({"ingress_url": ingress_url, "admin_token": ADMIN_TOKEN}))
    (tmp_path / "sub").mkdir()
    assert await ctl("--stack", str(stack), "list") == 0
    assert "no employees" in capsys.readouterr().out
    # Found from a subfolder too, like git finds its repository.
    monkeypatch.chdir(tmp_path / "sub")
    assert await ctl("list") == 0
    assert "no employees" in capsys.readouterr().out


async def test_the_stacks_admin_token_file_wins_after_a_rotation(
    ingress_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make run` names the admin token's file: a token rotated there is the one sent, not the
    one the stack file recorded at start (docs/security.md, "Rotating secrets")."""
    stack, token_file = tmp_path / "stack.json", tmp_path / "admin-token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    stack.write_text(json.dumps({"ingress_url": ingress_url, "admin_token": "stale-token-0123456789",
                                 "admin_token_file": str(token_file)}))  # fmt: skip
    assert await ctl("--stack", str(stack), "list") == 0
    assert "no employees" in capsys.readouterr().out


async def test_migrate_reports_an_up_to_date_database(
    db_settings: DatabaseSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await ctl("migrate", "--database-url", db_settings.url) == 0
    assert "is up to date" in capsys.readouterr().out


def test_migrate_without_a_database_says_what_to_set(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate"]) == 5
    assert "EVENTOS_DATABASE_URL" in capsys.readouterr().err


def test_migrate_against_nothing_names_the_address(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/eventos"
    assert main(["migrate", "--database-url", url]) == 5
    assert "cannot reach the database at 127.0.0.1:" in capsys.readouterr().err


async def test_migrate_waits_for_a_database_that_refuses_at_first(
    db_settings: DatabaseSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--wait`: the first connection is cut at once (a database not ready yet), the next ones
    reach the real one; without `--wait` the same start fails with exit 5."""
    info = psycopg.conninfo.conninfo_to_dict(db_settings.url)
    target = (str(info.get("host", "127.0.0.1")), int(info.get("port", 5432)))
    refused = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal refused
        if refused < 2:
            refused += 1
            writer.close()
            return
        await relay(reader, writer, *target)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = psycopg.conninfo.make_conninfo(db_settings.url, host="127.0.0.1", port=port)
    async with server:
        assert await ctl("migrate", "--database-url", url) == 5  # no wait: the cut is final
        assert await ctl("migrate", "--database-url", url, "--wait", "30") == 0
    assert refused == 2
    assert "is up to date" in capsys.readouterr().out


async def test_users_add_list_remove(ingress_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    at = ["--url", ingress_url, "--token", ADMIN_TOKEN]
    assert await ctl("users", "add", "alice", *at) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "user/alice created; its token (shown once):"
    token = shown[1]
    assert await ctl("users", "add", "bea", "--class", "c1", "--daily-usd", "2.5", *at) == 0
    capsys.readouterr()
    assert await ctl("users", "list", *at) == 0
    listed = [line.split()[:3] for line in capsys.readouterr().out.splitlines()]
    assert listed[0] == ["NAME", "CLASS", "DAILY_USD"]
    assert listed[1:] == [["alice", "c2", "share"], ["bea", "c1", "2.5"]]
    # The user's token chats; it may not manage users.
    assert await ctl("users", "list", "--url", ingress_url, "--token", token) == 4
    assert "(403)" in capsys.readouterr().err
    assert await ctl("users", "remove", "alice", *at) == 0
    assert capsys.readouterr().out.strip() == "user/alice removed"
    assert await ctl("users", "remove", "alice", *at) == 3
    assert "no user 'alice' (404)" in capsys.readouterr().err
    assert await ctl("users", "add", *at) == 2
    assert "users add needs a NAME" in capsys.readouterr().err
