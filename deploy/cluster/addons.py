"""What the cluster runs on top of its processes: CoreDNS and the `local` StorageClass."""

from __future__ import annotations

from typing import Any

from layout import (
    CLUSTER_DOMAIN,
    COREDNS_IMAGE,
    DNS_SERVICE_IP,
    NODE_NAME,
    VOLUME_COUNT,
    VOLUME_SIZE,
    Layout,
)

Manifest = dict[str, Any]

# No forward plugin and no upstream: cluster names are answered from the API, every other name
# gets NXDOMAIN made here, so no query leaves the machine.
COREFILE = f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    errors
    health :8080
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
    }}
    prometheus :9153
    cache 30
    loadbalance
}}
.:53 {{
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def meta(name: str, namespace: str | None = "kube-system", **labels: str) -> dict[str, Any]:
    """metadata with the app label."""
    data: dict[str, Any] = {"name": name, "labels": {"k8s-app": "kube-dns", **labels}}
    if namespace:
        data["namespace"] = namespace
    return data


def coredns_rbac() -> list[Manifest]:
    """CoreDNS reads Services, EndpointSlices, Pods and Namespaces."""
    rules = [
        {"apiGroups": [""], "resources": ["services", "pods", "namespaces", "endpoints"],
         "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "verbs": ["list", "watch"]},
    ]  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta("coredns")},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": meta("system:coredns", None), "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": meta("system:coredns", None),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]},
    ]  # fmt: skip


def coredns_pod_spec() -> dict[str, Any]:
    """One CoreDNS container from the locally built image, probed on its health ports."""
    ports = [{"name": "dns", "containerPort": 53, "protocol": "UDP"},
             {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"}]  # fmt: skip
    container = {
        "name": "coredns",
        "image": COREDNS_IMAGE,
        "imagePullPolicy": "Never",
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": ports,
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}},
        "resources": {"requests": {"cpu": "50m", "memory": "40Mi"},
                      "limits": {"memory": "170Mi"}},
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
    }  # fmt: skip
    return {
        "serviceAccountName": "coredns",
        "dnsPolicy": "Default",
        "priorityClassName": "system-cluster-critical",
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
    }


def coredns() -> list[Manifest]:
    """CoreDNS as a Deployment behind the kube-dns Service on the kubelet's clusterDNS IP."""
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("coredns"),
        "spec": {"replicas": 1, "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                 "template": {"metadata": {"labels": {"k8s-app": "kube-dns"}},
                              "spec": coredns_pod_spec()}},
    }  # fmt: skip
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": meta("kube-dns"),
        "spec": {"clusterIP": DNS_SERVICE_IP, "selector": {"k8s-app": "kube-dns"},
                 "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                           {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]},
    }  # fmt: skip
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("coredns"),
              "data": {"Corefile": COREFILE}}  # fmt: skip
    return [*coredns_rbac(), config, deployment, service]


def storage(layout: Layout) -> list[Manifest]:
    """A default `local` StorageClass and static local PersistentVolumes on node 127.0.0.1."""
    storage_class = {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "local",
                     "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Retain",
    }  # fmt: skip
    return [storage_class, *(local_volume(layout, i) for i in range(VOLUME_COUNT))]


def local_volume(layout: Layout, index: int) -> Manifest:
    """One static volume: a folder under .eventos/k8s/volumes, on node 127.0.0.1 only."""
    folder = layout.volumes / f"pv-{index:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    affinity = {
        "required": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}
                    ]
                }
            ]
        }
    }
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": f"local-{index:02d}"},
        "spec": {"capacity": {"storage": VOLUME_SIZE}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "local",
                 "volumeMode": "Filesystem", "local": {"path": str(folder)},
                 "nodeAffinity": affinity},
    }  # fmt: skip


def as_list(manifests: list[Manifest]) -> Manifest:
    """A v1 List that one `kubectl apply -f -` takes."""
    return {"apiVersion": "v1", "kind": "List", "items": manifests}
