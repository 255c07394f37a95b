"""EG16 on the cluster (issue 29): tier S installed by the chart with its weekly upgrade CronJob
(target: the same images under another tag, loaded into the cluster's runtime) and its daily
backup CronJob (to a volume), under a steady webhook load.

1. The upgrade CronJob's Job with `--inject-readiness-failure` (made from the CronJob as `kubectl
   create job --from` does, its args extended) exits 6 `rolled_back`: every service pod back on
   the old tag and Ready, every acknowledged event consumed once, none appended twice.
2. The CronJob's Job as it is (`kubectl create job --from=cronjob/…`) exits 0 `upgraded`: every
   service pod on the new tag and Ready, and the events go on being consumed once.
3. The backup CronJob's Job writes a backup, and `eventosctl restore` in a Job made from it
   restores it: the events acknowledged before the backup are there once and consumed.

Each Job's output (the outcome JSON) is printed: read with -rP.

    EVENTOS_K8S_REUSE=1 .venv/bin/pytest -q -m k8s -p no:xdist tests/k8s/test_upgrade_on_cluster.py -rP
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from k8s_release import IMAGE_VALUES, Release, chat
from psycopg.rows import dict_row

from eventos import names
from eventos.testing import wait_for_sync
from eventos.testing.webhooks import WebhookSender

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(1800)]
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once

NAMESPACE = "eventos-upgrade"
NAME = "up"
PREFIX = f"{NAME}-eventos"
CLAIM = "backups"
SERVICES = ("ingress", "router", "relay", "workers-workflow", "workers-llm", "egress")
JOB_S = 900.0  # one upgrade Job, rollback included, on a loaded node
DRILL_READY_S = "45"  # how long the drilled target has to answer ready (it never does)
CONSUMED_S = 240.0


def tags() -> tuple[str, str]:
    """The tag `make images` built, and the one the test loads the same images under."""
    current = json.loads(IMAGE_VALUES.read_text())["image"]["tag"]
    return current, f"{current}-next"


def tag_the_next(cluster: Cluster) -> None:
    """The service images `make images` built, in the cluster's runtime under the next tag too."""
    current, following = tags()
    listed: dict[str, str] = json.loads((IMAGE_VALUES.parent / "images.json").read_text())
    for ref in listed:
        name, _, tag = ref.rpartition(":")
        if tag == current and name.rsplit("/", 1)[-1] in SERVICES:
            cluster.run_cluster("tag", ref, f"{name}:{following}")


@pytest.fixture(scope="module")
def release(cluster: Cluster) -> Iterator[Release]:
    """Tier S with the upgrade CronJob (target: the next tag) and the backup CronJob (to a
    claim), the `hello` employee started; removed with its namespace at the end."""
    tag_the_next(cluster)
    up = Release(cluster, NAME, NAMESPACE, "S")
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
             "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                      "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    try:
        install(up, claim)
        chat(up, "hello before the upgrades")
        yield up
    finally:
        print(up.kubectl("get", "pods,jobs", "-o", "wide", check=False))
        up.uninstall()


def install(up: Release, claim: dict[str, Any]) -> None:
    """The chart with both CronJobs; the backups' claim made with the Secrets (after the
    namespace, before the chart)."""
    _, following = tags()
    original = up.create_secrets

    def secrets_and_claim() -> None:
        original()
        up.kubectl("apply", "-f", "-", input=json.dumps(claim))

    up.create_secrets = secrets_and_claim
    up.install(
        "upgrades.enabled=true", f"upgrades.targetTag={following}", "upgrades.readySeconds=240",
        "backups.enabled=true", f"backups.store=file:///backups/{NAME}",
        f"backups.volume.existingClaim={CLAIM}",
    )  # fmt: skip


def hook_url(up: Release) -> str:
    return f"http://{up.service_ip('ingress')}:8080/hooks/hello"


def job_from_cronjob(
    up: Release, cronjob: str, job: str, extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None, args: list[str] | None = None,
) -> None:  # fmt: skip
    """A Job from the CronJob's template as `kubectl create job --from=cronjob/…` makes it (its
    annotation and owner), its container's args extended by `extra_args` (or replaced by
    `args`) and `env` added."""
    found = json.loads(up.kubectl("get", "cronjob", cronjob, "-o", "json"))
    template = found["spec"]["jobTemplate"]
    container = template["spec"]["template"]["spec"]["containers"][0]
    container["args"] = (args or container["args"]) + list(extra_args)
    container["env"] = [e for e in container.get("env", []) if e["name"] not in (env or {})]
    container["env"] += [{"name": k, "value": v} for k, v in (env or {}).items()]
    body = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job, "labels": template["metadata"].get("labels", {}),
                     "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob",
                                          "name": cronjob, "uid": found["metadata"]["uid"],
                                          "controller": True, "blockOwnerDeletion": True}]},
        "spec": template["spec"],
    }  # fmt: skip
    up.kubectl("create", "-f", "-", input=json.dumps(body))


def job_result(up: Release, job: str, container: str, timeout_s: float = JOB_S) -> tuple[int, str]:
    """The exit code of the Job's pod and its container's log, once it ended."""

    def ended() -> int | None:
        pods = json.loads(up.kubectl("get", "pods", "-l", f"job-name={job}", "-o", "json"))
        for pod in pods["items"]:
            for status in pod["status"].get("containerStatuses", []):
                done = status["state"].get("terminated")
                if status["name"] == container and done:
                    return int(done["exitCode"]) + 1  # 0 is falsy
        return None

    ended_with = wait_for_sync(ended, timeout=timeout_s, interval=2, what=f"Job {job} ended")
    assert ended_with is not None
    code = ended_with - 1
    return code, up.kubectl("logs", f"job/{job}", "-c", container)


def outcome_of(log: str) -> dict[str, Any]:
    """The outcome JSON `-o json` printed last."""
    start = log.rfind("\n{")
    doc: dict[str, Any] = json.loads(log[start + 1 if start >= 0 else log.index("{") :])
    return doc


def service_pods(up: Release) -> dict[str, tuple[str, bool]]:
    """Each service pod: its image's tag and whether it is Ready (the Jobs' pods left out)."""
    found = {}
    for pod in up.pods():
        owners = {o["kind"] for o in pod["metadata"].get("ownerReferences", [])}
        (container, *_) = pod["spec"]["containers"]
        if "ReplicaSet" not in owners or container["name"] not in SERVICES:
            continue
        conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        ready = conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp")
        found[pod["metadata"]["name"]] = (container["image"].rpartition(":")[2], ready)
    return found


def every_service_on(up: Release, tag: str) -> bool:
    pods = service_pods(up)
    services = {n.rsplit("-", 2)[0].removeprefix(f"{PREFIX}-") for n in pods}
    return len(services) == len(SERVICES) and all(p == (tag, True) for p in pods.values())


@contextlib.contextmanager
def database(up: Release) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    password = up.secret("postgresql", "password")
    with up.forward("postgresql", 5432) as port:
        url = f"postgresql://postgres:{password}@127.0.0.1:{port}/eventos"
        with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
            yield conn


def consumed_once(up: Release, event_ids: list[str]) -> None:
    """Every acknowledged event appended once, routed once and its delivery consumed."""
    keys = [f"h:{e}" for e in event_ids]
    query = ("SELECT i.dedupe_key, i.status, array_agg(d.status) AS deliveries FROM bus_ingress i "
             "LEFT JOIN bus_deliveries d ON d.ingress_id = i.id "
             "WHERE i.dedupe_key = ANY(%(ids)s) GROUP BY i.id, i.dedupe_key, i.status")  # fmt: skip
    with database(up) as conn:

        def settled() -> list[dict[str, Any]] | None:
            found = conn.execute(query, {"ids": keys}).fetchall()
            appended = [r["dedupe_key"] for r in found]
            assert len(appended) == len(set(appended)), "an event appended twice"
            assert all(len(r["deliveries"]) == 1 for r in found), f"routed twice: {found}"
            done = sorted(appended) == sorted(keys) and all(
                r["status"] == "routed" and r["deliveries"] == ["done"] for r in found
            )
            return found if done else None

        try:
            wait_for_sync(settled, timeout=CONSUMED_S, interval=2,
                          what=f"the {len(keys)} acknowledged events consumed once")  # fmt: skip
        except AssertionError as exc:
            rows = conn.execute(query, {"ids": keys}).fetchall()
            missing = sorted(set(keys) - {r["dedupe_key"] for r in rows})
            raise AssertionError(f"{exc}\nnever appended: {missing}\n"
                                 f"{[r for r in rows if r['deliveries'] != ['done']]}") from None  # fmt: skip


def steps(outcome: dict[str, Any]) -> dict[str, bool]:
    return {s["name"]: s["ok"] for s in outcome["steps"]}


def upgrade_under_load(
    up: Release, job: str, create: Callable[[], object]
) -> tuple[int, dict[str, Any], list[str]]:
    """The upgrade Job `job` (`create` makes it) while webhooks are posted before, during and
    after it; its exit code, its outcome and the events acknowledged."""
    sender = WebhookSender(lambda: hook_url(up), job, interval_s=1.0).start(3, timeout_s=120)
    started = time.monotonic()
    try:
        create()
        code, log = job_result(up, job, "upgrade")
        print(f"{job}: exit {code} after {time.monotonic() - started:.0f} s\n{log}")
        sender.wait_acked(3, timeout_s=180)  # the instance takes events again
    finally:
        acked = sender.stop()
    return code, outcome_of(log), acked


def test_eg16_the_upgrade_cronjob_drilled_rolls_back_by_itself(release: Release) -> None:
    current, following = tags()
    assert every_service_on(release, current)
    drill = ("--inject-readiness-failure",)
    code, outcome, acked = upgrade_under_load(release, "upgrade-drill", lambda: job_from_cronjob(
        release, f"{PREFIX}-upgrade", "upgrade-drill", drill,
        {"EVENTOS_UPGRADE_READY_S": DRILL_READY_S}))  # fmt: skip

    assert (code, outcome["outcome"]) == (6, "rolled_back"), outcome
    assert (outcome["from"], outcome["to"]) == (current, following)
    assert steps(outcome)["ready"] is False and steps(outcome)["rollback_ready"] is True
    assert "start_workers" not in steps(outcome)  # the drilled workers never polled
    assert outcome["restored"] is False  # no migration, no workflow task on the target
    assert every_service_on(release, current), service_pods(release)
    consumed_once(release, acked)
    with database(release) as conn:
        items = conn.execute("SELECT kind, ref FROM attention_items WHERE kind = %(k)s",
                             {"k": names.ATTENTION_UPGRADE_ROLLED_BACK}).fetchall()  # fmt: skip
    assert items == [{"kind": "upgrade_rolled_back", "ref": f"upgrade:{following}"}]
    print(f"{len(acked)} events acknowledged around the drill, each consumed once")


def test_the_upgrade_cronjob_moves_every_service_to_the_new_tag(release: Release) -> None:
    _, following = tags()
    from_cronjob = ("create", "job", f"--from=cronjob/{PREFIX}-upgrade", "upgrade-now")
    code, outcome, acked = upgrade_under_load(
        release, "upgrade-now", lambda: release.kubectl(*from_cronjob)
    )

    assert (code, outcome["outcome"]) == (0, "upgraded"), outcome
    assert all(s["ok"] for s in outcome["steps"]), outcome
    assert outcome["replayed"] >= 1 and outcome["needs_reset"] == []  # hello's supervisor
    assert every_service_on(release, following), service_pods(release)
    consumed_once(release, acked)
    print(f"{len(acked)} events acknowledged around the upgrade, each consumed once")


def test_the_backup_cronjob_writes_a_backup_that_restore_restores(release: Release) -> None:
    acked = WebhookSender(lambda: hook_url(release), "backup").start(3, timeout_s=120).stop()
    consumed_once(release, acked)
    release.kubectl("create", "job", f"--from=cronjob/{PREFIX}-backup", "backup-now")
    code, log = job_result(release, "backup-now", "backup", timeout_s=600)
    print(f"backup: exit {code}\n{log}")
    assert code == 0, log
    found = re.search(r"backup (\d{8}T\d{9}Z-[0-9a-f]{6}):", log)
    assert found, log
    backup_id = found.group(1)
    job_from_cronjob(release, f"{PREFIX}-backup", "restore-now",
                     args=["eventosctl", "restore", backup_id, "--yes", "-o", "json"])  # fmt: skip
    code, log = job_result(release, "restore-now", "backup", timeout_s=600)
    print(f"restore: exit {code}\n{log}")
    assert code == 0, log
    report = outcome_of(log)
    assert report["backup"]["id"] == backup_id and report["databases"] == ["app"]
    # The CronJob's pod reads the services' config: the manifest names the release that took
    # it (the chart's values: the upgrader moved the Deployments only, docs/upgrades.md), and
    # the restore reconciled Temporal (hello's supervisor run, orphaned, terminated).
    assert report["backup"]["release"]["image_tag"] == tags()[0], report["backup"]
    assert report["reconcile"]["runs_terminated"] >= 1, report["reconcile"]
    consumed_once(release, acked)  # what was acknowledged before the backup is there, once
    wait_for_sync(lambda: every_service_on(release, tags()[1]) or None, timeout=300,
                  what="every service Ready after the restore")  # fmt: skip
