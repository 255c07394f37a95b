"""The cluster's processes: their config files and command lines, in the order they start."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from layout import (
    API_PORT,
    API_SERVICE_IP,
    BRIDGE,
    CLUSTER_DOMAIN,
    CNI_NETWORK,
    DNS_SERVICE_IP,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    NAT_TABLE,
    NODE_NAME,
    PAUSE_IMAGE,
    POD_CIDR,
    POD_GATEWAY,
    SERVICE_CIDR,
    Layout,
)
from pki import conf_path

CNI_PLUGINS = Path("/usr/lib/cni")  # Debian's containernetworking-plugins


@dataclass(frozen=True)
class Component:
    """One process of the cluster: its name (and log file), command line and listening ports."""

    name: str
    argv: list[str]
    ports: tuple[int, ...] = field(default=())


def write_json(path: Path, data: object) -> Path:
    """A config file in JSON (which every component's YAML reader accepts)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def containerd_config(layout: Layout) -> Path:
    """containerd's own root, state and socket; the CRI plugin on our CNI folder."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    text = f"""version = 2
root = "{layout.state / "containerd" / "root"}"
state = "{layout.state / "containerd" / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{layout.containerd_socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{layout.state / "containerd" / "opt"}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # The machine lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj (-998 for a sandbox).
  restrict_oom_score_adj = true
  enable_selinux = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_PLUGINS}"
  conf_dir = "{layout.conf / "cni"}"
"""
    path = layout.conf / "containerd.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def cni_config(layout: Layout) -> Path:
    """A bridge with no masquerade; pods get routes to the pod and Service ranges only."""
    return write_json(layout.conf / "cni" / "10-eventos.conflist", {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": True,
            "isDefaultGateway": False,
            "ipMasq": False,
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "dataDir": str(layout.state / "cni" / "ipam"),
                "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                "routes": [{"dst": SERVICE_CIDR}],
            },
        }],
    })  # fmt: skip


def etcd(layout: Layout) -> Component:
    """Debian's etcd on loopback, its data under the cluster's state."""
    peer = f"http://127.0.0.1:{ETCD_PEER_PORT}"
    client = f"http://127.0.0.1:{ETCD_CLIENT_PORT}"
    return Component("etcd", [
        "etcd", "--name", "eventos", "--data-dir", str(layout.state / "etcd"),
        "--listen-client-urls", client, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"eventos={peer}",
    ], (ETCD_CLIENT_PORT, ETCD_PEER_PORT))  # fmt: skip


def containerd(layout: Layout) -> Component:
    """containerd on its own socket and root (not the host's default ones)."""
    return Component("containerd", ["containerd", "--config", str(containerd_config(layout))])


def apiserver(layout: Layout) -> Component:
    """The apiserver, answering on 127.0.0.1 only."""
    pki = layout.pki
    return Component("kube-apiserver", [
        str(layout.bin / "kube-apiserver"),
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={API_PORT}",
        f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
        f"--service-account-key-file={pki / 'service-account.pub'}",
        f"--service-account-signing-key-file={pki / 'service-account.key'}",
        "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
        # The aggregation layer (metrics-server), straight to the endpoint, not via kube-proxy.
        f"--requestheader-client-ca-file={pki / 'ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        "--enable-aggregator-routing=true",
        "--allow-privileged=true", "--profiling=false",
    ], (API_PORT,))  # fmt: skip


def controller_manager(layout: Layout) -> Component:
    """The controllers, one identity per controller (service account credentials)."""
    kubeconfig = conf_path(layout, "controller-manager")
    return Component("kube-controller-manager", [
        str(layout.bin / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
        f"--service-account-private-key-file={layout.pki / 'service-account.key'}",
        f"--root-ca-file={layout.pki / 'ca.crt'}", "--use-service-account-credentials=true",
        f"--service-cluster-ip-range={SERVICE_CIDR}", "--allocate-node-cidrs=false",
        "--leader-elect=false", "--profiling=false",
    ], (10257,))  # fmt: skip


def scheduler(layout: Layout) -> Component:
    """The scheduler."""
    kubeconfig = conf_path(layout, "scheduler")
    return Component("kube-scheduler", [
        str(layout.bin / "kube-scheduler"),
        f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
        "--leader-elect=false", "--profiling=false",
    ], (10259,))  # fmt: skip


def kubelet_config(layout: Layout) -> Path:
    """cgroupfs on cgroup v1, everything on loopback, state and pod logs under .eventos/k8s."""
    return write_json(layout.conf / "kubelet.json", {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "address": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(layout.pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [DNS_SERVICE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        # No host resolv.conf: a pod must not learn a name server outside the machine.
        "resolvConf": "",
        "podLogsDir": str(layout.state / "pod-logs"),
        "failSwapOn": False,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%",
                         "imagefs.available": "2%"},
        "imageGCHighThresholdPercent": 100,
        "serializeImagePulls": False,
    })  # fmt: skip


def kubelet(layout: Layout) -> Component:
    """The kubelet, as node 127.0.0.1 (it refuses --node-ip on loopback)."""
    return Component("kubelet", [
        str(layout.bin / "kubelet"),
        f"--config={kubelet_config(layout)}",
        f"--kubeconfig={conf_path(layout, 'kubelet')}",
        f"--hostname-override={NODE_NAME}",
        f"--root-dir={layout.state / 'kubelet'}",
    ], (10250, 10248))  # fmt: skip


def kube_proxy_config(layout: Layout) -> Path:
    """nftables mode (tables of its own, removed by name); no conntrack sysctl is changed."""
    return write_json(layout.conf / "kube-proxy.json", {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(conf_path(layout, "kube-proxy"))},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_CIDR,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
    })  # fmt: skip


def kube_proxy(layout: Layout) -> Component:
    """kube-proxy: the Service IPs as nftables rules."""
    return Component("kube-proxy", [
        str(layout.bin / "kube-proxy"), f"--config={kube_proxy_config(layout)}",
    ], (10249, 10256))  # fmt: skip


def api_dnat_ruleset() -> str:
    """nft script: the `kubernetes` Service IP to the apiserver on loopback; pods kept in.

    The apiserver advertises 127.0.0.1, which it refuses to publish as the Service's endpoint,
    so kube-proxy has nowhere to send it; pods (from the bridge, where route_localnet is on) and
    host clients are sent to 127.0.0.1:6443 here, before kube-proxy's no-endpoint reject.
    """
    target = f"ip daddr {API_SERVICE_IP} tcp dport 443 dnat to 127.0.0.1:{API_PORT}"
    return f"""table ip {NAT_TABLE} {{
  chain prerouting {{
    type nat hook prerouting priority -120; policy accept;
    iifname "{BRIDGE}" {target}
  }}
  chain output {{
    type nat hook output priority -120; policy accept;
    {target}
  }}
  chain forward {{
    type filter hook forward priority -20; policy accept;
    iifname "{BRIDGE}" oifname != "{BRIDGE}" drop
  }}
}}
"""


def kube_router(layout: Layout) -> Component:
    """kube-router as the NetworkPolicy firewall only (iptables and ipsets on the host).

    No routing, no service proxy, no CNI, no pod egress masquerade; health and metrics servers
    off (they would listen on every address).
    """
    return Component("kube-router", [
        str(layout.kube_router), f"--kubeconfig={conf_path(layout, 'kube-router')}",
        f"--hostname-override={NODE_NAME}", "--run-firewall=true", "--run-router=false",
        "--run-service-proxy=false", "--run-loadbalancer=false", "--enable-cni=false",
        "--enable-pod-egress=false", "--enable-ipv6=false", "--health-port=0",
        "--metrics-port=0", f"--service-cluster-ip-range={SERVICE_CIDR}",
    ])  # fmt: skip


# name -> the function that makes it, in start order.
FACTORIES = {
    "etcd": etcd,
    "containerd": containerd,
    "kube-apiserver": apiserver,
    "kube-controller-manager": controller_manager,
    "kube-scheduler": scheduler,
    "kubelet": kubelet,
    "kube-proxy": kube_proxy,
    "kube-router": kube_router,
}
