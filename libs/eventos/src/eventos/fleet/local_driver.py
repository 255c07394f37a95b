"""The upgrader's driver of a local instance (`make run`): the `Instance` of eventos.fleet.upgrade.

It reads the instance's `stack.json`, installs a target checkout beside the current release
(eventos.fleet.releases), asks the running instance to stop and start its services on a release
through the release request (which `make run` applies and acknowledges in stack.json), runs the
target's migrations and replay gate in the target's own environment, and reads every service's
`/readyz` for the release that answers. At tier L it moves the instance's Temporal server too:
the target's `temporal-sql-tool` updates Temporal's databases (the upgrader runs it), and the
release request names the server build to run (`make run` restarts the server on it); the build
is `.tools/temporal-server/v<version>` of the target's checkout, else of the instance's own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from eventos.fleet import checks, releases
from eventos.fleet.backups import restore_backup, take_backup
from eventos.fleet.pgtools import with_database
from eventos.fleet.releases import LocalRelease, ReleaseRequest, TemporalPin
from eventos.fleet.temporal_sql import SqlLogin, SqlToolError, update_schema
from eventos.fleet.upgrade import GateReport, NeedsReset, ReleaseRef, UpgradeError
from eventos.settings import (
    BACKUP_STORE_VAR,
    DRILL_READINESS_FAILURE_VAR,
    TEMPORAL_BUILDS,
    BackupSettings,
    TemporalSettings,
    UpgradeSettings,
)

POLL_S = 0.2
PROBE_TIMEOUT_S = 6.0  # one /readyz answer (the service's checks take up to 5 s)
# Asks a release's own Python which release it is (runtime/build: what its /readyz will name).
RELEASE_OF = ("import json; from eventos.runtime.build import running_release; "
              "print(json.dumps(running_release().as_json()))")  # fmt: skip
# A rollback's restore asks the relay to re-arm Temporal while the services are stopped: it does
# not wait for it (the previous release's relay applies it when it starts).
REARM_WAIT_S = 1.0
# Temporal's databases at tier L, as eventos.local.temporal_server names them (as `backup`).
TIER_L_DATABASES = {
    "EVENTOS_BACKUP_TEMPORAL_DATABASE_URL": "temporal",
    "EVENTOS_BACKUP_TEMPORAL_VISIBILITY_DATABASE_URL": "temporal_visibility",
}
TEMPORAL_SCHEMAS = {"main": "temporal", "visibility": "temporal_visibility"}  # by schema kind
# A request that restarts the Temporal server waits for its start (TemporalServer.start's
# deadline, 90 s), on top of the services' stop.
TEMPORAL_START_S = 120.0


@dataclass
class LocalInstance:
    """A running `make run` instance, found by its stack.json."""

    stack_file: Path
    settings: UpgradeSettings = field(default_factory=UpgradeSettings)
    known: dict[str, LocalRelease] = field(default_factory=dict)  # by ReleaseRef.name
    running: set[str] = field(default_factory=set)
    last: ReleaseRef | None = None  # the release the last request named
    builds: dict[str, Path] = field(default_factory=dict)  # Temporal builds by ReleaseRef.name
    snapshots: dict[str, TemporalPin] = field(default_factory=dict)  # the server of each

    @property
    def state_dir(self) -> Path:
        return self.stack_file.parent

    def stack(self) -> dict[str, Any]:
        try:
            doc: dict[str, Any] = json.loads(self.stack_file.read_text())
        except (OSError, ValueError) as exc:
            raise UpgradeError(f"cannot read {self.stack_file}: {exc}") from None
        return doc

    @property
    def database_url(self) -> str:
        return str(self.stack()["database"]["url"])

    @property
    def tier_l(self) -> bool:
        return bool(self.stack()["temporal"].get("tier") == "L")

    def _temporal(self) -> TemporalSettings:
        t = self.stack()["temporal"]
        return TemporalSettings(address=str(t["address"]), namespace=str(t["namespace"]))

    def _pin(self) -> TemporalPin | None:
        """The Temporal server build the instance runs now; None unless it runs its own tier L
        server (at tier S, or given TEMPORAL_ADDRESS, Temporal is not the upgrader's to move)."""
        t = self.stack()["temporal"]
        if t.get("tier") != "L" or not t.get("version"):
            return None
        return TemporalPin(str(t["version"]), str(t["build"]))

    def _env(self) -> dict[str, str]:
        t = self.stack()["temporal"]
        return {
            **os.environ,
            "EVENTOS_DATABASE_URL": self.database_url,
            "TEMPORAL_ADDRESS": str(t["address"]),
            "TEMPORAL_NAMESPACE": str(t["namespace"]),
        }

    # -- releases ------------------------------------------------------------------------

    async def current(self) -> ReleaseRef:
        doc = self.stack()
        pinned = (doc.get("release") or {}).get("release")
        python = str(doc["python"])  # the instance's own: its checkout holds its .venv
        own = LocalRelease("own", str(Path(python).parents[2]), python)
        local = LocalRelease.from_json(pinned) if pinned else own
        self.running = {base(n) for n, s in doc["services"].items() if not s.get("held")}
        temporal = self._pin()
        self.last = await self._ref(local, temporal.version if temporal else "")
        if temporal is not None:
            self.builds[self.last.name] = Path(temporal.build)
        return self.last

    async def install(self, target: str) -> ReleaseRef:
        uv = releases.find_uv(self.settings.uv)
        local = await asyncio.to_thread(releases.install, Path(target), self.state_dir, uv,
                                        self.settings.install_s)  # fmt: skip
        now, pinned = self._pin(), ""
        if now is not None:
            pinned = releases.makefile_pin(Path(local.checkout), releases.TEMPORAL_PIN)
        ref = await self._ref(local, pinned)
        if now is not None and pinned and pinned != now.version:
            self._build(ref)  # a build to move to, before anything changes
        return ref

    async def _ref(self, local: LocalRelease, temporal: str) -> ReleaseRef:
        out = await self._run(local, ["-c", RELEASE_OF], "reading the release", 120.0)
        rel = json.loads(out)
        ref = ReleaseRef(name=f"{rel['version']}+{rel['build']}", source=local.checkout,
                         build=str(rel["build"]), migrations=int(rel["migrations"]),
                         temporal=temporal)  # fmt: skip
        self.known[ref.name] = local
        return ref

    def _build(self, release: ReleaseRef) -> Path:
        """The Temporal server build of `release.temporal`: the one the instance ran it from,
        else the release checkout's `.tools`, else the instance's own checkout's."""
        if release.name in self.builds:
            return self.builds[release.name]
        folder = Path(TEMPORAL_BUILDS) / f"v{release.temporal}"
        own = Path(str(self.stack()["python"])).parents[2]
        places = [Path(release.source) / ".tools" / folder, own / ".tools" / folder]
        found = next((p for p in places if (p / "bin").is_dir()), None)
        if found is None:
            raise UpgradeError(f"no Temporal server {release.temporal} built in "
                               f"{' or '.join(map(str, places))}: `make test` builds the "
                               f"previous minor, `make tools` the pinned one")  # fmt: skip
        self.builds[release.name] = found
        return found

    async def _run(self, local: LocalRelease, args: list[str], what: str, timeout: float) -> str:
        argv = [local.python, *args]
        try:
            return await asyncio.to_thread(releases.run, argv, self.state_dir.parent,
                                           self._env(), timeout, what)  # fmt: skip
        except releases.ReleaseError as exc:
            raise UpgradeError(str(exc)) from None

    # -- the services --------------------------------------------------------------------

    async def _request(
        self,
        release: ReleaseRef,
        run: set[str],
        env: dict[str, str],
        temporal: TemporalPin | None = None,
    ) -> None:
        """Write a release request and wait until the instance says it applied it. The
        Temporal server stays as the previous request named it unless `temporal` is given."""
        current = (self.stack().get("release") or {}).get("serial", 0)
        asked = releases.read_request(self.state_dir)
        serial = max(int(current), asked.serial if asked else 0) + 1
        pin = temporal or (asked.temporal if asked else None)
        request = ReleaseRequest(serial, self.known[release.name], env, sorted(run), pin)
        releases.write_request(self.state_dir, request)
        waits = self.settings.stop_s * 2 + 10.0 + (TEMPORAL_START_S if temporal else 0.0)
        deadline = time.monotonic() + waits
        while (self.stack().get("release") or {}).get("serial") != serial:
            if time.monotonic() > deadline:
                raise UpgradeError(f"the instance did not apply release request {serial} "
                                   f"(is `make run` supervising it?)")  # fmt: skip
            await asyncio.sleep(POLL_S)
        self.running, self.last = set(run), release

    async def stop(self) -> None:
        await self._request(self.last or await self.current(), set(), {})

    async def start(self, release: ReleaseRef, services: tuple[str, ...], drill: bool) -> None:
        env = {DRILL_READINESS_FAILURE_VAR: "1"} if drill else {}
        await self._request(release, self.running | set(services), env)

    async def ready(self, release: ReleaseRef, services: tuple[str, ...], timeout_s: float) -> None:
        urls = {n: s["http"] for n, s in self.stack()["services"].items() if base(n) in services}
        pending = dict.fromkeys(urls, "no answer yet")
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
            while pending:
                for name in list(pending):
                    said = await _readyz(client, urls[name], release.build)
                    if said is None:
                        del pending[name]
                    else:
                        pending[name] = said
                if pending and time.monotonic() > deadline:
                    said = "; ".join(f"{n}: {why}" for n, why in sorted(pending.items()))
                    raise UpgradeError(f"not ready on {release.name} after "
                                       f"{timeout_s:g}s: {said}")  # fmt: skip
                if pending:
                    await asyncio.sleep(POLL_S)

    # -- the databases -------------------------------------------------------------------

    def _backups(self) -> BackupSettings:
        """The backup settings of `eventosctl backup` on this instance: its databases (the
        app's; Temporal's two at tier L), its Temporal, the store `.eventos/backups` unless
        EVENTOS_BACKUP_STORE names one."""
        env = self._env()
        if self.tier_l:
            for var, name in TIER_L_DATABASES.items():
                env.setdefault(var, with_database(self.database_url, name))
        env.setdefault(BACKUP_STORE_VAR, (self.state_dir / "backups").absolute().as_uri())
        return dataclasses.replace(BackupSettings.from_env(env), rearm_wait_s=REARM_WAIT_S)

    async def snapshot(self) -> str:
        backup = await take_backup(self._backups(), reason="before an upgrade")
        if (now := self._pin()) is not None:
            self.snapshots[backup.id] = now
        return backup.id

    async def restore(self, snapshot: str) -> None:
        """Restore the snapshot; at tier L with the Temporal server stopped while its databases
        are replaced, then started again on the version the snapshot was taken on (the only one
        its schema is at), before Temporal is reconciled."""
        now = self._pin()
        if now is None:
            await restore_backup(self._backups(), snapshot)
            return
        taken_on = self.snapshots.get(snapshot, now)
        stopped = TemporalPin(now.version, now.build, running=False)
        await self._temporal_request(stopped)

        async def back() -> None:
            await self._temporal_request(taken_on)
            await checks.temporal_serves(self._temporal(), taken_on.version, TEMPORAL_START_S)

        await restore_backup(self._backups(), snapshot, temporal_back=back)

    async def _temporal_request(self, pin: TemporalPin) -> None:
        """Ask the instance to run its Temporal server as `pin` says (the services as they are)."""
        asked = releases.read_request(self.state_dir)
        await self._request(self.last or await self.current(), self.running,
                            asked.env if asked else {}, pin)  # fmt: skip

    async def update_temporal_schema(self, release: ReleaseRef) -> None:
        build, login = self._build(release), SqlLogin.of_url(self.database_url)
        try:
            await asyncio.to_thread(update_schema, build, login, TEMPORAL_SCHEMAS)
        except SqlToolError as exc:
            raise UpgradeError(str(exc)) from None

    async def start_temporal(self, release: ReleaseRef, timeout_s: float) -> None:
        await self._temporal_request(TemporalPin(release.temporal, str(self._build(release))))
        await checks.temporal_serves(self._temporal(), release.temporal, timeout_s)

    async def migrate(self, release: ReleaseRef) -> list[str]:
        local = self.known[release.name]
        args = ["-m", "eventos.cli", "migrate", "--database-url", self.database_url]
        out = await self._run(local, args, "migrating", self.settings.install_s)
        return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("applied ")]

    async def replay(self, release: ReleaseRef) -> GateReport:
        local = self.known[release.name]
        args = ["-m", "eventos.fleet.replay_gate", "--max-runs", str(self.settings.replay_max_runs)]
        out = await self._run(local, args, "the replay gate", self.settings.replay_s)
        # The SDK's core logs its warnings to stdout too: the report is the last line.
        lines = out.strip().splitlines()
        try:
            doc = json.loads(lines[-1])
        except (IndexError, ValueError):
            raise UpgradeError(f"the replay gate printed no report: {out[-500:]!r}") from None
        return GateReport(int(doc["replayed"]), list(doc["failed"]), bool(doc["truncated"]))

    async def generations_of(self, workflow_ids: list[str]) -> list[NeedsReset]:
        return await checks.generations_of(self.database_url, workflow_ids)

    async def workflow_task_completed_since(self, since: datetime) -> bool:
        return await checks.workflow_task_completed_since(self._temporal(), since)


def base(process: str) -> str:
    """The service a process runs (`workers-llm-c1` at tier L runs `workers-llm`)."""
    for suffix in ("-c1", "-c2", "-c3", "-c4"):
        if process.startswith("workers-llm") and process.endswith(suffix):
            return "workers-llm"
    return process


async def _readyz(client: httpx.AsyncClient, url: str, build: str) -> str | None:
    """None when the service answers ready on `build`, else what it said."""
    try:
        answer = await client.get(url + "/readyz")
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}"
    try:
        body = answer.json()
    except ValueError:
        body = None
    return checks.readyz_says(answer.status_code, body, build)
