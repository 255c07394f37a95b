"""metrics-server for the HPA and `kubectl top`: a host-network pod on the bridge's address.

The apiserver's aggregation layer reaches it through a selector-less Service whose Endpoints
name the bridge gateway (Endpoints may not name 127.0.0.1); it reads each kubelet's stats on the
node's address, 127.0.0.1:10250 (the kubelet's certificate is self-signed, hence insecure TLS).
"""

from __future__ import annotations

from typing import Any

from layout import METRICS_PORT, METRICS_SERVER_IMAGE, POD_GATEWAY

Manifest = dict[str, Any]
NAME = "metrics-server"
SYSTEM = {"name": NAME, "namespace": "kube-system", "labels": {"k8s-app": NAME}}


def binding(kind: str, name: str, role_kind: str, role: str) -> Manifest:
    """A (Cluster)RoleBinding of metrics-server's service account."""
    metadata: dict[str, Any] = {"name": name}
    if kind == "RoleBinding":
        metadata["namespace"] = "kube-system"
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": "kube-system"}],
    }  # fmt: skip


def rbac() -> list[Manifest]:
    """Read nodes' metrics and list pods and nodes; delegate authentication to the apiserver."""
    rules = [
        {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": SYSTEM},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:metrics-server"}, "rules": rules},
        binding("ClusterRoleBinding", "system:metrics-server", "ClusterRole",
                "system:metrics-server"),
        binding("ClusterRoleBinding", "metrics-server:system:auth-delegator", "ClusterRole",
                "system:auth-delegator"),
        binding("RoleBinding", "metrics-server-auth-reader", "Role",
                "extension-apiserver-authentication-reader"),
    ]  # fmt: skip


def container() -> dict[str, Any]:
    """metrics-server on the bridge gateway, scraping kubelets on their InternalIP."""
    probe = {"httpGet": {"host": POD_GATEWAY, "port": METRICS_PORT, "scheme": "HTTPS",
                         "path": "/readyz"}, "periodSeconds": 2}  # fmt: skip
    return {
        "name": NAME,
        "image": METRICS_SERVER_IMAGE,
        "imagePullPolicy": "Never",
        "args": [
            "--cert-dir=/tmp", f"--secure-port={METRICS_PORT}", f"--bind-address={POD_GATEWAY}",
            "--kubelet-preferred-address-types=InternalIP", "--kubelet-insecure-tls",
            "--kubelet-use-node-status-port", "--metric-resolution=15s",
        ],
        "ports": [{"name": "https", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "readinessProbe": probe,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "resources": {"requests": {"cpu": "50m", "memory": "50Mi"}},
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
    }  # fmt: skip


def deployment() -> Manifest:
    """One replica on the host network."""
    pod = {
        "serviceAccountName": NAME, "hostNetwork": True,
        "priorityClassName": "system-cluster-critical",
        "containers": [container()], "volumes": [{"name": "tmp", "emptyDir": {}}],
    }  # fmt: skip
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": SYSTEM,
        "spec": {"replicas": 1, "selector": {"matchLabels": {"k8s-app": NAME}},
                 "template": {"metadata": {"labels": {"k8s-app": NAME}}, "spec": pod}},
    }  # fmt: skip


def api() -> list[Manifest]:
    """The Service (no selector), its Endpoints on the gateway, and the APIService."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": SYSTEM,
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": METRICS_PORT}]},
    }
    endpoints = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": SYSTEM,
        "subsets": [
            {"addresses": [{"ip": POD_GATEWAY}], "ports": [{"name": "https", "port": METRICS_PORT}]}
        ],
    }
    api_service = {
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.metrics.k8s.io"},
        "spec": {"service": {"name": NAME, "namespace": "kube-system", "port": 443},
                 "group": "metrics.k8s.io", "version": "v1beta1",
                 "insecureSkipTLSVerify": True, "groupPriorityMinimum": 100,
                 "versionPriority": 100},
    }  # fmt: skip
    return [service, endpoints, api_service]


def manifests() -> list[Manifest]:
    """Everything metrics-server needs."""
    return [*rbac(), deployment(), *api()]
