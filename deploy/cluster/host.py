"""The host as the cluster found it: a snapshot taken by `up`, restored and checked by `down`.

The kubelet changes sysctls and adds firewall chains, the CNI bridge plugin turns on forwarding,
containerd and the kubelet mount and make network namespaces and cgroups. `down` removes each of
these by name and compares the host with the snapshot.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from layout import BRIDGE, NAT_TABLE, Layout

# Sysctls the cluster changes (kubelet: overcommit and panic; bridge CNI: forwarding), restored
# in this order: ip_forward first, since writing it resets every interface's forwarding.
RESTORED_SYSCTLS = (
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.forwarding",
    "net.ipv4.conf.default.forwarding",
    "net.ipv6.conf.all.forwarding",
    "net.ipv6.conf.default.forwarding",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",
)
# Counters and random values that change by themselves.
VOLATILE_SYSCTL = re.compile(
    r"^(kernel\.random\.|fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr|quota\.)|"
    r"kernel\.ns_last_pid|kernel\.pty\.nr|net\.netfilter\.nf_conntrack_count|"
    r"net\.ipv4\.conf\.eth\d+\.forwarding)"
)
# Places outside .eventos/k8s that containerd, the kubelet, CNI and kube-router may write to.
HOST_PATHS = (
    "/run/containerd", "/var/lib/cni", "/var/log/containers", "/var/log/pods", "/var/lib/kubelet",
    "/etc/cni", "/var/lib/containerd", "/var/lib/kube-router",
)  # fmt: skip
# Firewall tables the cluster may create: ours, kube-proxy's, and iptables-nft's (the kubelet).
CLUSTER_TABLES = {("ip", NAT_TABLE), ("ip", "kube-proxy"), ("ip6", "kube-proxy")}
IPTABLES_TABLES = {"filter", "nat", "mangle", "raw", "security"}
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBE_ROUTER_IPSETS = ("KUBE-", "kube-router")
# buildah and podman (the images build, beside the cluster) make and remove these on their own:
# mounts, cgroups, network namespaces and links; they are not the cluster's and not compared.
IMAGE_BUILDER_MOUNTS = ("/var/lib/containers/", "/run/containers/")
IMAGE_BUILDER_CGROUPS = ("buildah-", "libpod")
IMAGE_BUILDER_NETNS = ("netns-",)
IMAGE_BUILDER_LINKS = ("podman", "cni-podman")  # cni-podman0: the bridge of buildah's RUN steps
COUNTER = re.compile(r"counter packets \d+ bytes \d+")


def run(*argv: str) -> str:
    """A command's output ('' when it fails: an absent tool or object is 'nothing here')."""
    result = subprocess.run(argv, capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else ""


def sysctls() -> dict[str, str]:
    """Every sysctl's value, volatile ones left out."""
    values = {}
    for line in run("sysctl", "-a").splitlines():
        key, _, value = line.partition(" = ")
        if not VOLATILE_SYSCTL.match(key):
            values[key] = value.strip()
    return values


def mounts() -> list[str]:
    """Mount points, as /proc/self/mountinfo lists them (but the image builder's)."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if not p.startswith(IMAGE_BUILDER_MOUNTS)]


def nft_ruleset() -> str:
    """`nft list ruleset` without packet counters (they count on in tables older than us)."""
    return COUNTER.sub("counter", run("nft", "list", "ruleset"))


def cgroups() -> list[str]:
    """Top-level cgroups of each v1 controller (the kubelet makes `kubepods` in each)."""
    found = []
    for controller in sorted(CGROUP_ROOT.iterdir()):
        if controller.is_dir() and not controller.is_symlink():
            found += [f"{controller.name}/{c.name}" for c in controller.iterdir()
                      if c.is_dir() and not c.name.startswith(IMAGE_BUILDER_CGROUPS)]  # fmt: skip
    return sorted(found)


def links() -> list[str]:
    """Network interface names."""
    lines = run("ip", "-o", "link").splitlines()
    return [line.split(":")[1].strip().split("@")[0] for line in lines]


def snapshot() -> dict[str, Any]:
    """What the cluster may change on the host."""
    return {
        "sysctls": sysctls(),
        "nft": nft_ruleset(),
        "tables": sorted(run("nft", "list", "tables").split("\n")),
        "links": sorted(link for link in links() if not link.startswith(IMAGE_BUILDER_LINKS)),
        "mounts": sorted(mounts()),
        "netns": sorted(
            p.name
            for p in Path("/run/netns").glob("*")
            if not p.name.startswith(IMAGE_BUILDER_NETNS)
        ),
        "paths": [p for p in HOST_PATHS if Path(p).exists()],
        "cgroups": cgroups(),
        "ipsets": sorted(run("ipset", "list", "-n").split()),
    }


def save_snapshot(layout: Layout) -> None:
    """Record the host before `up` touches it."""
    layout.host_before.write_text(json.dumps(snapshot(), indent=1) + "\n")


def load_snapshot(layout: Layout) -> dict[str, Any]:
    """The host as `up` found it."""
    data: dict[str, Any] = json.loads(layout.host_before.read_text())
    return data


def unmount_cluster_mounts(layout: Layout, before: dict[str, Any]) -> None:
    """Unmount what containerd, the kubelet and CNI mounted, deepest first."""
    roots = (str(layout.state), "/run/netns/", "/run/containerd", "/var/lib/kubelet")
    ours = [m for m in set(mounts()) - set(before["mounts"]) if m.startswith(roots)]
    for point in sorted(ours, key=lambda m: m.count("/"), reverse=True):
        if subprocess.run(["umount", point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)


def delete_netns(before: dict[str, Any]) -> None:
    """Delete the network namespaces containerd made (cni-…) that were not there before."""
    for name in sorted({p.name for p in Path("/run/netns").glob("cni-*")} - set(before["netns"])):
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def delete_firewall(before: dict[str, Any]) -> None:
    """Delete our tables and kube-proxy's; the kubelet's KUBE-* chains, or their new tables."""
    for family, table in CLUSTER_TABLES:
        run("nft", "delete", "table", family, table)
    old_tables = set(before["tables"])
    for line in run("nft", "list", "tables").splitlines():
        _, family, table = line.split()
        if table in IPTABLES_TABLES and family in ("ip", "ip6"):
            _delete_kube_chains(family, table, created=line not in old_tables)


def _delete_kube_chains(family: str, table: str, created: bool) -> None:
    """A table the kubelet made goes whole; in an older one, its KUBE-* chains and jumps go."""
    if created:
        run("nft", "delete", "table", family, table)
        return
    chain = ""
    for line in run("nft", "-a", "list", "table", family, table).splitlines():
        if found := re.match(r"^\s*chain (\S+) \{", line):
            chain = found.group(1)
        elif (jump := re.search(r"jump KUBE-\S+ # handle (\d+)$", line)) and chain:
            run("nft", "delete", "rule", family, table, chain, "handle", jump.group(1))
    listing = run("nft", "list", "table", family, table)
    kube = [c for c in re.findall(r"^\s*chain (\S+) \{", listing, re.MULTILINE)
            if c.startswith("KUBE-")]  # fmt: skip
    for name in kube:  # flush all first: one KUBE chain may jump to another
        run("nft", "flush", "chain", family, table, name)
    for name in kube:
        run("nft", "delete", "chain", family, table, name)


def delete_ipsets(before: dict[str, Any]) -> None:
    """Destroy kube-router's ipsets (after the rules that used them are gone)."""
    for name in sorted(set(run("ipset", "list", "-n").split()) - set(before["ipsets"])):
        if name.startswith(KUBE_ROUTER_IPSETS):
            run("ipset", "destroy", name)


def delete_cgroups(before: dict[str, Any]) -> None:
    """Remove the cgroups the kubelet made (kubepods…), leaves first."""
    for name in sorted(set(cgroups()) - set(before["cgroups"])):
        if Path(name).name.startswith("kubepods"):
            tree = CGROUP_ROOT / name
            for folder in sorted((p for p in tree.rglob("*") if p.is_dir()),
                                 key=lambda p: len(p.parts), reverse=True):  # fmt: skip
                folder.rmdir()
            tree.rmdir()


def restore_sysctls(before: dict[str, Any]) -> None:
    """Write back the sysctls the cluster changed."""
    now = sysctls()
    for key in RESTORED_SYSCTLS:
        if key in before["sysctls"] and now.get(key) != before["sysctls"][key]:
            run("sysctl", "-q", "-w", f"{key}={before['sysctls'][key]}")


def remove_host_paths(before: dict[str, Any]) -> None:
    """Remove the folders outside .eventos/k8s that did not exist before `up`."""
    for path in HOST_PATHS:
        if path not in before["paths"] and Path(path).exists():
            shutil.rmtree(path)


def restore(layout: Layout) -> list[str]:
    """Undo everything the cluster did to the host; return what still differs."""
    before = load_snapshot(layout)
    unmount_cluster_mounts(layout, before)
    delete_netns(before)
    delete_firewall(before)
    run("ip", "link", "delete", BRIDGE)
    delete_ipsets(before)
    delete_cgroups(before)
    restore_sysctls(before)
    remove_host_paths(before)
    return differences(before, snapshot())


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs between two snapshots, one line each."""
    found = []
    for key in ("nft", "tables", "links", "mounts", "netns", "paths", "cgroups", "ipsets"):
        if before[key] != after[key]:
            found.append(f"{key}: before {before[key]!r}, after {after[key]!r}")
    old, new = before["sysctls"], after["sysctls"]
    for key in sorted(set(old) & set(new)):
        if old[key] != new[key]:
            found.append(f"sysctl {key}: before {old[key]}, after {new[key]}")
    return found


def main() -> int:
    """`host.py snapshot` prints one; `host.py compare FILE|-` prints what differs from it."""
    if sys.argv[1] == "snapshot":
        print(json.dumps(snapshot()))
        return 0
    source = sys.stdin.read() if sys.argv[2] == "-" else Path(sys.argv[2]).read_text()
    found = differences(json.loads(source), snapshot())
    print("\n".join(found))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
