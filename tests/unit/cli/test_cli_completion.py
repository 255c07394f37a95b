"""`eventosctl completion bash`, run by bash itself: it completes command names, a command's
options and words, an option's choices, and skips the global options' values."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from eventos.cli import build_parser, main
from eventos.cli.completion import bash, zsh


def complete(*words: str) -> list[str]:
    """What bash completes for `words` (the last is the word under the cursor)."""
    quoted = " ".join(f"'{w}'" for w in words)
    program = (f"{bash(build_parser())}\n"
               f"COMP_WORDS=(eventosctl {quoted}); COMP_CWORD={len(words)}; _eventosctl\n"
               'printf "%s\\n" "${COMPREPLY[@]}"\n')  # fmt: skip
    bash_path = shutil.which("bash")
    assert bash_path is not None, "bash is needed to test its completion"
    done = subprocess.run([bash_path, "--norc", "--noprofile", "-c", program],
                          capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    assert done.stderr == ""
    return [w for w in done.stdout.splitlines() if w]


def test_bash_completes_command_names() -> None:
    assert complete("ti") == ["timeline"]
    assert complete("de") == ["describe", "delete", "dead-letters"]
    assert set(complete("")) >= {"apply", "get", "list", "describe", "attention", "approvals",
                                 "outbox", "dead-letters", "replay", "timeline", "waiting",
                                 "users", "completion"}  # fmt: skip
    # The global options' values are not taken for the command.
    assert complete("--url", "http://localhost:8080", "lis") == ["list"]
    assert complete("-o", "yaml", "--token", "t", "wai") == ["waiting"]
    assert complete("--ur") == ["--url"]


def test_bash_completes_options_words_and_choices() -> None:
    assert complete("attention", "") >= ["list", "get", "ack", "resolve", "act"]
    assert "--watch" in complete("attention", "--w")
    assert complete("list", "-o", "") == ["text", "json", "yaml", "wide"]
    assert complete("approvals", "--state", "p") == ["pending"]
    assert complete("outbox", "--status", "un") == ["unknown"]
    assert complete("timeline", "support", "--fo") == ["--follow"]
    assert complete("completion", "") == ["bash", "zsh"]
    assert complete("users", "re") == ["remove"]


def test_bash_registers_the_function(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    bash_path = shutil.which("bash")
    assert bash_path is not None
    done = subprocess.run([bash_path, "--norc", "-c", f"{script}\ncomplete -p eventosctl"],
                          capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    assert done.stdout.strip() == "complete -F _eventosctl eventosctl"


def test_zsh_script_describes_every_command() -> None:
    script = zsh(build_parser())
    assert script.startswith("#compdef eventosctl\n")
    for command in ("apply", "describe", "attention", "dead-letters", "timeline", "completion"):
        assert f"\n    '{command}:" in script and f"\n        {command})" in script
    assert "compdef _eventosctl eventosctl" in script


def test_bash_completes_file_names_where_an_option_takes_one(tmp_path: Path) -> None:
    (tmp_path / "hello.yaml").write_text("")
    where = str(tmp_path / "hel")
    assert complete("apply", "-f", where) == [str(tmp_path / "hello.yaml")]
    assert complete("--stack", where) == [str(tmp_path / "hello.yaml")]
    assert complete("timeline", "support", "-f", "--w") == ["--watch"]  # -f is --follow there
