"""KEDA in the local cluster: the operator and its metrics apiserver (external.metrics.k8s.io).

`cluster.py keda` installs it into a running cluster, `cluster.py keda-down` removes it; `up`
does not (only the autoscaling test needs it, and its build is long). The manifests are KEDA's
own, rendered by `make keda-tools` from the module zip's config/ (keda.yaml: CRDs, namespace,
RBAC, both Deployments and Services) plus its APIService file. The operator makes its own CA and
certificates (`--enable-cert-rotation`, Secret `kedaorg-certs`) and writes the CA into the
APIService; the apiserver reaches the metrics apiserver at its pod address on the bridge
(`--enable-aggregator-routing`). The APIService goes in last, once the metrics apiserver serves,
and out first: an aggregated API that does not answer stalls namespace deletion cluster-wide.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import images
from layout import KEDA_IMAGE, KEDA_METRICS_IMAGE, Layout
from processes import ClusterError, check, wait_for

NAMESPACE = "keda"
APISERVICE = "v1beta1.external.metrics.k8s.io"
DEPLOYMENTS = ("keda-operator", "keda-metrics-apiserver")
# The operator writes its certificates into a Secret the kubelet then syncs into both pods.
READY_DEADLINE_S = 300


def keda_images(layout: Layout) -> dict[str, Path]:
    """KEDA's one-binary images, built by `make keda-tools`."""
    return {
        KEDA_IMAGE: layout.images / "keda.tar",
        KEDA_METRICS_IMAGE: layout.images / "keda-metrics-apiserver.tar",
    }


def manifests(layout: Layout) -> tuple[Path, Path]:
    """keda.yaml (everything but the APIService) and the APIService, rendered at build time."""
    rendered = (layout.keda / "keda.yaml", layout.keda / "apiservice.yaml")
    missing = [str(path) for path in rendered if not path.exists()]
    if missing:
        raise ClusterError(f"missing {', '.join(missing)}: run `make keda-tools`")
    return rendered


def api_available(layout: Layout) -> bool:
    """Whether the aggregator reports KEDA's external metrics API Available."""
    path = '{.status.conditions[?(@.type=="Available")].status}'
    argv = [*layout.kubectl(), "get", "apiservice", APISERVICE, "-o", f"jsonpath={path}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout == "True"


def install(layout: Layout) -> None:
    """Load the images, apply KEDA, wait for both Deployments, then add and wait for the API."""
    keda_yaml, apiservice_yaml = manifests(layout)
    for name, archive in keda_images(layout).items():
        images.import_archive(layout, archive, name)
    # Server-side: the CRDs are too large for the last-applied annotation of a client apply.
    check([*layout.kubectl(), "apply", "--server-side", "--force-conflicts", "-f", str(keda_yaml)],
          "applying KEDA")  # fmt: skip
    for deployment in DEPLOYMENTS:
        check([*layout.kubectl(), "-n", NAMESPACE, "rollout", "status",
               f"deployment/{deployment}", f"--timeout={READY_DEADLINE_S}s"],
              f"waiting for {deployment}")  # fmt: skip
    check([*layout.kubectl(), "apply", "-f", str(apiservice_yaml)], "applying KEDA's APIService")
    wait_for(f"APIService {APISERVICE} Available", lambda: api_available(layout),
             READY_DEADLINE_S, None)  # fmt: skip


def uninstall(layout: Layout) -> None:
    """The APIService first, then everything keda.yaml created (CRDs and namespace too)."""
    keda_yaml, _ = manifests(layout)
    check([*layout.kubectl(), "delete", "apiservice", APISERVICE, "--ignore-not-found"],
          "deleting KEDA's APIService")  # fmt: skip
    check([*layout.kubectl(), "delete", "-f", str(keda_yaml), "--ignore-not-found",
           f"--timeout={READY_DEADLINE_S}s"], "deleting KEDA")  # fmt: skip
