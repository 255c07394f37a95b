"""The local single-node Kubernetes cluster: `up`, `down`, `status`, `load` (the images again),
`recycle` (released volumes emptied and available again), `import NAME ARCHIVE`, `tag SOURCE
NAME` (a loaded image under another name too: another release's tag), and `keda`/`keda-down`
(KEDA into or out of the running cluster, deploy/cluster/keda.py).

Run with the project's Python: `.venv/bin/python deploy/cluster/cluster.py up` (what `make
cluster` does). Everything lives under .eventos/k8s (component logs in .eventos/k8s/logs) and
answers on 127.0.0.1; pods live on a bridge routed nowhere. `down` leaves the host as `up` found
it and says whether it does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import addons
import components
import host
import images
import keda
import metrics_server
import pki
from dns import query_a
from layout import (
    API_SERVICE_IP,
    BRIDGE,
    CLUSTER_DOMAIN,
    DNS_SERVICE_IP,
    NODE_NAME,
    POD_GATEWAY,
    SERVICE_CIDR,
    Layout,
)
from processes import (
    ClusterError,
    alive,
    check,
    recorded_pids,
    shims_of,
    start,
    stop,
    wait_for,
)

# Stopped in the reverse order.
START_ORDER = tuple(components.FACTORIES)
HOST_TOOLS = ("etcd", "containerd", "runc", "ctr", "nft", "ip", "openssl", "sysctl", "ipset")


def log_of(layout: Layout, name: str) -> Path:
    """The log file of one component."""
    return layout.logs / f"{name}.log"


def say(message: str) -> None:
    """One line of progress."""
    print(f"cluster: {message}", flush=True)


def check_tools(layout: Layout) -> None:
    """Every binary and image archive `up` needs, else the command that provides it."""
    needed = [layout.bin / n for n in ("kube-apiserver", "kubelet", "kubectl")]
    missing = [str(path) for path in [*needed, layout.kube_router] if not path.exists()]
    missing += [str(p) for p in images.cluster_images(layout).values() if not p.exists()]
    if missing:
        raise ClusterError(f"missing {', '.join(missing)}: run `make cluster-tools`")
    absent = [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
    if absent:
        raise ClusterError(f"missing host tools {', '.join(absent)}: run `make cluster-tools`")


def fresh_state(layout: Layout) -> None:
    """Empty data folders; refuse when a cluster from here still runs or was not taken down."""
    running = {n: p for n, p in recorded_pids(layout).items() if alive(p)}
    if running or layout.host_before.exists():
        raise ClusterError(f"a cluster is already up here ({running}): `make cluster-down` first")
    if layout.state.exists():
        host.run("umount", "-R", str(layout.state))  # nothing, unless a crash left mounts
        shutil.rmtree(layout.state)
    for folder in (layout.logs, layout.conf, layout.run, layout.pki, layout.volumes):
        folder.mkdir(parents=True)


def apiserver_ready(layout: Layout) -> bool:
    """Whether the apiserver answers /readyz to the admin."""
    return subprocess.run([*layout.kubectl(), "get", "--raw", "/readyz"],
                          capture_output=True, timeout=10).returncode == 0  # fmt: skip


def etcd_healthy() -> bool:
    """Whether etcd answers its health endpoint."""
    with urllib.request.urlopen("http://127.0.0.1:2379/health", timeout=2) as answer:
        return b'"true"' in answer.read()


def start_and_wait(
    layout: Layout, name: str, ready: Callable[[], bool] | None = None, deadline_s: float = 0
) -> None:
    """Start one component and, when given a check, wait until it holds."""
    start(layout, components.FACTORIES[name](layout))
    if ready is not None:
        wait_for(f"{name} ready", ready, deadline_s, log_of(layout, name))


def load_images(layout: Layout) -> None:
    """Import the cluster's own images, then every archive listed in images.json (an archive
    holding several images once); then drop those images' other tags that earlier loads left."""
    for name, archive in images.cluster_images(layout).items():
        images.import_archive(layout, archive, name)
    listed = images.project_images()
    if not listed:
        say(f"no {images.IMAGES_JSON}: no project images loaded")
    by_archive: dict[Path, list[str]] = {}
    for name, archive in listed.items():
        if not archive.exists():
            raise ClusterError(f"images.json lists {name} at {archive}, which does not exist")
        by_archive.setdefault(archive, []).append(name)
    for archive, names in by_archive.items():
        images.import_archive(layout, archive, *names)
        say(f"loaded {', '.join(names)} from {archive}")
    stale = images.remove_stale(layout, list(listed))
    if stale:
        say(f"removed {len(stale)} images of earlier loads: {', '.join(stale)}")


def prepare_network(layout: Layout) -> None:
    """The pod bridge (made now so route_localnet can be set on it alone), routes and DNAT.

    Host packets to a Service IP kube-proxy has not translated yet go to the bridge, not to the
    default route; nothing arriving from the bridge is forwarded anywhere but back to it.
    """
    check(["ip", "link", "add", BRIDGE, "type", "bridge"], f"creating bridge {BRIDGE}")
    check(["ip", "addr", "add", f"{POD_GATEWAY}/24", "dev", BRIDGE], f"{POD_GATEWAY} on {BRIDGE}")
    check(["ip", "link", "set", BRIDGE, "up"], f"bringing {BRIDGE} up")
    check(["sysctl", "-q", "-w", f"net.ipv4.conf.{BRIDGE}.route_localnet=1"], "route_localnet")
    check(["ip", "route", "add", SERVICE_CIDR, "dev", BRIDGE], f"route {SERVICE_CIDR}")
    ruleset = layout.conf / "api-dnat.nft"
    ruleset.write_text(components.api_dnat_ruleset())
    check(["nft", "-f", str(ruleset)], f"nft -f {ruleset}")


def node_ready(layout: Layout) -> bool:
    """Whether node 127.0.0.1 reports Ready."""
    path = '{.status.conditions[?(@.type=="Ready")].status}'
    out = subprocess.run([*layout.kubectl(), "get", "node", NODE_NAME, "-o", f"jsonpath={path}"],
                         capture_output=True, text=True, timeout=10).stdout  # fmt: skip
    return out == "True"


def dns_answers() -> bool:
    """Whether CoreDNS, through the kube-dns Service, resolves the `kubernetes` Service."""
    name = f"kubernetes.default.svc.{CLUSTER_DOMAIN}"
    return query_a(DNS_SERVICE_IP, name) == [API_SERVICE_IP]


def metrics_api_available(layout: Layout) -> bool:
    """Whether the aggregator reports metrics-server's APIService Available."""
    path = '{.status.conditions[?(@.type=="Available")].status}'
    argv = [
        *layout.kubectl(),
        "get",
        "apiservice",
        "v1beta1.metrics.k8s.io",
        "-o",
        f"jsonpath={path}",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
    return out == "True"


def apply(layout: Layout, manifests: list[addons.Manifest], what: str) -> None:
    """kubectl apply a list of objects."""
    result = subprocess.run([*layout.kubectl(), "apply", "-f", "-"], capture_output=True,
                            text=True, input=json.dumps(addons.as_list(manifests)))  # fmt: skip
    if result.returncode != 0:
        raise ClusterError(f"applying {what} failed: {result.stderr.strip()}")


def recycle(layout: Layout) -> int:
    """Make every Released local volume Available again, emptied: what Kubernetes' deprecated
    Recycle policy did. A claim's data goes when its claim is deleted (a StatefulSet's claims
    outlive `helm uninstall`: delete them first). Returns how many were recycled."""
    listing = subprocess.run([*layout.kubectl(), "get", "pv", "-o", "json"], capture_output=True,
                             text=True, timeout=60, check=True)  # fmt: skip
    recycled = 0
    for pv in json.loads(listing.stdout)["items"]:
        spec, name = pv["spec"], pv["metadata"]["name"]
        if pv["status"].get("phase") != "Released" or spec.get("storageClassName") != "local":
            continue
        folder = Path(spec["local"]["path"])
        if folder.parent.resolve() != layout.volumes.resolve():  # only the folders `up` made
            continue
        for child in folder.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        patch = subprocess.run([*layout.kubectl(), "patch", "pv", name, "--type", "json", "-p",
                                '[{"op": "remove", "path": "/spec/claimRef"}]'],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        if patch.returncode != 0:
            raise ClusterError(f"recycling {name} failed: {patch.stderr.strip()}")
        recycled += 1
    say(f"{recycled} released volume(s) emptied and available again")
    return recycled


def up(layout: Layout) -> None:
    """Bring the cluster up in empty data folders; wait for a Ready node and DNS."""
    began = time.monotonic()
    host.save_snapshot(layout)
    pki.make_pki(layout)
    components.cni_config(layout)
    start_and_wait(layout, "etcd", etcd_healthy, 60)
    sock = layout.containerd_socket
    start_and_wait(layout, "containerd", lambda: check([*layout.ctr(), "version"], "ctr") != "", 60)
    say(f"containerd answers on {sock}")
    load_images(layout)
    start_and_wait(layout, "kube-apiserver", lambda: apiserver_ready(layout), 120)
    say("apiserver ready on https://127.0.0.1:6443")
    start_and_wait(layout, "kube-controller-manager")
    start_and_wait(layout, "kube-scheduler")
    prepare_network(layout)
    start_and_wait(layout, "kubelet")
    start_and_wait(layout, "kube-proxy")
    wait_for("node 127.0.0.1 Ready", lambda: node_ready(layout), 120, log_of(layout, "kubelet"))
    say(f"node {NODE_NAME} Ready after {time.monotonic() - began:.1f} s")
    start_and_wait(layout, "kube-router")  # it looks its node up once, at start
    apply(layout, addons.storage(layout), "the local StorageClass and volumes")
    apply(layout, addons.coredns(), "CoreDNS")
    apply(layout, metrics_server.manifests(), "metrics-server")
    wait_for("CoreDNS answers on 10.96.0.10", dns_answers, 180, log_of(layout, "kubelet"))
    say(f"CoreDNS answers; cluster up in {time.monotonic() - began:.1f} s")
    say("metrics-server applied (its API is Available once it has scraped the kubelet once)")
    say(f"kubeconfig: {layout.kubeconfig}")


def up_or_clean_up(layout: Layout) -> None:
    """`up`; when it fails, take down what it started (the logs stay) and fail."""
    check_tools(layout)
    fresh_state(layout)
    try:
        up(layout)
    except (ClusterError, OSError, subprocess.SubprocessError):
        if layout.host_before.exists():
            say(f"up failed: taking down what it started (logs stay in {layout.logs})")
            down(layout)
        raise


def delete_workloads(layout: Layout) -> None:
    """Delete every pod through the API (and their owners), so the kubelet stops them."""
    kubectl = layout.kubectl()
    kinds = "deployments,statefulsets,daemonsets,replicasets,jobs,cronjobs"
    subprocess.run([*kubectl, "delete", kinds, "--all", "-A", "--wait=false"], capture_output=True)
    subprocess.run([*kubectl, "delete", "pods", "--all", "-A", "--grace-period=5",
                    "--timeout=90s"], capture_output=True)  # fmt: skip
    wait_for("every pod gone", lambda: no_pods(layout), 90, log_of(layout, "kubelet"))
    wait_for("every sandbox stopped", lambda: no_ready_sandboxes(layout), 60,
             log_of(layout, "kubelet"))  # fmt: skip


def no_pods(layout: Layout) -> bool:
    """Whether the API lists no pod."""
    out = subprocess.run([*layout.kubectl(), "get", "pods", "-A", "-o", "name"],
                         capture_output=True, text=True, timeout=10)  # fmt: skip
    return out.returncode == 0 and not out.stdout.strip()


def no_ready_sandboxes(layout: Layout) -> bool:
    """Whether containerd runs no task any more (the kubelet stopped every sandbox)."""
    out = check([*layout.ctr(), "tasks", "ls", "-q"], "ctr tasks ls")
    return not out.split()


def kill_tasks(layout: Layout) -> None:
    """Kill and delete what still runs in containerd (pods the API could not delete)."""
    tasks = subprocess.run([*layout.ctr(), "tasks", "ls", "-q"], capture_output=True, text=True)
    for task in tasks.stdout.split():
        subprocess.run([*layout.ctr(), "tasks", "kill", "-s", "SIGKILL", task], capture_output=True)
        subprocess.run([*layout.ctr(), "tasks", "delete", "-f", task], capture_output=True)


def stop_processes(layout: Layout) -> None:
    """Stop every recorded process, newest first; the shims before containerd."""
    pids = recorded_pids(layout)
    for name in reversed(START_ORDER):
        if name == "containerd" and name in pids and alive(pids[name]):
            kill_tasks(layout)
        if name == "containerd":
            for shim in shims_of(layout):
                stop(shim, "containerd-shim-runc-v2", grace_s=5)
        if name in pids:
            stop(pids[name], name)


def down(layout: Layout) -> int:
    """Take the cluster down and leave the host as `up` found it; 1 when something differs."""
    if not layout.host_before.exists():
        say("no cluster here (no host snapshot): nothing to do")
        return 0
    pids = recorded_pids(layout)
    if "kube-apiserver" in pids and alive(pids["kube-apiserver"]) and apiserver_ready(layout):
        try:
            delete_workloads(layout)
        except ClusterError as error:  # go on: the processes must stop all the same
            say(f"warning: {error}")
    stop_processes(layout)
    differences = host.restore(layout)
    layout.host_before.rename(layout.state / "host-before.last.json")
    layout.pids_file.unlink(missing_ok=True)
    if differences:
        say("the host differs from before `up`:\n  " + "\n  ".join(differences))
        return 1
    say("down; the host is as before (sysctls, nft ruleset, links, mounts, netns, cgroups)")
    return 0


def status(layout: Layout) -> None:
    """Each recorded process alive or not, then the nodes and pods."""
    for name, pid in recorded_pids(layout).items():
        say(f"{name:24} pid {pid:7} {'running' if alive(pid) else 'NOT RUNNING'}")
    if layout.kubeconfig.exists():
        subprocess.run([*layout.kubectl(), "get", "nodes,pods", "-A", "-o", "wide"])
        available = metrics_api_available(layout)
        say(f"metrics API (metrics-server): {'Available' if available else 'not available'}")


def main() -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__)
    commands = ("up", "down", "status", "load", "recycle", "import", "tag", "keda", "keda-down")
    parser.add_argument("command", choices=commands)
    parser.add_argument("args", nargs="*", help="import: NAME ARCHIVE; tag: SOURCE NAME")
    options = parser.parse_args()
    layout = Layout.default()
    if os.geteuid() != 0:
        print("cluster: needs root (containerd, the kubelet, nftables, mounts)", file=sys.stderr)
        return 1
    try:
        if options.command == "up":
            up_or_clean_up(layout)
        elif options.command == "down":
            return down(layout)
        elif options.command == "status":
            status(layout)
        elif options.command == "load":
            load_images(layout)
        elif options.command == "recycle":
            recycle(layout)
        elif options.command == "keda":
            keda.install(layout)
            say(f"KEDA up: {keda.APISERVICE} Available")
        elif options.command == "keda-down":
            keda.uninstall(layout)
            say("KEDA removed")
        elif options.command == "tag":
            source, name = options.args
            images.tag(layout, source, name)
        else:
            name, archive = options.args
            images.import_archive(layout, Path(archive), name)
    except (ClusterError, OSError, subprocess.SubprocessError) as error:
        print(f"cluster {options.command}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
