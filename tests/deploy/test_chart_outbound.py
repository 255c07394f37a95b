"""The instance chart's egress NetworkPolicy (issue 25 point 5): the roles that call out reach
public addresses, DNS, the release's own pods and the operator's extra peers; never private,
link-local (cloud metadata), other special-use ranges or the cluster's CIDRs."""

from __future__ import annotations

import ipaddress

import charts
import pytest
from charts import Doc, named, of_kind
from test_chart_exposure import P, selects

CALLERS = {"S": {"workers-workflow", "egress", "ingress", "llm"},
           "L": {"workers-workflow", "egress", "ingress", "llm-c1", "llm-c2", "llm-c3", "llm-c4"}}  # fmt: skip
RELEASE = {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "acme"}}}
DNS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
DNS_PORTS = [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]


def outbound(tier: str, *sets: str) -> tuple[Doc, list[Doc]]:
    docs = charts.instance(tier, "postgresql.bundled.enabled=true", "postgresql.existingSecret=pg",
                           *sets)  # fmt: skip
    return named(docs, "NetworkPolicy", f"{P}-outbound"), docs


def public_block(policy: Doc, cidr: str) -> Doc:
    (block,) = [p["ipBlock"] for r in policy["spec"]["egress"] for p in r["to"]
                if p.get("ipBlock", {}).get("cidr") == cidr]  # fmt: skip
    return block


def reachable(block: Doc, address: str) -> bool:
    ip = ipaddress.ip_address(address)
    inside = ip in ipaddress.ip_network(block["cidr"])
    return inside and not any(ip in ipaddress.ip_network(e) for e in block["except"])


@pytest.mark.parametrize("tier", ["S", "L"])
def test_the_roles_that_call_out_and_only_they_are_held_by_the_egress_policy(tier: str) -> None:
    policy, docs = outbound(tier)
    assert policy["spec"]["policyTypes"] == ["Egress"]
    held = set()
    for workload in charts.workloads(docs):
        labels = charts.pod_labels(workload)
        if selects(policy["spec"]["podSelector"], labels):
            held.add(labels["app.kubernetes.io/component"])
    assert held == CALLERS[tier], "router, relay, Temporal, PostgreSQL and the Jobs are not held"


@pytest.mark.parametrize("tier", ["S", "L"])
def test_public_addresses_dns_and_the_release_are_reachable_nothing_private(tier: str) -> None:
    policy, _ = outbound(tier)
    rules = policy["spec"]["egress"]
    assert rules[0] == {"to": [RELEASE]}, "Temporal, the bundled PostgreSQL, each other"
    assert rules[1] == {"to": [DNS], "ports": DNS_PORTS}
    assert len(rules) == 3 and "ports" not in rules[2], "public addresses on any port"
    block = public_block(policy, "0.0.0.0/0")
    for address in ("8.8.8.8", "93.184.215.14", "1.1.1.1"):
        assert reachable(block, address), address
    denied = ("169.254.169.254", "10.43.0.10", "10.42.1.7", "172.17.0.1", "192.168.1.1",
              "127.0.0.1", "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255",
              "198.18.0.1")  # fmt: skip
    for address in denied:
        assert not reachable(block, address), address
    assert "::/0" not in str(rules), "IPv6 only when the cluster has it (networkPolicy.egress.ipv6)"


def test_ipv6_denies_every_form_that_carries_a_private_ipv4() -> None:
    policy, _ = outbound("S", "networkPolicy.egress.ipv6=true")
    block = public_block(policy, "::/0")
    assert reachable(block, "2606:4700::1111")
    for address in ("::1", "::127.0.0.1", "::ffff:10.0.0.1", "64:ff9b::a9fe:a9fe",
                    "64:ff9b:1:7f00:0:100::", "2002:a00:1::1", "2001:0:4136:e378::1",
                    "fd00:ec2::254", "fe80::1", "ff02::1"):  # fmt: skip
        assert not reachable(block, address), address


def test_cluster_cidrs_and_extra_peers_come_from_the_values() -> None:
    policy, _ = outbound(
        "S",
        "networkPolicy.egress.ipv6=true",
        "networkPolicy.egress.clusterCIDRs={34.118.224.0/20,2600:1900:4000::/44}",
        "networkPolicy.egress.to[0].to[0].ipBlock.cidr=10.0.5.10/32",
        "networkPolicy.egress.to[0].ports[0].port=5432",
    )  # fmt: skip
    assert not reachable(public_block(policy, "0.0.0.0/0"), "34.118.230.1")
    assert not reachable(public_block(policy, "::/0"), "2600:1900:4000::1")
    assert policy["spec"]["egress"][-1] == {
        "to": [{"ipBlock": {"cidr": "10.0.5.10/32"}}],
        "ports": [{"port": 5432}],
    }


def test_the_egress_policy_can_be_turned_off() -> None:
    for off in ("networkPolicy.egress.enabled=false", "networkPolicy.enabled=false"):
        docs = charts.instance("S", off)
        assert f"{P}-outbound" not in [
            p["metadata"]["name"] for p in of_kind(docs, "NetworkPolicy")
        ]


@pytest.mark.parametrize("tier", ["S", "L"])
def test_secret_purposes_reach_every_role_that_uses_a_secret(tier: str) -> None:
    docs = charts.instance(tier, "secrets.employees.purposes.openai-main=llm",
                           "secrets.employees.purposes.tg-\\*=channel",
                           "secrets.employees.purposes.orders=http:api.orders.example")  # fmt: skip
    held = {}
    for d in of_kind(docs, "Deployment"):
        env = charts.env_of(charts.pod_spec(d)["containers"][0])
        if "EVENTOS_SECRETS_PURPOSES" in env:
            held[d["metadata"]["name"].removeprefix(f"{P}-")] = env["EVENTOS_SECRETS_PURPOSES"][
                "value"
            ]
    assert set(held) == CALLERS[tier], "ingress (apply) and every role that resolves a secret"
    assert set(held.values()) == {"openai-main=llm orders=http:api.orders.example tg-*=channel"}


def test_a_bad_secret_purpose_fails_the_render() -> None:
    with pytest.raises(charts.RenderError) as caught:
        charts.render(charts.INSTANCE_CHART, (charts.TIER_FILES["S"],),
                      (*charts.REQUIRED, "secrets.employees.purposes.openai-main=anything"))  # fmt: skip
    assert "secrets.employees.purposes.openai-main" in str(caught.value)
