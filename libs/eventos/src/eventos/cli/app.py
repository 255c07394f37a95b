"""`eventosctl`'s parser, and `main`: one command, its errors on stderr, its exit code.

Exit codes (docs/cli.md#exit-codes): 0 done; 1 refused, declined or failed; 2 bad usage; 3 not
found (404); 4 the token was refused or may not do that (401, 403); 5 nothing answers (no
instance configured, no connection, a timeout, the database for `migrate`); 7 `chat --wait`:
held for approval (eventos.cli.chat.EXIT_HELD).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from eventos.cli import (
    backups,
    chat,
    completion,
    employees,
    migrate,
    operator,
    sends,
    timeline,
    upgrade,
)
from eventos.cli.instance import START_HINT, Unreachable, UsageError
from eventos.cli.output import FORMATS
from eventos.client.owner_api import (
    InstanceTimeout,
    InstanceUnreachable,
    OwnerApiError,
    StreamDropped,
)
from eventos.errors import EventOSError
from eventos.telemetry.redact import protect_logs

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_UNAUTHORIZED, EXIT_UNREACHABLE = range(6)
Command = Callable[[argparse.Namespace], int]


def _common() -> argparse.ArgumentParser:
    # Defaults are suppressed so the options work before and after the command alike.
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("instance and output")
    group.add_argument(
        "--stack",
        type=Path,
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="stack file of `make run` (default: the nearest .eventos/stack.json)",
    )
    group.add_argument("--url", default=argparse.SUPPRESS, help="ingress URL (or EVENTOS_URL)")
    group.add_argument(
        "--token", default=argparse.SUPPRESS, help="admin or user token (or EVENTOS_ADMIN_TOKEN)"
    )
    group.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default=argparse.SUPPRESS,
        metavar="json|yaml|wide",
        help="print the API's answer as json or yaml, or a wider table",
    )
    # The flag before -o: kept for scripts, hidden.
    group.add_argument("--json", dest="output", action="store_const", const="json",
                       default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # fmt: skip
    return common


def _waits(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--wait", action="store_true", help="wait until the intent is applied")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds --wait waits (60)")
    return p


def _watches(p: argparse.ArgumentParser, what: str) -> argparse.ArgumentParser:
    p.add_argument("-w", "--watch", action="store_true", help=what)
    return p


def _employee_commands(add: operator.Add) -> None:
    p = add("apply", employees.cmd_apply, "apply employee specs (YAML or JSON)")
    p.add_argument("-f", "--filename", dest="files", action="append", required=True,
                   metavar="FILE", help="a spec file, '-' for stdin; repeatable")  # fmt: skip
    p = add("get", employees.cmd_get, "employees as a table (one with NAME); -o yaml: in full")
    _watches(p, "without NAME: then print each employee again as it changes")
    p.add_argument("name", nargs="?")
    p = add("list", employees.cmd_list, "every employee and its live generation")
    _watches(p, "then print each employee again as it changes")
    p = add(
        "describe",
        employees.cmd_describe,
        "one employee in full: generation, degraded, attention, timeline, what waits",
    )
    p.add_argument("name")
    for action, text in [
        ("start", "start a new generation"),
        ("stop", "pause the live generation (running turns stop at their next step)"),
        ("resume", "resume a paused generation"),
        ("reset", "retire the live generation (start makes a new one)"),
        ("interrupt", "stop a conversation's running lower-class turn at its next step"),
    ]:
        p = _waits(add(action, employees.cmd_lifecycle, text))
        p.add_argument("name")
        if action == "interrupt":
            hint = "<lane>/<thread> (default: the owner's chat, talk/main)"
            p.add_argument("--conversation", default="talk/main", help=hint)
    deleting = "delete an employee that does not run (stop it first); its history stays"
    p = _waits(add("delete", employees.cmd_delete, deleting))
    p.add_argument("name")
    p = _waits(add("limits", employees.cmd_limits, "set the live generation's limits"))
    p.add_argument("name")
    p.add_argument("--daily-usd", type=float, required=True, help="daily budget in USD")
    _waits(add("rearm", employees.cmd_rearm, "re-arm Temporal from the database"))


def _chat_commands(add: operator.Add) -> None:
    p = add("chat", chat.cmd_chat, "send the owner's message (queued; answers 'queued')")
    p.add_argument("name")
    p.add_argument("text")
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for the reply and print it (exit 7: held for approval)",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds --wait waits (60)")
    p.add_argument("--session", help="chat session (default: the owner's main session)")
    p.add_argument("--id", help="client message id (default: a fresh one; resend to dedupe)")
    p = add("users", chat.cmd_users, "add, list or remove users (admin token; a user token chats)")
    p.add_argument("action", nargs="?", choices=["list", "add", "remove"], default="list")
    p.add_argument("name", nargs="?", help="the user's name (add, remove)")
    p.add_argument(
        "--class",
        dest="klass",
        choices=["c1", "c2"],
        help="add: the user's chat class (c2, the default; c1 is the owner's)",
    )
    p.add_argument("--daily-usd", type=float,
                   help="add: the user's daily spend cap per employee (default: a quarter of "
                        "the employee's daily budget)")  # fmt: skip


def _send_commands(add: operator.Add) -> None:
    p = add("approvals", sends.cmd_approvals, "list approvals, or approve or decline one")
    p.add_argument("action", nargs="?", choices=["list", "approve", "decline"], default="list")
    p.add_argument("id", nargs="?", help="the approval to decide")
    p.add_argument("--state", choices=["pending", "approved", "declined", "expired"],
                   help="only approvals in this state")  # fmt: skip
    p = add("outbox", sends.cmd_outbox, "list the outbox, or retry an unknown or failed send")
    p.add_argument("action", nargs="?", choices=["list", "retry"], default="list")
    p.add_argument("id", nargs="?", help="the row to retry")
    p.add_argument(
        "--status",
        help="only rows in this status",
        choices=["held", "queued", "sending", "sent", "failed", "unknown", "expired"],
    )
    p.add_argument("--employee", help="only this employee's rows")


def _timeline_commands(add: operator.Add) -> None:
    p = add("timeline", timeline.cmd_timeline, "what happened to an employee's work, oldest first")
    p.add_argument("name")
    p.add_argument("--chain", help="only this chain (an event and what it caused)")
    p.add_argument("--thread", help="only this thread (main, t_…, peer_…)")
    p.add_argument("--kind", help="a family (input, turn, reply, alarm, task, tool, attention) "
                   "or kinds (turn.done), comma-separated")  # fmt: skip
    p.add_argument("--since", help="from this time (ISO 8601 with an offset)")
    p.add_argument("--until", help="before this time (ISO 8601 with an offset)")
    p.add_argument("--limit", type=int, default=50, help="entries of the latest page (50)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="then print new entries as they happen")  # fmt: skip
    _watches(p, "the same as --follow")
    p = add("waiting", timeline.cmd_waiting, "every input not consumed yet and what holds it")
    p.add_argument("name")
    p.add_argument("--limit", type=int, help="inputs listed (50; at most 200)")


def build_parser() -> argparse.ArgumentParser:
    """The `eventosctl` parser: one subcommand per owner action."""
    common = _common()
    parser = argparse.ArgumentParser(
        prog="eventosctl", description="Drive an Event OS instance.", parents=[common]
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, func: Command, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        p.set_defaults(func=func)
        return p

    _employee_commands(add)
    _chat_commands(add)
    _send_commands(add)
    operator.add_commands(add)
    _timeline_commands(add)
    p = add("migrate", migrate.cmd_migrate, "apply the database migrations")
    p.add_argument("--database-url", help="(or EVENTOS_DATABASE_URL, else the stack's database)")
    p.add_argument("--wait", type=float, default=0.0, metavar="S",
                   help="keep trying to reach the database for S seconds (default 0)")  # fmt: skip
    upgrade.add_command(add)
    backups.add_commands(add)
    p = add("completion", completion.cmd_completion, "print a shell completion script")
    p.add_argument("shell", choices=completion.SHELLS)
    p.set_defaults(parser=parser)  # the parser the script completes
    return parser


def _refused(exc: OwnerApiError) -> int:
    """Print the API's refusal; its exit code."""
    if exc.status == 401:
        text = "the instance refused the token (401); check --token or EVENTOS_ADMIN_TOKEN"
    else:
        text = f"{exc} ({exc.status})"
    print(f"error: {text}", file=sys.stderr)
    for path, message in exc.errors:
        print(f"  {path}: {message}", file=sys.stderr)
    if exc.status in (401, 403):
        return EXIT_UNAUTHORIZED
    return EXIT_NOT_FOUND if exc.status == 404 else EXIT_FAILED


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; its errors on stderr; its exit code."""
    func: Command = args.func
    try:
        return func(args)
    except KeyboardInterrupt:  # how a watch or a follow ends
        watching = getattr(args, "watch", False) or getattr(args, "follow", False)
        return EXIT_OK if watching else 130
    except OwnerApiError as exc:
        return _refused(exc)
    except InstanceTimeout as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except InstanceUnreachable as exc:
        print(f"error: no local instance answers at {exc.url}; {START_HINT}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (StreamDropped, Unreachable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except EventOSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code."""
    protect_logs()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return run(args)
