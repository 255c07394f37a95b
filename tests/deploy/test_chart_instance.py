"""The instance chart's rendered output at tiers S and L (SPEC §14, §17)."""

from __future__ import annotations

import re

import charts
import pytest
import yaml
from charts import INSTANCE_CHART, TIER_FILES, Doc, RenderError, env_of, named, of_kind, pod_spec

P = "acme-eventos"
ROLES = ["ingress", "router", "relay", "workers-workflow", "egress"]
CLASSES = ["c1", "c2", "c3", "c4"]
BUNDLED = ("postgresql.bundled.enabled=true", "postgresql.existingSecret=acme-postgresql")


def args_of(doc: Doc) -> list[str]:
    container = pod_spec(doc)["containers"][0]
    return [*container.get("command", []), *container.get("args", [])]


def flag_values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def temporal_server_config(docs: list[Doc]) -> Doc:
    text = named(docs, "ConfigMap", f"{P}-temporal-config")["data"]["server.yaml"]
    # Temporal's own template expressions (password, pod IP) are filled in at start.
    loaded: Doc = yaml.safe_load(re.sub(r"\{\{.*?\}\}", '"templated"', text))
    return loaded


# Tier L: LLM workers per class and their scalers ---------------------------------------------


def test_tier_l_has_one_llm_deployment_per_class_queue() -> None:
    docs = charts.instance("L")
    llm = [d for d in of_kind(docs, "Deployment") if "-llm" in d["metadata"]["name"]]
    assert sorted(d["metadata"]["name"] for d in llm) == [f"{P}-llm-{c}" for c in CLASSES]
    for c in CLASSES:
        deployment = named(docs, "Deployment", f"{P}-llm-{c}")
        env = env_of(pod_spec(deployment)["containers"][0])
        assert env["LLM_CLASS"]["value"] == c
        assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
        assert args_of(deployment)[-1] == "eventos_workers_llm"


def test_tier_l_scales_each_class_with_an_hpa_on_its_queue_backlog() -> None:
    docs = charts.instance("L")
    assert not of_kind(docs, "ScaledObject")
    hpas = of_kind(docs, "HorizontalPodAutoscaler")
    assert len(hpas) == 4
    for c in CLASSES:
        hpa = named(docs, "HorizontalPodAutoscaler", f"{P}-llm-{c}")
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": f"{P}-llm-{c}",
        }
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "External"
        selector = metric["external"]["metric"]["selector"]["matchLabels"]
        assert selector["taskqueue"] == f"llm-{c}"
        assert metric["external"]["target"]["type"] == "AverageValue"
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_tier_l_with_keda_scales_each_class_with_the_temporal_scaler() -> None:
    docs = charts.instance("L", "autoscaling.keda.enabled=true")
    assert not of_kind(docs, "HorizontalPodAutoscaler")
    scaled = of_kind(docs, "ScaledObject")
    assert len(scaled) == 4
    deployments = {d["metadata"]["name"] for d in of_kind(docs, "Deployment")}
    for c in CLASSES:
        so = named(docs, "ScaledObject", f"{P}-llm-{c}")
        # Structural check of the CRD kind the Kubernetes schemas do not know.
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        assert set(so) == {"apiVersion", "kind", "metadata", "spec"}
        spec = so["spec"]
        assert spec["scaleTargetRef"]["name"] in deployments
        assert spec["scaleTargetRef"]["name"] == f"{P}-llm-{c}"
        assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        assert isinstance(spec["pollingInterval"], int)
        scale_down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        assert scale_down == {"stabilizationWindowSeconds": 300}
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "temporal"
        meta = trigger["metadata"]
        assert meta["taskQueue"] == f"llm-{c}"
        assert meta["queueTypes"] == "activity"
        assert meta["namespace"] == "default"
        assert meta["endpoint"] == f"{P}-temporal.eventos-acme.svc:7233"
        assert all(isinstance(v, str) for v in meta.values()), "KEDA metadata values are strings"
        assert int(meta["targetQueueSize"]) >= 1


def test_keda_reaches_temporal_through_the_network_policy() -> None:
    docs = charts.instance("L", "autoscaling.keda.enabled=true")
    policy = named(docs, "NetworkPolicy", f"{P}-temporal")
    peers = [p for rule in policy["spec"]["ingress"] for p in rule["from"]]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}} in peers


# Tier L: Temporal server ---------------------------------------------------------------------


def test_tier_l_runs_the_full_temporal_server_at_64_shards_on_postgresql() -> None:
    docs = charts.instance("L")
    assert not of_kind(docs, "StatefulSet")
    server = named(docs, "Deployment", f"{P}-temporal")
    container = pod_spec(server)["containers"][0]
    assert re.fullmatch(r"temporalio/server:\d+\.\d+\.\d+", container["image"])
    script = container["args"][0]
    assert "temporal-server" in script and script.rstrip().endswith("start")
    assert "--service" not in script, "all services in one process"
    config = temporal_server_config(docs)
    assert config["persistence"]["numHistoryShards"] == 64
    stores = config["persistence"]["datastores"]
    assert {s["sql"]["databaseName"] for s in stores.values()} == {
        "temporal",
        "temporal_visibility",
    }
    assert {s["sql"]["pluginName"] for s in stores.values()} == {"postgres12"}
    assert {s["sql"]["connectAddr"] for s in stores.values()} == {"pg.acme.internal:5432"}
    dynamic = named(docs, "ConfigMap", f"{P}-temporal-config")["data"]["dynamicconfig.yaml"]
    assert yaml.safe_load(dynamic)["matching.enableFairness"] == [{"value": True}]
    # Workflows whose workflow task keeps failing are flagged for the relay's upkeep sweep.
    problems = "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute"
    assert yaml.safe_load(dynamic)[problems] == [{"value": 3}]


def test_tier_l_server_addresses_and_config_folder_are_values() -> None:
    """What `make run TIER=L` and the tier L tests override to run the chart's config locally."""
    docs = charts.instance(
        "L",
        "temporal.server.bindOnIP=127.0.0.1",
        "temporal.server.internalPorts.history=17234",
        "temporal.server.internalPorts.workerMembership=16939",
        "temporal.server.configDir=/srv/temporal/conf",
    )
    config = temporal_server_config(docs)
    services = config["services"]
    assert {s["rpc"]["bindOnIP"] for s in services.values()} == {"127.0.0.1"}
    assert services["history"]["rpc"]["grpcPort"] == 17234
    assert services["worker"]["rpc"]["membershipPort"] == 16939
    assert config["global"]["metrics"]["prometheus"]["listenAddress"] == "127.0.0.1:9090"
    assert config["dynamicConfigClient"]["filepath"] == "/srv/temporal/conf/dynamicconfig.yaml"
    container = pod_spec(named(docs, "Deployment", f"{P}-temporal"))["containers"][0]
    assert "--root /srv/temporal --config conf --env server" in container["args"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["config"] == "/srv/temporal/conf"


def test_tier_l_server_defaults_keep_the_ports_and_paths_of_the_image() -> None:
    config = temporal_server_config(charts.instance("L"))
    ports = {n: (s["rpc"]["grpcPort"], s["rpc"]["membershipPort"])
             for n, s in config["services"].items()}  # fmt: skip
    assert ports == {"frontend": (7233, 6933), "history": (7234, 6934),
                     "matching": (7235, 6935), "worker": (7239, 6939)}  # fmt: skip
    assert config["dynamicConfigClient"]["filepath"] == "/etc/temporal/eventos/dynamicconfig.yaml"


def test_tier_l_schema_job_runs_temporal_sql_tool_before_install_and_upgrade() -> None:
    docs = charts.instance("L")
    job = named(docs, "Job", f"{P}-temporal-schema")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    container = pod_spec(job)["containers"][0]
    assert re.fullmatch(r"temporalio/admin-tools:\d+\.\d+\.\d+", container["image"])
    script = container["args"][0]
    assert "temporal-sql-tool" in script
    assert "update-schema -d /etc/temporal/schema/postgresql/v12/temporal/versioned" in script
    assert "update-schema -d /etc/temporal/schema/postgresql/v12/visibility/versioned" in script
    env = env_of(container)
    assert (env["MAIN_DB"]["value"], env["VISIBILITY_DB"]["value"]) == (
        "temporal",
        "temporal_visibility",
    )
    server = named(docs, "Deployment", f"{P}-temporal")
    assert (
        pod_spec(server)["containers"][0]["image"].split(":")[1] == container["image"].split(":")[1]
    ), "admin tools on the server's version"
    # The same step is the server's init container: the upgrader's Temporal step runs it as a
    # Job on the target version's image (eventos.fleet.k8s_driver), with an external PostgreSQL too.
    (init,) = pod_spec(server)["initContainers"]
    assert (init["name"], init["image"], init["args"]) == ("schema", container["image"],
                                                           container["args"])  # fmt: skip


@pytest.mark.parametrize("tier", ["S", "L"])
def test_namespace_job_sets_7_day_retention_and_search_attributes(tier: str) -> None:
    docs = charts.instance(tier, "temporal.searchAttributes.EventosLane=Keyword")
    # One per revision, not a hook: the workers are Ready only once the namespace exists, and
    # `helm install --wait` runs post-install hooks only after every pod is Ready.
    job = named(docs, "Job", f"{P}-temporal-namespace-1")
    assert "helm.sh/hook" not in job["metadata"].get("annotations", {})
    container = pod_spec(job)["containers"][0]
    env = env_of(container)
    assert env["RETENTION"]["value"] == "168h"
    assert env["TEMPORAL_ADDRESS"]["value"] == f"{P}-temporal:7233"
    script = container["args"][0]
    assert "namespace create" in script and "--retention" in script
    assert (
        'search-attribute create -n "$TEMPORAL_NAMESPACE" --name "EventosLane" --type "Keyword"'
        in script
    )


def test_tier_l_with_bundled_postgresql_points_temporal_at_it() -> None:
    docs = charts.render(INSTANCE_CHART, (TIER_FILES["L"],), (*charts.REQUIRED, *BUNDLED))
    config = temporal_server_config(docs)
    addrs = {s["sql"]["connectAddr"] for s in config["persistence"]["datastores"].values()}
    assert addrs == {f"{P}-postgresql:5432"}
    # The bundled server exists only once the release is installed: no pre-install schema Job
    # (it would wait for it forever, and `helm install --wait` with it); the same schema step
    # runs as the Temporal server's init container, before every start of the server.
    assert not [j for j in of_kind(docs, "Job") if "schema" in j["metadata"]["name"]]
    server = pod_spec(named(docs, "Deployment", f"{P}-temporal"))
    (init,) = server["initContainers"]
    assert "temporal-sql-tool" in init["args"][0]
    assert env_of(init)["SQL_HOST"]["value"] == f"{P}-postgresql"
    mounted = {m["name"] for m in init["volumeMounts"]}
    assert mounted <= {v["name"] for v in server["volumes"]}
    # Room for every pod's pool and the server's two: PostgreSQL's default 100 is too few.
    pg = pod_spec(named(docs, "StatefulSet", f"{P}-postgresql"))["containers"][0]
    assert pg["args"] == ["-c", "max_connections=400"]
    # The services ride out a database not migrated yet (the relay's boot re-arm waits), so
    # the migration runs right after the install.
    assert named(docs, "Job", f"{P}-migrate")["metadata"]["annotations"]["helm.sh/hook"] == (
        "post-install,pre-upgrade"
    )


# Tier S: the dev server ---------------------------------------------------------------------


def test_tier_s_runs_the_pinned_dev_server_with_the_spec_flags() -> None:
    docs = charts.instance("S")
    assert not of_kind(docs, "HorizontalPodAutoscaler") and not of_kind(docs, "ScaledObject")
    assert not [j for j in of_kind(docs, "Job") if "schema" in j["metadata"]["name"]]
    server = named(docs, "StatefulSet", f"{P}-temporal")
    assert server["spec"]["replicas"] == 1
    container = pod_spec(server)["containers"][0]
    assert container["image"] == "temporalio/temporal:1.9.1"
    args = args_of(server)
    assert args[:3] == ["temporal", "server", "start-dev"]
    dynamic = flag_values(args, "--dynamic-config-value")
    assert "matching.enableFairness=true" in dynamic
    assert "matching.numTaskqueueReadPartitions=1" in dynamic
    assert "matching.numTaskqueueWritePartitions=1" in dynamic
    assert "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute=3" in dynamic
    pragmas = flag_values(args, "--sqlite-pragma")
    assert "journal_mode=wal" in pragmas
    (db_file,) = flag_values(args, "--db-filename")
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert db_file.startswith(mounts["data"] + "/"), "the SQLite file lives on the volume"
    claim = server["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "grpc": 7233,
        "http": 7243,
        "metrics": 9090,
    }
    assert flag_values(args, "--port") == ["7233"]
    assert "--headless" in args


def test_tier_s_has_one_llm_worker_polling_every_class_queue() -> None:
    docs = charts.instance("S")
    llm = [d for d in of_kind(docs, "Deployment") if "-llm" in d["metadata"]["name"]]
    assert [d["metadata"]["name"] for d in llm] == [f"{P}-llm"]
    env = env_of(pod_spec(llm[0])["containers"][0])
    assert env["LLM_CLASS"]["value"] == "c1,c2,c3,c4"
    assert llm[0]["spec"]["replicas"] == 1


# Both tiers: roles, probes, budgets, services ------------------------------------------------


@pytest.mark.parametrize("tier", ["S", "L"])
def test_every_role_has_a_deployment_with_probes_resources_and_a_pdb(tier: str) -> None:
    docs = charts.instance(tier)
    pdbs = {d["metadata"]["name"]: d for d in of_kind(docs, "PodDisruptionBudget")}
    services = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] != f"{P}-temporal"]
    assert {f"{P}-{r}" for r in ROLES} <= {d["metadata"]["name"] for d in services}
    for deployment in services:
        name = deployment["metadata"]["name"]
        container = pod_spec(deployment)["containers"][0]
        assert container["livenessProbe"]["httpGet"]["path"] == "/livez", name
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
        assert container["resources"]["requests"]["cpu"], name
        assert container["resources"]["limits"]["memory"], name
        assert (
            pdbs[name]["spec"]["selector"]["matchLabels"]
            == (deployment["spec"]["selector"]["matchLabels"])
        )
        assert deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def test_services_expose_http_grpc_and_metrics_where_the_role_serves_them() -> None:
    docs = charts.instance("S")

    def ports(name: str) -> set[str]:
        return {p["name"] for p in named(docs, "Service", f"{P}-{name}")["spec"]["ports"]}

    assert ports("ingress") == {"http", "grpc", "metrics"}
    assert ports("router") == ports("relay") == {"grpc", "metrics"}
    assert ports("workers-workflow") == ports("egress") == ports("llm") == {"metrics"}
    kick = env_of(pod_spec(named(docs, "Deployment", f"{P}-ingress"))["containers"][0])
    assert kick["EVENTOS_INGRESS_KICK"]["value"] == f"{P}-router:9090"


def test_size_presets_and_explicit_resources() -> None:
    docs = charts.instance("S", "roles.router.size=large", "roles.relay.resources.requests.cpu=3")
    router = pod_spec(named(docs, "Deployment", f"{P}-router"))["containers"][0]
    assert router["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    relay = pod_spec(named(docs, "Deployment", f"{P}-relay"))["containers"][0]
    assert relay["resources"] == {"requests": {"cpu": 3}}


@pytest.mark.parametrize("tier", ["S", "L"])
def test_the_optional_ingress_routes_only_hooks_channels_the_owner_api_openapi_and_console(
    tier: str,
) -> None:
    docs = charts.instance(tier, "ingress.enabled=true", "ingress.host=acme.example.com")
    (rule,) = named(docs, "Ingress", f"{P}-ingress")["spec"]["rules"]
    paths = rule["http"]["paths"]
    assert sorted((p["path"], p["pathType"]) for p in paths) == [
        ("/channels", "Prefix"),
        ("/console", "Prefix"),
        ("/hooks", "Prefix"),
        ("/openapi.json", "Exact"),
        ("/v1", "Prefix"),
    ], "never /, so /metrics, /readyz and /livez stay inside the cluster"
    for path in paths:
        assert path["backend"]["service"] == {"name": f"{P}-ingress", "port": {"name": "http"}}
    assert not of_kind(charts.instance(tier), "Ingress")


@pytest.mark.parametrize("tier", ["S", "L"])
def test_every_service_gets_the_collector_instance_tier_and_release(tier: str) -> None:
    docs = charts.instance(
        tier, "telemetry.otlpEndpoint=http://collector.telemetry.svc:4317", "image.tag=2026.12.1"
    )
    config = named(docs, "ConfigMap", f"{P}-config")["data"]
    assert config["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector.telemetry.svc:4317"
    assert config["EVENTOS_INSTANCE_ID"] == "inst-7f3a"
    assert config["EVENTOS_TIER"] == tier
    assert config["EVENTOS_RELEASE"] == "0.1.0"
    # The release record every service reports on /livez, /readyz and eventos_build_info.
    assert config["EVENTOS_IMAGE_TAG"] == "2026.12.1"
    assert config["EVENTOS_CHART_VERSION"] == "0.1.0"
    temporal = "temporalio/server:1.32.0" if tier == "L" else "temporalio/temporal:1.9.1"
    assert config["EVENTOS_TEMPORAL_SERVER"] == temporal
    assert config["TEMPORAL_ADDRESS"] == f"{P}-temporal:7233"
    for deployment in of_kind(docs, "Deployment"):
        if deployment["metadata"]["name"] == f"{P}-temporal":
            continue
        container = pod_spec(deployment)["containers"][0]
        assert container["envFrom"] == [{"configMapRef": {"name": f"{P}-config"}}]


@pytest.mark.parametrize(("tier", "capacity", "class_max"),
                         [("S", "24", ["8", "16", "8", "4"]), ("L", "240", ["72", "160", "48", "24"])])  # fmt: skip
def test_admission_capacity_per_tier_fits_the_llm_slots(
    tier: str, capacity: str, class_max: list[str]
) -> None:
    """The scheduler's settings reach every service, and each class ceiling fits within its
    LLM workers' slots (tier L: slots x maxReplicas), so a granted turn never waits for one."""
    docs = charts.instance(tier)
    config = named(docs, "ConfigMap", f"{P}-config")["data"]
    assert config["EVENTOS_SCHED_CAPACITY"] == capacity
    assert [config[f"EVENTOS_SCHED_CLASS_MAX_{c.upper()}"] for c in CLASSES] == class_max
    values = charts.values(tier)
    for c, ceiling in zip(CLASSES, class_max, strict=True):
        llm = values["llmClasses"][c]
        room = llm["slots"] * (llm["maxReplicas"] if tier == "L" else 1)
        assert int(ceiling) <= room, (c, ceiling, room)


# NetworkPolicies --------------------------------------------------------------------------


@pytest.mark.parametrize("tier", ["S", "L"])
def test_network_policies_keep_temporal_and_postgresql_private(tier: str) -> None:
    sets = BUNDLED if tier == "S" else ()
    docs = charts.instance(tier, *sets)
    for component in ["temporal", *(["postgresql"] if sets else [])]:
        policy = named(docs, "NetworkPolicy", f"{P}-{component}")
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        (rule,) = spec["ingress"]
        assert rule["from"] == [
            {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "acme"}}}
        ]
    for workload in charts.workloads(docs):
        labels = charts.pod_labels(workload)
        assert labels["app.kubernetes.io/instance"] == "acme", "every pod may reach them"


def test_migration_job_runs_before_install_and_upgrade() -> None:
    docs = charts.instance("S")
    job = named(docs, "Job", f"{P}-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    container = pod_spec(job)["containers"][0]
    assert container["args"] == ["eventosctl", "migrate"]
    # Pre-install: nothing of the release exists yet, so it must not need its ServiceAccount.
    assert "serviceAccountName" not in pod_spec(job)


# Security: non-root, secrets only as mounted files, no credential in the chart ---------------


@pytest.mark.parametrize("tier", ["S", "L"])
def test_no_container_runs_as_root(tier: str) -> None:
    docs = charts.instance(tier, *BUNDLED, "autoscaling.keda.enabled=true")
    docs += charts.collector()
    checked = 0
    for workload in charts.workloads(docs):
        pod = pod_spec(workload)
        for container in pod["containers"] + pod.get("initContainers", []):
            ctx = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
            where = f"{workload['kind']}/{workload['metadata']['name']}/{container['name']}"
            assert ctx.get("runAsNonRoot") is True, where
            assert isinstance(ctx.get("runAsUser"), int) and ctx["runAsUser"] != 0, where
            assert ctx.get("allowPrivilegeEscalation") is False, where
            assert ctx.get("readOnlyRootFilesystem") is True, where
            checked += 1
    assert checked >= 10


SECRET_SETS = (
    *BUNDLED,
    "secrets.internal.existingSecret=acme-internal",
    "secrets.outbox.existingSecret=acme-outbox",
    "secrets.employees.existingSecret=acme-employees",
    "ingress.grpc.tls.secretName=acme-grpc-tls",
)


@pytest.mark.parametrize("tier", ["S", "L"])
def test_every_secret_is_mounted_as_a_file_and_none_is_inlined(tier: str) -> None:
    docs = charts.instance(tier, *SECRET_SETS)
    assert not of_kind(docs, "Secret"), "the chart references Secrets, it never holds one"
    referenced: set[str] = set()
    for workload in charts.workloads(docs):
        pod = pod_spec(workload)
        secret_volumes = {
            v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v
        }
        referenced |= set(secret_volumes.values())
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
            for volume in secret_volumes:
                assert volume in mounts and mounts[volume]["readOnly"] is True
            for env in container.get("env", []):
                assert "secretKeyRef" not in env.get("valueFrom", {}), env["name"]
                assert not re.search(r"PASSWORD|TOKEN|SECRET(?!S_DIR)", env["name"]) or (
                    env["name"].endswith("_FILE")
                ), f"{env['name']} would carry a credential in the pod spec"
                if env["name"].endswith("_FILE") or env["name"] == "EVENTOS_SECRETS_DIR":
                    path = env["value"]
                    assert any(path.startswith(m["mountPath"]) for m in mounts.values()), path
    expected = {
        "acme-database",
        "acme-admin",
        "acme-internal",
        "acme-outbox",
        "acme-employees",
        "acme-grpc-tls",
        "acme-postgresql",
    }
    if tier == "L":
        expected.add("acme-temporal-sql")
    assert referenced == expected
    for config in of_kind(docs, "ConfigMap"):
        for value in config["data"].values():
            assert not re.search(r"://[^/\s]*:[^/\s]*@", value), "no credential in a URL"


def test_employee_secrets_reach_the_roles_that_resolve_them() -> None:
    docs = charts.instance("L", "secrets.employees.existingSecret=acme-employees")
    for name in ["ingress", "workers-workflow", "egress", *[f"llm-{c}" for c in CLASSES]]:
        container = pod_spec(named(docs, "Deployment", f"{P}-{name}"))["containers"][0]
        assert env_of(container)["EVENTOS_SECRETS_DIR"]["value"] == (
            "/var/run/secrets/eventos/employees"
        )
    for name in ["router", "relay"]:
        container = pod_spec(named(docs, "Deployment", f"{P}-{name}"))["containers"][0]
        assert "EVENTOS_SECRETS_DIR" not in env_of(container)


# Config checksum -------------------------------------------------------------------------


def checksums(docs: list[Doc]) -> dict[str, str]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for d in of_kind(docs, "Deployment")
        if "checksum/config" in d["spec"]["template"]["metadata"].get("annotations", {})
    }


def test_a_changed_config_changes_the_checksum_and_restarts_the_pods() -> None:
    before = checksums(charts.instance("S"))
    same = checksums(charts.instance("S", "roles.router.replicas=3"))
    after = checksums(charts.instance("S", "telemetry.otlpEndpoint=http://other:4317"))
    assert len(before) == 6
    assert before == same, "a replica count is not config"
    assert all(after[name] != before[name] for name in before)


def test_a_changed_temporal_config_changes_the_server_checksum() -> None:
    before = checksums(charts.instance("L"))[f"{P}-temporal"]
    after = checksums(charts.instance("L", "temporal.server.logLevel=debug"))[f"{P}-temporal"]
    assert before != after


# Invalid values fail the render ---------------------------------------------------------------


def render_error(*sets: str, tier_file: str = "S") -> str:
    with pytest.raises(RenderError) as caught:
        charts.render(INSTANCE_CHART, (TIER_FILES[tier_file],), sets)
    return str(caught.value)


def test_an_unknown_tier_fails_the_render() -> None:
    message = render_error(*charts.REQUIRED, "tier=M")
    assert "tier" in message and '"S", "L"' in message


def test_a_missing_database_url_secret_fails_the_render() -> None:
    message = render_error("instance.id=inst-7f3a", "secrets.admin.existingSecret=acme-admin")
    assert "secrets.database.existingSecret is required" in message


def test_a_missing_instance_id_fails_the_render() -> None:
    message = render_error("secrets.database.existingSecret=db", "secrets.admin.existingSecret=a")
    assert "instance.id is required" in message


def test_tier_l_without_a_temporal_database_host_fails_the_render() -> None:
    message = render_error(*charts.REQUIRED, tier_file="L")
    assert "temporal.server.sql.host is required" in message


def test_a_class_at_zero_replicas_without_keda_fails_the_render() -> None:
    # The apiserver refuses an HPA with minReplicas 0; only KEDA scales a class to zero.
    sets = (*charts.REQUIRED, *charts.TIER_L_SQL, "llmClasses.c3.minReplicas=0")
    message = render_error(*sets, tier_file="L")
    assert "llmClasses.c3.minReplicas must be at least 1 without KEDA" in message
    assert charts.instance("L", "llmClasses.c3.minReplicas=0", "autoscaling.keda.enabled=true")


def test_bundled_postgresql_without_its_secret_fails_the_render() -> None:
    message = render_error(*charts.REQUIRED, "postgresql.bundled.enabled=true")
    assert "postgresql.existingSecret is required" in message


def test_unknown_keys_and_bad_types_fail_the_render() -> None:
    assert "Additional property replica is not allowed" in render_error(
        *charts.REQUIRED, "roles.router.replica=2"
    )
    assert "temporal.server.numHistoryShards" in render_error(
        *charts.REQUIRED, "temporal.server.numHistoryShards=many"
    )
    assert "is not a preset" in render_error(*charts.REQUIRED, "roles.router.size=huge")


# values.yaml documents every key -----------------------------------------------------------


def test_values_yaml_documents_every_key() -> None:
    undocumented = []
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    comment_above = False
    for line in (INSTANCE_CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if not stripped:
            comment_above = False
            continue
        if stripped.startswith("#"):
            comment_above = True
            continue
        match = re.match(r"^(\s*)([A-Za-z0-9_.\-]+):", line)
        if match is None:
            comment_above = False
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        documented = comment_above or any(d for _, d in stack)
        is_leaf = not line.rstrip().endswith(":")
        if is_leaf and not documented:
            undocumented.append(stripped)
        stack.append((indent, documented))
        comment_above = False
    assert not undocumented, undocumented


@pytest.mark.parametrize("tier", ["S", "L"])
def test_helm_test_asks_every_service_for_readiness_and_grpc_health(tier: str) -> None:
    docs = charts.instance(tier)
    pod = named(docs, "Pod", f"{P}-test-readiness")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == "acme"  # gRPC is let in
    args = args_of(pod)
    assert args[:3] == ["python", "-m", "eventos.runtime.probe"]
    llm = ["llm"] if tier == "S" else [f"llm-{c}" for c in CLASSES]
    assert flag_values(args, "--http") == [
        f"{role}=http://{P}-{role}:9102" for role in [*ROLES, *llm]
    ]
    assert flag_values(args, "--grpc") == [
        f"{role}={P}-{role}:9090" for role in ["ingress", "router", "relay"]
    ]


def test_helm_test_leaves_out_the_tls_only_ingress_grpc_port() -> None:
    docs = charts.instance("S", "ingress.grpc.tls.secretName=acme-grpc-tls")
    args = args_of(named(docs, "Pod", f"{P}-test-readiness"))
    assert [t.split("=")[0] for t in flag_values(args, "--grpc")] == ["router", "relay"]


def test_the_dev_servers_web_ui_is_a_port_of_the_temporal_service_when_served() -> None:
    def ports(tier: str, *sets: str) -> dict[str, int]:
        service = named(charts.instance(tier, *sets), "Service", f"{P}-temporal")
        return {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}

    assert ports("S", "temporal.dev.ui=true")["ui"] == "ui"
    assert "ui" not in ports("S") and "ui" not in ports("L", "temporal.dev.ui=true")
