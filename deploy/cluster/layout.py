"""Where the local cluster keeps everything, and the addresses it uses (all on this machine)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "v1.34.4"
COREDNS_VERSION = "v1.14.7"
PAUSE_IMAGE = "localhost/eventos/pause:3.10.1"
COREDNS_IMAGE = f"localhost/eventos/coredns:{COREDNS_VERSION}"
METRICS_SERVER_VERSION = "v0.8.0"
KUBE_ROUTER_VERSION = "v2.1.0"
METRICS_SERVER_IMAGE = f"localhost/eventos/metrics-server:{METRICS_SERVER_VERSION}"
# KEDA (the class workers' autoscaler): installed by `cluster.py keda`, not by `up`.
KEDA_VERSION = "v2.21.0"
KEDA_IMAGE = f"localhost/eventos/keda:{KEDA_VERSION}"
KEDA_METRICS_IMAGE = f"localhost/eventos/keda-metrics-apiserver:{KEDA_VERSION}"

# A private pod range on a bridge routed nowhere (pods get no default route, ipMasq is off), and
# a private Service range that exists only in kube-proxy's rules.
BRIDGE = "eventos-k8s0"
CNI_NETWORK = "eventos-k8s"
POD_CIDR = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
SERVICE_CIDR = "10.96.0.0/24"
API_SERVICE_IP = "10.96.0.1"
DNS_SERVICE_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
NODE_NAME = "127.0.0.1"
API_PORT = 6443
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
# Our own DNAT table (the `kubernetes` Service IP -> the apiserver on loopback).
NAT_TABLE = "eventos-k8s"
# Static local volumes: folders on this machine, so a size is a label, not a quota. Large enough
# for any claim the charts make (the bundled PostgreSQL asks 20Gi), many enough for every release
# the k8s suite installs in one run (a released volume is kept, policy Retain).
VOLUME_COUNT = 20
VOLUME_SIZE = "100Gi"
# metrics-server runs on the host network, on the bridge's own address: the apiserver reaches it
# there (Endpoints may not name loopback) and nothing outside the machine can.
METRICS_PORT = 4443


@dataclass(frozen=True)
class Layout:
    """The folders and files of one cluster under .eventos/k8s and the tools under .tools."""

    state: Path
    tools: Path

    @classmethod
    def default(cls) -> Layout:
        """The repo's .eventos/k8s and .tools."""
        return cls(state=REPO / ".eventos" / "k8s", tools=REPO / ".tools")

    @property
    def bin(self) -> Path:
        """The Kubernetes binaries built by `make cluster-tools`."""
        return self.tools / "k8s" / K8S_VERSION / "bin"

    @property
    def kube_router(self) -> Path:
        """kube-router, built by `make cluster-tools`."""
        return self.tools / "k8s" / f"kube-router-{KUBE_ROUTER_VERSION}" / "kube-router"

    @property
    def keda(self) -> Path:
        """KEDA's binaries and rendered manifests, built by `make keda-tools`."""
        return self.tools / "k8s" / f"keda-{KEDA_VERSION}"

    @property
    def images(self) -> Path:
        """The pause and CoreDNS image archives built by `make cluster-tools`."""
        return self.tools / "k8s" / "images"

    @property
    def logs(self) -> Path:
        """One log file per component."""
        return self.state / "logs"

    @property
    def pki(self) -> Path:
        """The cluster's CA, certificates and service account key."""
        return self.state / "pki"

    @property
    def conf(self) -> Path:
        """Config files and kubeconfigs of the components."""
        return self.state / "conf"

    @property
    def run(self) -> Path:
        """Sockets."""
        return self.state / "run"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig for kubectl."""
        return self.state / "kubeconfig"

    @property
    def containerd_socket(self) -> Path:
        """The containerd socket (only the kubelet, ctr and this program use it)."""
        return self.run / "containerd.sock"

    @property
    def pids_file(self) -> Path:
        """Every process `up` started: name -> pid."""
        return self.state / "pids.json"

    @property
    def host_before(self) -> Path:
        """The host as `up` found it, which `down` restores and checks."""
        return self.state / "host-before.json"

    @property
    def volumes(self) -> Path:
        """The folders behind the static local PersistentVolumes."""
        return self.state / "volumes"

    def kubectl(self) -> list[str]:
        """kubectl on the admin kubeconfig."""
        return [str(self.bin / "kubectl"), "--kubeconfig", str(self.kubeconfig)]

    def ctr(self) -> list[str]:
        """containerd's ctr in the CRI namespace of this cluster's containerd."""
        return ["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io"]


def read_json(path: Path) -> dict[str, object]:
    """A JSON object from a file, or an empty one when the file is absent."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON object expected")
    return data
