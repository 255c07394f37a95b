"""Tier L installed by the chart on the suite's cluster and serving (issue 28, point 3): the open
source Temporal server with its schema and namespace Jobs and 64 history shards on an external
PostgreSQL (what tier L expects: a database server beside the release, here in its own
namespace), the four class LLM Deployments, every pod Ready, `helm test`, and the same tour as
tier S through the cluster. Then KEDA (installed into the cluster first, `cluster.py keda`)
scales llm-c1 out on its queue's backlog and back in (point 4; k8s_backlog.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from k8s_backlog import (
    MAX_REPLICAS,
    MIN_REPLICAS,
    STEP_SLEEP_S,
    STEPS,
    TARGET_BACKLOG,
    keda_values,
    run_load,
)
from k8s_release import Release, external_postgresql, tour

if TYPE_CHECKING:
    from k8s_cluster import Cluster

pytestmark = pytest.mark.k8s
pytest_plugins = ["k8s_cluster"]  # the session's `cluster` fixture, defined once

ROLES = ["ingress", "router", "relay", "workers-workflow", "egress"]
CLASSES = ["llm-c1", "llm-c2", "llm-c3", "llm-c4"]
DB_NAMESPACE = "eventos-tier-l-db"


@pytest.fixture(scope="module")
def keda(cluster: Cluster) -> Iterator[None]:
    """KEDA installed into the cluster for this module, removed after it."""
    try:
        cluster.run_cluster("keda")
        yield
    finally:
        cluster.run_cluster("keda-down")


@pytest.fixture(scope="module")
def tier_l(cluster: Cluster, keda: None) -> Iterator[Release]:
    release = Release(cluster, "acme", "eventos-tier-l", "L")
    try:
        release.database = external_postgresql(cluster, DB_NAMESPACE, release.image("postgres"))
        out = release.install(*keda_values())
        print(f"helm install (tier L): {release.install_s:.0f} s\n{out[-1500:]}")
        release.kubectl("wait", f"scaledobject/{release.prefix}-llm-c1", "--for=condition=Ready",
                        "--timeout=120s")  # fmt: skip
        yield release
    finally:
        release.uninstall()
        cluster.kubectl("delete", "namespace", DB_NAMESPACE, "--ignore-not-found", "--wait=true",
                        "--timeout=300s")  # fmt: skip


def test_the_notes_send_temporal_users_to_the_cli(tier_l: Release) -> None:
    print(tier_l.notes)
    assert "Web UI: none in this chart" in tier_l.notes
    assert f"port-forward svc/{tier_l.prefix}-temporal 7233:7233" in tier_l.notes


def test_every_pod_is_ready_with_one_deployment_per_class(tier_l: Release) -> None:
    print(tier_l.pod_table())
    pods = tier_l.pods()
    components = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in pods}
    assert components >= {*ROLES, *CLASSES, "temporal"}
    assert tier_l.not_ready() == []
    for cls in CLASSES:
        deployment = json.loads(tier_l.kubectl("get", "deployment", f"{tier_l.prefix}-{cls}",
                                               "-o", "json"))  # fmt: skip
        env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]
               ["containers"][0]["env"]}  # fmt: skip
        assert env["LLM_CLASS"] == cls.removeprefix("llm-")


def psql(release: Release, database: str, query: str) -> list[str]:
    """A query on the external PostgreSQL, through its pod (no policy or port-forward between)."""
    assert release.database is not None
    out = release.cluster.kubectl(
        "exec", "-n", DB_NAMESPACE, "deployment/postgresql", "--", "env",
        f"PGPASSWORD={release.database.password}",
        "psql", "-U", "postgres", "-h", "127.0.0.1", "-d", database, "-tAc", query,
    )  # fmt: skip
    return out.split()


def test_temporal_runs_64_shards_on_postgresql_with_the_namespace(tier_l: Release) -> None:
    config = tier_l.kubectl("get", "configmap", f"{tier_l.prefix}-temporal-config",
                            "-o", "jsonpath={.data.server\\.yaml}")  # fmt: skip
    assert "numHistoryShards: 64" in config
    # The schema hook Job made both databases before the install (the server starts only on a
    # schema of its version), the server owns 64 shards in them, and the namespace Job
    # registered the namespace.
    databases = set(psql(tier_l, "postgres", "SELECT datname FROM pg_database"))
    assert databases >= {"eventos", "temporal", "temporal_visibility"}
    assert psql(tier_l, "temporal", "SELECT count(*) FROM shards") == ["64"]
    assert "default" in psql(tier_l, "temporal", "SELECT name FROM namespaces")


def test_the_namespace_job_completed(tier_l: Release) -> None:
    job = json.loads(tier_l.kubectl("get", "job", f"{tier_l.prefix}-temporal-namespace-1",
                                    "-o", "json"))  # fmt: skip
    assert job["status"].get("succeeded") == 1, job["status"]


def test_helm_test_asks_every_service(tier_l: Release) -> None:
    out = tier_l.helm_test()
    print(out)
    assert "12 of 12 ready" in out


def test_the_tour_passes_through_the_cluster(tier_l: Release) -> None:
    print(tour(tier_l))


@pytest.mark.timeout(1200)  # the load, the scale-out, the drain, the scale-in
def test_keda_scales_the_class_worker_out_on_backlog_and_back_in(tier_l: Release) -> None:
    with tier_l.forward("temporal", 7233) as port:
        outcome = asyncio.run(run_load(tier_l, f"127.0.0.1:{port}"))
    samples = outcome.sampler.samples
    print(
        f"\n{outcome.sampler.deployment}: {STEPS} steps of {STEP_SLEEP_S} s, one slot a pod, "
        f"targetBacklog {TARGET_BACKLOG}, replicas {MIN_REPLICAS}..{MAX_REPLICAS}\n"
        f"{outcome.sampler.table()}"
    )
    print(f"steps run by {len(outcome.workers)} workers: {sorted(outcome.workers)}")
    assert outcome.answers == [f"[local] you said: step {i}" for i in range(STEPS)]
    assert max(s.backlog for s in samples[: samples.index(outcome.peak) + 1]) > TARGET_BACKLOG
    assert len(outcome.workers) > 1, "the pods KEDA added ran steps too"
    assert samples[-1].replicas == MIN_REPLICAS and samples[-1].backlog == 0
