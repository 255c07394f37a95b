"""What of an instance is reachable from where, and the credentials its roles get (issue 11):
the ingress pods' NetworkPolicy, gRPC TLS or the explicit insecure switch, the internal
producers' token, the outbox keys, the LLM endpoint allowlist, and no per-pod blob volume."""

from __future__ import annotations

import json

import charts
import pytest
from charts import INSTANCE_CHART, TIER_FILES, Doc, RenderError, env_of, named, of_kind, pod_spec

P = "acme-eventos"
SECRETS = "/var/run/secrets/eventos"
SAME_NAMESPACE = {"podSelector": {}}
NGINX = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
DRIVERS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "drivers"}},
    "podSelector": {"matchLabels": {"app": "telegram-driver"}},
}


def deployments(tier: str, *sets: str) -> dict[str, Doc]:
    """The service Deployments by role name (acme-eventos-<role>), Temporal left out."""
    return {
        d["metadata"]["name"].removeprefix(f"{P}-"): d
        for d in of_kind(charts.instance(tier, *sets), "Deployment")
        if d["metadata"]["name"] != f"{P}-temporal"
    }


def container(deployment: Doc) -> Doc:
    found: Doc = pod_spec(deployment)["containers"][0]
    return found


def roles_with_env(tier: str, name: str, *sets: str) -> set[str]:
    return {r for r, d in deployments(tier, *sets).items() if name in env_of(container(d))}


def rules_by_port(policy: Doc) -> dict[str, list[Doc]]:
    """Each allowed port (by name) with the peers allowed to reach it."""
    by_port: dict[str, list[Doc]] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["protocol"] == "TCP"
            by_port.setdefault(port["port"], []).extend(rule["from"])
    return by_port


def render_error(*sets: str) -> str:
    with pytest.raises(RenderError) as caught:
        charts.render(INSTANCE_CHART, (TIER_FILES["S"],), (*charts.REQUIRED, *sets))
    return str(caught.value)


# NetworkPolicy of the ingress pods -----------------------------------------------------------


@pytest.mark.parametrize("tier", ["S", "L"])
def test_ingress_http_is_open_to_the_ingress_controller_and_grpc_only_to_the_namespace(
    tier: str,
) -> None:
    docs = charts.instance(tier)
    policy = named(docs, "NetworkPolicy", f"{P}-ingress")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    pod_labels = named(docs, "Deployment", f"{P}-ingress")["spec"]["template"]["metadata"]
    assert selector.items() <= pod_labels["labels"].items(), "the policy selects the ingress pods"
    assert selector["app.kubernetes.io/component"] == "ingress"
    by_port = rules_by_port(policy)
    assert by_port == {"http": [SAME_NAMESPACE, NGINX], "grpc": [SAME_NAMESPACE]}
    ports = {p["name"] for p in container(named(docs, "Deployment", f"{P}-ingress"))["ports"]}
    assert ports == set(by_port), "every port the pod serves has its rule; nothing else is open"


def test_ingress_peers_come_from_the_values() -> None:
    docs = charts.instance(
        "S",
        "ingress.networkPolicy.httpFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=traefik",
        "ingress.networkPolicy.grpcFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=drivers",
        "ingress.networkPolicy.grpcFrom[0].podSelector.matchLabels.app=telegram-driver",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
    )  # fmt: skip
    traefik = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "traefik"}}}
    by_port = rules_by_port(named(docs, "NetworkPolicy", f"{P}-ingress"))
    assert by_port["http"] == [SAME_NAMESPACE, traefik, MONITORING]
    assert by_port["grpc"] == [SAME_NAMESPACE, DRIVERS], "metrics scrapers never reach gRPC"
    temporal = named(docs, "NetworkPolicy", f"{P}-temporal")["spec"]["ingress"]
    metrics_rules = [r["from"] for r in temporal if "metrics" in str(r.get("ports"))]
    assert metrics_rules == [[MONITORING]], "one monitoring peer list for every metrics port"


def test_an_empty_http_peer_list_leaves_http_to_the_namespace() -> None:
    docs = charts.instance("S", "ingress.networkPolicy.httpFrom=null")
    by_port = rules_by_port(named(docs, "NetworkPolicy", f"{P}-ingress"))
    assert by_port == {"http": [SAME_NAMESPACE], "grpc": [SAME_NAMESPACE]}


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions with In) selects these labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", expr
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


@pytest.mark.parametrize("tier", ["S", "L"])
def test_every_serving_pod_has_exactly_one_policy_covering_each_of_its_ports(tier: str) -> None:
    docs = charts.instance(tier, "postgresql.bundled.enabled=true", "postgresql.existingSecret=pg")
    policies = of_kind(docs, "NetworkPolicy")
    checked = []
    for workload in [d for d in charts.workloads(docs) if d["kind"] not in ("Job", "Pod")]:
        name = workload["metadata"]["name"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        (policy,) = [p for p in policies if "Ingress" in p["spec"]["policyTypes"]
                     and selects(p["spec"]["podSelector"], labels)] or [None]  # fmt: skip
        assert policy is not None, f"{name} has no NetworkPolicy"
        rules = policy["spec"]["ingress"]
        open_ports = {p["port"] for r in rules for p in r.get("ports", [])}
        every_port = any("ports" not in r for r in rules)
        for port in container(workload).get("ports", []):
            assert every_port or port["name"] in open_ports, (name, port["name"])
        checked.append(name)
    assert len(checked) == (8 if tier == "S" else 11)


def test_router_relay_and_workers_answer_kicks_only_from_the_release() -> None:
    docs = charts.instance(
        "L",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
    )  # fmt: skip
    policy = named(docs, "NetworkPolicy", f"{P}-services")
    release = {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "acme"}}}
    assert rules_by_port(policy) == {"http": [SAME_NAMESPACE, MONITORING], "grpc": [release]}
    ingress = named(docs, "Deployment", f"{P}-ingress")["spec"]["template"]["metadata"]["labels"]
    assert not selects(policy["spec"]["podSelector"], ingress), "ingress has its own policy"


def test_network_policies_can_be_turned_off_together() -> None:
    assert not of_kind(charts.instance("S", "networkPolicy.enabled=false"), "NetworkPolicy")


def test_a_malformed_peer_fails_the_render() -> None:
    message = render_error("ingress.networkPolicy.grpcFrom[0].namespace=drivers")
    assert (
        "ingress.networkPolicy.grpcFrom.0: Additional property namespace is not allowed" in message
    )


# gRPC TLS, or the explicit insecure switch -----------------------------------------------


@pytest.mark.parametrize("tier", ["S", "L"])
def test_without_a_tls_secret_ingress_is_told_grpc_is_plaintext(tier: str) -> None:
    ingress = deployments(tier)["ingress"]
    env = env_of(container(ingress))
    assert env["EVENTOS_INGRESS_GRPC_INSECURE"]["value"] == "true"
    assert "EVENTOS_INGRESS_GRPC_TLS_CERT_FILE" not in env
    assert "grpc-tls" not in {v["name"] for v in pod_spec(ingress)["volumes"]}
    assert roles_with_env(tier, "EVENTOS_INGRESS_GRPC_INSECURE") == {"ingress"}


@pytest.mark.parametrize("tier", ["S", "L"])
def test_a_tls_secret_is_mounted_read_only_and_named_to_ingress(tier: str) -> None:
    ingress = deployments(tier, "ingress.grpc.tls.secretName=acme-grpc-tls")["ingress"]
    env = env_of(container(ingress))
    assert "EVENTOS_INGRESS_GRPC_INSECURE" not in env
    assert env["EVENTOS_INGRESS_GRPC_TLS_CERT_FILE"]["value"] == f"{SECRETS}/grpc-tls/tls.crt"
    assert env["EVENTOS_INGRESS_GRPC_TLS_KEY_FILE"]["value"] == f"{SECRETS}/grpc-tls/tls.key"
    (volume,) = [v for v in pod_spec(ingress)["volumes"] if v["name"] == "grpc-tls"]
    assert volume["secret"]["secretName"] == "acme-grpc-tls"
    assert volume["secret"]["items"] == [
        {"key": "tls.crt", "path": "tls.crt"},
        {"key": "tls.key", "path": "tls.key"},
    ]
    (mount,) = [m for m in container(ingress)["volumeMounts"] if m["name"] == "grpc-tls"]
    assert mount == {"name": "grpc-tls", "mountPath": f"{SECRETS}/grpc-tls", "readOnly": True}
    for name, other in deployments(tier, "ingress.grpc.tls.secretName=acme-grpc-tls").items():
        if name != "ingress":
            assert "grpc-tls" not in {v["name"] for v in pod_spec(other)["volumes"]}, name
            assert "EVENTOS_INGRESS_GRPC_TLS_KEY_FILE" not in env_of(container(other)), name


# Credentials: internal producers, no driver token, outbox keys --------------------------------


INTERNAL = "secrets.internal.existingSecret=acme-internal"
OUTBOX = "secrets.outbox.existingSecret=acme-outbox"


@pytest.mark.parametrize(("tier", "llm"), [("S", {"llm"}), ("L", {f"llm-c{n}" for n in range(1, 5)})])  # fmt: skip
def test_the_internal_token_reaches_ingress_and_the_internal_producers(
    tier: str, llm: set[str]
) -> None:
    roles = deployments(tier, INTERNAL)
    assert set(roles) == {"ingress", "router", "relay", "workers-workflow", "egress", *llm}
    holders = roles_with_env(tier, "EVENTOS_INTERNAL_TOKEN_FILE", INTERNAL)
    assert holders == {"ingress", "relay", "workers-workflow", "egress"}
    for name in holders:
        env = env_of(container(roles[name]))
        assert env["EVENTOS_INTERNAL_TOKEN_FILE"]["value"] == f"{SECRETS}/internal/token"
        (volume,) = [v for v in pod_spec(roles[name])["volumes"] if v["name"] == "internal"]
        assert volume["secret"] == {
            "secretName": "acme-internal",
            "defaultMode": 0o400,
            "items": [{"key": "token", "path": "token"}],
        }
    assert not roles_with_env(tier, "EVENTOS_INTERNAL_TOKEN_FILE"), "unset: not rendered"


@pytest.mark.parametrize("tier", ["S", "L"])
def test_no_driver_token_is_rendered(tier: str) -> None:
    text = charts.render_text(
        INSTANCE_CHART, (TIER_FILES[tier],), (*charts.REQUIRED, *charts.TIER_L_SQL, INTERNAL)
    )
    assert "DRIVER_TOKEN" not in text and "/driver" not in text
    message = render_error("secrets.driver.existingSecret=acme-driver")
    assert "Additional property driver is not allowed" in message


@pytest.mark.parametrize("tier", ["S", "L"])
def test_the_outbox_keys_reach_the_roles_that_write_or_read_the_outbox(tier: str) -> None:
    roles = deployments(tier, OUTBOX, "secrets.outbox.keysKey=aes-keys")
    holders = roles_with_env(tier, "EVENTOS_OUTBOX_KEYS_FILE", OUTBOX)
    assert holders == {"relay", "workers-workflow", "egress"}
    for name in holders:
        assert env_of(container(roles[name]))["EVENTOS_OUTBOX_KEYS_FILE"]["value"] == (
            f"{SECRETS}/outbox/keys"
        )
        (volume,) = [v for v in pod_spec(roles[name])["volumes"] if v["name"] == "outbox"]
        assert volume["secret"]["items"] == [{"key": "aes-keys", "path": "keys"}]
    assert not roles_with_env(tier, "EVENTOS_OUTBOX_KEYS", OUTBOX), "only the file path in the spec"


def test_the_outbox_keys_are_required() -> None:
    message = render_error("secrets.outbox.existingSecret=")
    assert "secrets.outbox.existingSecret is required" in message


# The LLM endpoint allowlist ------------------------------------------------------------------


ENDPOINTS = (
    "llm.endpoints.openai.base_url=https://api.openai.com/v1",
    "llm.endpoints.openai.credentials={openai-main,openai-backup}",
    "llm.endpoints.vllm.base_url=http://vllm.models.svc:8000/v1",
)


@pytest.mark.parametrize("tier", ["S", "L"])
def test_the_llm_endpoints_reach_ingress_and_the_llm_workers_as_json(tier: str) -> None:
    roles = deployments(tier, *ENDPOINTS)
    holders = roles_with_env(tier, "EVENTOS_LLM_ENDPOINTS", *ENDPOINTS)
    assert holders == {"ingress", *(r for r in roles if r.startswith("llm"))}
    assert len(holders) == (2 if tier == "S" else 5)
    for name in holders:
        value = env_of(container(roles[name]))["EVENTOS_LLM_ENDPOINTS"]["value"]
        assert json.loads(value) == {
            "openai": {
                "base_url": "https://api.openai.com/v1",
                "credentials": ["openai-main", "openai-backup"],
            },
            "vllm": {"base_url": "http://vllm.models.svc:8000/v1"},
        }


def test_without_endpoints_the_allowlist_is_empty() -> None:
    ingress = deployments("S")["ingress"]
    assert json.loads(env_of(container(ingress))["EVENTOS_LLM_ENDPOINTS"]["value"]) == {}


def test_a_bad_llm_endpoint_fails_the_render() -> None:
    assert "llm.endpoints.openai.base_url: Does not match pattern" in render_error(
        "llm.endpoints.openai.base_url=api.openai.com"
    )
    assert "llm.endpoints.openai: base_url is required" in render_error(
        "llm.endpoints.openai.credentials={openai-main}"
    )
    ok = "llm.endpoints.openai.base_url=https://api.openai.com/v1"
    assert "Additional property key is not allowed" in render_error(
        ok, "llm.endpoints.openai.key=sk-1"
    ), "a credential's value never goes in the allowlist, only its reference"
    assert "llm.endpoints.openai.credentials.0: Does not match pattern" in render_error(
        ok, "llm.endpoints.openai.credentials={sk-live key}"
    )


# Durable bodies live in PostgreSQL: no per-pod blob volume -----------------------------------


@pytest.mark.parametrize("tier", ["S", "L"])
def test_no_role_keeps_bodies_on_a_pod_volume(tier: str) -> None:
    for name, deployment in deployments(tier).items():
        assert "EVENTOS_BLOB_DIR" not in env_of(container(deployment)), name
        volumes = pod_spec(deployment)["volumes"]
        assert [v["name"] for v in volumes if "emptyDir" in v] == ["tmp"], name
        assert not [v for v in volumes if "persistentVolumeClaim" in v], name
    assert "blobs is not allowed" in render_error("blobs.existingClaim=acme-blobs")
