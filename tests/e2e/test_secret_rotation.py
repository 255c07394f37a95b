"""Secrets rotate on a running instance without a restart (issue 29 point 6), the six services
as processes: while providers keep signing webhooks (every scheme) and a client keeps calling
the owner API, the operator rewrites the webhook secrets' files, the admin token's file and a
Telegram bot's credential file. Nothing the overlap window should accept is refused, an event
signed with a previous secret is marked so, the new values work at once, the old ones are
refused once the (short, configured) window is over, the Telegram reader goes on with the new
token, and every service is the process it was."""

from __future__ import annotations

import itertools
import json
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from conftest import ADMIN_TOKEN, E2E_TIMEOUT_S
from signing import signed
from stack import Owner, Stack, base_env, one, rows, until
from test_channel_faults import FakeInThread, telegram, temporal  # noqa: F401 (fixtures)

from eventos.local.temporal_dev import TemporalDevServer
from eventos.settings import DatabaseSettings

pytestmark = [pytest.mark.stack, pytest.mark.timeout(E2E_TIMEOUT_S)]

NAME = "rotor"
ACCOUNT = "tg-rot"
OVERLAP_S = 20  # long enough for the checks made inside it on a loaded machine
# path: (scheme, secret file); the secrets' names are those the suite's operator declared.
HOOKS = {
    "r-header": ("header", "plain-token"),
    "r-hmac": ("hmac-sha256", "deploy-hook"),
    "r-stripe": ("stripe", "stripe-whsec"),
    "r-github": ("github", "github-hook"),
    "r-std": ("standard-webhooks", "std-hook"),
    "r-meta": ("whatsapp-business", "meta-app"),
}
OLD = {ref: f"old-{ref}-0123456789" for _, ref in HOOKS.values()}
NEW = {ref: f"new-{ref}-9876543210" for _, ref in HOOKS.values()}
NEW_ADMIN = "rotated-admin-token-0123456789"
HEADERS = {"header": "X-Token", "hmac-sha256": "X-Signature"}
SPEC = f"""
apiVersion: eventos/v1
kind: Employee
metadata: {{name: {NAME}}}
spec:
  agents: [{{name: front, model: {{provider: local, name: scripted}}, system: You help.}}]
  triggers:
    - {{kind: telegram, account: {ACCOUNT}}}
""" + "".join(
    f"    - {{kind: webhook, path: {path}, verify: {{scheme: {scheme}, secret: {ref}"
    + (f", header: {HEADERS[scheme]}" if scheme in HEADERS else "")
    + "}"
    + (", dedupe_header: X-Request-Id" if scheme == "header" else "")
    + "}\n"
    for path, (scheme, ref) in HOOKS.items()
)
SERIAL = itertools.count()


def write_secret(folder: Path, name: str, value: str) -> None:
    """Replace the file at once, as the kubelet swaps a mounted Secret's files."""
    staged = folder / f".{name}.new"
    staged.write_text(value + "\n")
    os.replace(staged, folder / name)


def hook(url: str, path: str, secret: str) -> int:
    """One webhook to `path` signed with `secret`; its answer's status."""
    scheme, _ = HOOKS[path]
    event = f"evt_{next(SERIAL)}_{uuid.uuid4().hex[:8]}"
    body = json.dumps({"id": event, "object": "event", "type": "rotation.test"}).encode()
    headers = {"content-type": "application/json", **signed(scheme, secret, body, event)}
    return httpx.post(f"{url}/hooks/{path}", content=body, headers=headers, timeout=15).status_code


def owner_call(url: str, token: str) -> int:
    auth = {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{url}/v1/employees/{NAME}", headers=auth, timeout=15).status_code


@dataclass(eq=False)  # a thread is hashed by identity
class Traffic(threading.Thread):
    """Providers signing every webhook and a client calling the owner API, in a loop, each with
    the values of `using` (switched by the test); every answer kept."""

    url: str
    using: str = "old"
    answers: list[tuple[str, str, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            using = self.using
            secrets, token = (OLD, ADMIN_TOKEN) if using == "old" else (NEW, NEW_ADMIN)
            for path, (_, ref) in HOOKS.items():
                self.answers.append((using, path, hook(self.url, path, secrets[ref])))
            self.answers.append((using, "owner-api", owner_call(self.url, token)))
            self.stop.wait(0.05)  # a steady trickle, not a flood of one provider's limit

    def rounds(self) -> int:
        return len(self.answers) // (len(HOOKS) + 1)

    def refused(self) -> list[tuple[str, str, int]]:
        return [a for a in self.answers if a[2] != 200]


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "secrets"
    folder.mkdir(mode=0o700)
    for ref, value in OLD.items():
        write_secret(folder, ref, value)
    return folder


@pytest.fixture
def admin_dir(tmp_path: Path) -> Path:
    """The admin token's own mount, as the chart's (not among the employees' secrets)."""
    folder = tmp_path / "admin"
    folder.mkdir(mode=0o700)
    write_secret(folder, "token", ADMIN_TOKEN)
    return folder


@pytest.fixture
def stack(db_settings: DatabaseSettings, temporal: TemporalDevServer, telegram: FakeInThread,
          secrets_dir: Path, admin_dir: Path, tmp_path: Path) -> Iterator[Stack]:  # fmt: skip
    bot = telegram.call(telegram.fake.add_bot, "rotor_bot")
    write_secret(secrets_dir, ACCOUNT, bot)
    env = base_env(db_settings.url, temporal.address, temporal.namespace, tmp_path / "blobs")
    del env["EVENTOS_ADMIN_TOKEN"]  # the file form, which rotates
    env.update({
        "EVENTOS_ADMIN_TOKEN_FILE": str(admin_dir / "token"),
        "EVENTOS_SECRETS_DIR": str(secrets_dir),
        "EVENTOS_SECRETS_OVERLAP_S": str(OVERLAP_S), "EVENTOS_SECRETS_RECHECK_S": "0.2",
        "EVENTOS_CHANNELS_TELEGRAM_API": telegram.fake.base_url,
        "EVENTOS_CHANNELS_POLL_TIMEOUT_S": "1", "EVENTOS_CHANNELS_REFRESH_S": "1",
    })  # fmt: skip
    with Stack(env, tmp_path) as running:
        Owner(running.ingress_url).apply_and_start(SPEC, NAME)
        yield running


def marked_previous(url: str) -> set[str]:
    """The paths with an event verified by a rotated secret's previous value."""
    found = rows(url, "SELECT DISTINCT path FROM bus_ingress "
                      "WHERE envelope->>'verifiedwith' = 'previous'")  # fmt: skip
    return {r["path"] for r in found}


def telegram_rows(url: str) -> int:
    return int(one(url, "SELECT count(*) FROM bus_ingress WHERE source_key = %(s)s",
                   {"s": f"telegram:{ACCOUNT}"}))  # fmt: skip


def previous_counted(url: str) -> float:
    """eventos_webhook_previous_secret_total as ingress's /metrics serves it."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("eventos_webhook_previous_secret_total "):
            return float(line.split()[1])
    raise AssertionError("ingress serves no eventos_webhook_previous_secret_total")


def replies(telegram: FakeInThread, token: str) -> list[object]:
    """What the bot sent the customer (its messages stay with it across a revoke)."""
    return list(telegram.call(telegram.fake.sent, token, 4242))


def test_secrets_rotate_while_traffic_flows_and_no_service_restarts(
    stack: Stack, telegram: FakeInThread, secrets_dir: Path, admin_dir: Path,
    db_settings: DatabaseSettings,
) -> None:  # fmt: skip
    url, db = stack.ingress_url, db_settings.url
    pids = {name: proc.proc.process.pid for name, proc in stack.procs.items() if proc.proc.process}
    bot = (secrets_dir / ACCOUNT).read_text().strip()
    telegram.call(telegram.fake.customer_message, bot, 4242, "before the rotation")
    until(lambda: telegram_rows(db) == 1, 60, "the message before the rotation read", stack)
    until(lambda: len(replies(telegram, bot)) == 1, 90, "its reply sent (egress)", stack)
    traffic = Traffic(url)
    traffic.start()
    try:
        until(lambda: traffic.rounds() >= 2, 60, "traffic flowing with the old values", stack)

        # The operator rotates every secret while the old values are still in use.
        for ref, value in NEW.items():
            write_secret(secrets_dir, ref, value)
        write_secret(admin_dir, "token", NEW_ADMIN)
        rotated_at = len(traffic.answers)

        # Within the window: the new values work at once, the old ones still pass, marked.
        for path, (_, ref) in HOOKS.items():
            until(lambda p=path, r=ref: hook(url, p, NEW[r]) == 200, 30, f"{path}: new", stack)
        until(lambda: owner_call(url, NEW_ADMIN) == 200, 30, "the new admin token", stack)
        until(lambda: marked_previous(db) == set(HOOKS), 30, "old signatures marked", stack)
        assert traffic.refused() == [], "refused within the overlap window"
        assert len(traffic.answers) > rotated_at  # the old values were in use after it

        # The providers and the client switch; past the window the old values are refused.
        traffic.using = "new"
        for path, (_, ref) in HOOKS.items():
            until(lambda p=path, r=ref: hook(url, p, OLD[r]) == 401, OVERLAP_S + 60,
                  f"{path}: old refused after the window", stack)  # fmt: skip
        until(lambda: owner_call(url, ADMIN_TOKEN) == 401, 30, "old admin token refused", stack)
        switched = len(traffic.answers)
        until(lambda: len(traffic.answers) > switched + 2 * (len(HOOKS) + 1), 60,
              "traffic on the new values past the window", stack)  # fmt: skip
    finally:
        traffic.stop.set()
        traffic.join(30)
    assert traffic.refused() == [], "refused a value the overlap or the rotation should accept"
    assert previous_counted(url) >= len(HOOKS)  # the metric an operator alerts on

    # A channel credential: the bot's token is revoked and its file rewritten; the reader (in
    # ingress, no restart) reads on with the new one ...
    new_bot = telegram.call(telegram.fake.revoke, bot)
    write_secret(secrets_dir, ACCOUNT, new_bot)
    telegram.call(telegram.fake.customer_message, new_bot, 4242, "after the rotation")
    until(lambda: telegram_rows(db) == 2, 60, "the message after the rotation read", stack)
    # ... and egress, another process, sends the reply with the new token.
    until(lambda: len(replies(telegram, new_bot)) == 2, 90, "the reply after it sent", stack)

    after = {name: proc.proc.process.pid for name, proc in stack.procs.items() if proc.proc.process}
    assert after == pids
    assert all(proc.proc.exit_code() is None for proc in stack.procs.values()), stack.logs()
    log = stack["ingress"].proc.log_path.read_text()
    assert "'stripe-whsec' rotated" in log and "'admin token' rotated" in log
    assert "/hooks/r-stripe was signed with the previous value" in log
    values = (*OLD.values(), *NEW.values(), ADMIN_TOKEN, NEW_ADMIN, bot, new_bot)
    assert not any(value in log for value in values), "a secret's value in the log"
