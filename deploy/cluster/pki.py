"""The cluster's certificates (made with openssl, P-256 keys) and the kubeconfigs that use them."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from layout import API_PORT, API_SERVICE_IP, CLUSTER_DOMAIN, NODE_NAME, Layout

DAYS = "30"


@dataclass(frozen=True)
class Client:
    """A client certificate: its file name, user (CN) and groups (O)."""

    name: str
    user: str
    groups: tuple[str, ...] = ()


# The identities the default RBAC policy of Kubernetes already knows.
CLIENTS = (
    Client("admin", "eventos-admin", ("system:masters",)),
    Client("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",)),
    Client("controller-manager", "system:kube-controller-manager"),
    Client("scheduler", "system:kube-scheduler"),
    Client("kube-proxy", "system:kube-proxy"),
    Client("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)),
    # kube-router watches pods, namespaces and policies cluster-wide (a local cluster's shortcut).
    Client("kube-router", "system:kube-router", ("system:masters",)),
    # The aggregator's identity towards metrics-server (--requestheader-allowed-names).
    Client("front-proxy-client", "front-proxy-client"),
)


def openssl(*args: str) -> None:
    """Run openssl, failing with its own message."""
    result = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def new_key(path: Path) -> None:
    """A P-256 private key."""
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(path))
    path.chmod(0o600)


def make_ca(pki: Path) -> None:
    """A self-signed CA that signs every certificate of the cluster."""
    new_key(pki / "ca.key")
    openssl(
        "req", "-x509", "-new", "-key", str(pki / "ca.key"), "-subj", "/CN=eventos-local-k8s-ca",
        "-days", DAYS, "-out", str(pki / "ca.crt"),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip


def sign(pki: Path, name: str, subject: str, extensions: str) -> None:
    """A key and a certificate signed by the CA: <name>.key, <name>.crt."""
    new_key(pki / f"{name}.key")
    (pki / f"{name}.ext").write_text(extensions)
    openssl("req", "-new", "-key", str(pki / f"{name}.key"), "-subj", subject,
            "-out", str(pki / f"{name}.csr"))  # fmt: skip
    openssl(
        "x509", "-req", "-in", str(pki / f"{name}.csr"), "-CA", str(pki / "ca.crt"),
        "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", DAYS,
        "-extfile", str(pki / f"{name}.ext"), "-out", str(pki / f"{name}.crt"),
    )  # fmt: skip


def make_apiserver_cert(pki: Path) -> None:
    """The apiserver's serving certificate: loopback and the `kubernetes` Service's names."""
    service = f"kubernetes.default.svc.{CLUSTER_DOMAIN}"
    sans = f"IP:127.0.0.1,IP:{API_SERVICE_IP},DNS:localhost,DNS:kubernetes,"
    sans += f"DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:{service}"
    sign(pki, "apiserver", "/CN=kube-apiserver", _extensions("serverAuth", sans))


def make_client_cert(pki: Path, client: Client) -> None:
    """A client certificate whose CN is the user and whose O entries are the groups."""
    subject = "".join(f"/O={g}" for g in client.groups) + f"/CN={client.user}"
    sign(pki, client.name, subject, _extensions("clientAuth"))


def _extensions(usage: str, sans: str = "") -> str:
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        lines.append(f"subjectAltName={sans}")
    return "\n".join(lines) + "\n"


def make_pki(layout: Layout) -> None:
    """Every certificate, the service account signing key, and one kubeconfig per client."""
    pki = layout.pki
    pki.mkdir(parents=True, exist_ok=True)
    make_ca(pki)
    make_apiserver_cert(pki)
    for client in CLIENTS:
        make_client_cert(pki, client)
        write_kubeconfig(layout, client.name, conf_path(layout, client.name))
    new_key(pki / "service-account.key")
    openssl("ec", "-in", str(pki / "service-account.key"), "-pubout",
            "-out", str(pki / "service-account.pub"))  # fmt: skip
    write_kubeconfig(layout, "admin", layout.kubeconfig)


def conf_path(layout: Layout, client: str) -> Path:
    """The kubeconfig of one client."""
    return layout.conf / f"{client}.kubeconfig"


def write_kubeconfig(layout: Layout, client: str, path: Path) -> None:
    """A kubeconfig (JSON is YAML) pointing at the apiserver on loopback with a client cert."""
    pki = layout.pki
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "eventos-local", "cluster": {
            "server": f"https://127.0.0.1:{API_PORT}",
            "certificate-authority": str(pki / "ca.crt"),
        }}],
        "users": [{"name": client, "user": {
            "client-certificate": str(pki / f"{client}.crt"),
            "client-key": str(pki / f"{client}.key"),
        }}],
        "contexts": [{"name": "eventos-local",
                      "context": {"cluster": "eventos-local", "user": client}}],
        "current-context": "eventos-local",
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)
