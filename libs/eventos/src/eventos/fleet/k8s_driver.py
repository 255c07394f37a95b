"""The upgrader's driver of an instance the chart installed in one Kubernetes namespace: the
`Instance` of eventos.fleet.upgrade, through the `kubernetes` client (docs/upgrades.md).

A release here is an image tag. The driver finds the instance's service Deployments by the
chart's labels (`app.kubernetes.io/instance` = the release name) and each one's service by its
container's name. Stopping scales them to 0 (the replicas they had are kept in an annotation, so
a run that dies half-way leaves them for the next); starting sets each container's image to the
target tag (the same repository), its `EVENTOS_IMAGE_TAG` (what `/readyz` names) and the drill
switch, and its replicas back — or, for the previous release, the container exactly as it was.
The target's own code reads its release, migrates and replays in Jobs made from the ingress
Deployment's pod template (its Secrets, its config, its security) with the target's image, so
the workflow code replayed is the target's. Readiness is the rollout (every replica updated and
Ready) and every pod's `/readyz`, read through the API server's pod proxy, naming the target's
build and tag. The snapshot and its restore run in this process (eventos.fleet.backups), with
the backup settings of the pod the chart's upgrade CronJob runs (docs/backups.md).

At tier L the chart's Temporal Deployment runs the server (its container `temporal`, the image
tagged with the server's version) after its schema step (its init container `schema`, the
admin-tools image of the same version: eventos.temporalSchemaContainer). The version a target
pins is its service image's EVENTOS_TEMPORAL_PIN (`make images` sets it from the Makefile's pin),
read by the Job that reads its release. The schema step of an upgrade is a Job of that init
container on the target version's admin-tools image; the server moves by setting both images'
tags to the target version, and serves once its rollout is done and GetSystemInfo names it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from eventos.errors import ConfigError
from eventos.fleet import checks
from eventos.fleet.backups import restore_backup, take_backup
from eventos.fleet.local_driver import RELEASE_OF
from eventos.fleet.upgrade import SERVICES, GateReport, NeedsReset, ReleaseRef, UpgradeError
from eventos.settings import (
    DRILL_READINESS_FAILURE_VAR,
    IMAGE_TAG_VAR,
    BackupSettings,
    KubernetesUpgradeSettings,
    TemporalSettings,
    UpgradeSettings,
)

T = TypeVar("T")
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
REPLICAS_ANNOTATION = "eventos.dev/upgrade-replicas"  # the replicas a stopped Deployment had
JOB_COMPONENT = "upgrade-step"  # the label of the Jobs' pods (no Service selects them)
TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # an OCI tag
POLL_S = 1.0
PROBE_TIMEOUT_S = 6  # one /readyz answer through the proxy (the service's checks take up to 5 s)
LOG_TAIL = 2000  # characters of a failed Job's log kept in the error
# A pod waiting for one of these will not start by itself: its Job fails now, not at its deadline.
STUCK = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
         "CreateContainerConfigError", "CreateContainerError"}  # fmt: skip
REARM_WAIT_S = 1.0  # as on the local instance: the relay applies a restore's re-arm at its start
READ_RELEASE_S = 180.0  # the Job that reads the target's release
# The migrate Job keeps trying to reach PostgreSQL this long: as the upgrade stops the services
# on a loaded node the database's Service may have no ready endpoint for a moment (a drill on
# the cluster rolled back at `migrate` with "Connection refused").
MIGRATE_WAIT_S = 60
# The release an image holds (RELEASE_OF) and the Temporal version it pins (TEMPORAL_PIN_VAR, read
# by its own settings; an image from before the pin existed pins none).
RELEASE_AND_PIN = (
    f"{RELEASE_OF}; from eventos.settings import ReleaseSettings; "
    "print(json.dumps(getattr(ReleaseSettings.from_env(), 'temporal_pin', '')))"
)
TEMPORAL_COMPONENT = "temporal"  # the chart's component label of the Temporal server
TEMPORAL_CONTAINER = "temporal"  # its server's container (tier L; tier S runs a StatefulSet)
SCHEMA_CONTAINER = "schema"  # its schema step, the init container (eventos.temporalSchemaContainer)


def image_with_tag(image: str, tag: str) -> str:
    """`image` (repository[:tag][@digest]) with its tag replaced by `tag`."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name = name[:colon]
    return f"{name}:{tag}"


def tag_of(image: str) -> str:
    """The tag of an image reference ('' when it has none)."""
    name = image.split("@", 1)[0]
    colon = name.rfind(":")
    return name[colon + 1 :] if colon > name.rfind("/") else ""


@dataclass
class Role:
    """One service Deployment of the instance, as it was before the upgrade touched it."""

    deployment: str
    service: str  # its container's name: one of eventos.fleet.upgrade.SERVICES
    index: int  # the container's index in the pod template
    image: str
    env: list[dict[str, Any]]
    replicas: int
    selector: str  # its pods' label selector
    port: int = 8080  # its container's `http` port (the pod proxy takes a number, not a name)


def job_manifest(template: dict[str, Any], *, name: str, image: str, args: list[str],
                 tag: str, deadline_s: float) -> dict[str, Any]:  # fmt: skip
    """A Job running `args` in `image`, made from a service Deployment's pod template (its
    volumes, config, Secrets and security): one container, no ports or probes, the component
    label of the upgrader's steps (no Service selects its pod), never restarted."""
    spec = json.loads(json.dumps(template["spec"]))
    container = spec["containers"][0]
    for key in ("ports", "readinessProbe", "livenessProbe", "startupProbe", "lifecycle"):
        container.pop(key, None)
    container["image"] = image
    container["args"] = args
    env = [e for e in container.get("env") or [] if e["name"] != IMAGE_TAG_VAR]
    container["env"] = [*env, {"name": IMAGE_TAG_VAR, "value": tag}]
    spec["containers"] = [container]
    spec["restartPolicy"] = "Never"
    spec.pop("initContainers", None)
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    labels[COMPONENT_LABEL] = JOB_COMPONENT
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, int(deadline_s)),
            "ttlSecondsAfterFinished": 3600,
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def start_patch(
    role: Role, image: str, env: list[dict[str, Any]], replicas: int
) -> list[dict[str, Any]]:
    """The JSON patch that runs `role` on `image` with `env`, at `replicas`."""
    container = f"/spec/template/spec/containers/{role.index}"
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": f"{container}/image", "value": image},
        {"op": "add", "path": f"{container}/env", "value": env},
        {"op": "add", "path": "/spec/replicas", "value": replicas},
    ]
    return ops


def target_env(role: Role, tag: str, drill: bool) -> list[dict[str, Any]]:
    """The container's environment on the target: its own, the images' tag the target reports,
    and the drill switch when drilled."""
    drop = {IMAGE_TAG_VAR, DRILL_READINESS_FAILURE_VAR}
    env = [e for e in role.env if e["name"] not in drop]
    env.append({"name": IMAGE_TAG_VAR, "value": tag})
    if drill:
        env.append({"name": DRILL_READINESS_FAILURE_VAR, "value": "1"})
    return env


def rollout_pending(deployment: dict[str, Any]) -> str | None:
    """None when the Deployment's rollout is complete (every replica updated, Ready and no old
    one left), else what is pending."""
    spec, status = deployment["spec"], deployment.get("status") or {}
    want = int(spec.get("replicas") or 0)
    generation = int(deployment["metadata"].get("generation") or 0)
    if int(status.get("observedGeneration") or 0) < generation:
        return "the rollout is not observed yet"
    have = {k: int(status.get(k) or 0) for k in ("replicas", "updatedReplicas", "readyReplicas")}
    if have["updatedReplicas"] < want:
        return f"{have['updatedReplicas']}/{want} replicas updated"
    if have["replicas"] > want:
        return f"{have['replicas'] - want} old replicas still running"
    if have["readyReplicas"] < want:
        return f"{have['readyReplicas']}/{want} replicas Ready"
    return None


@dataclass
class TemporalServer:
    """The chart's Temporal Deployment (tier L), as it was before the upgrade touched it."""

    deployment: str
    image: str  # the server's container's image, tagged with its version
    schema_image: str  # the schema init container's (the admin-tools image of that version)
    replicas: int
    selector: str
    template: dict[str, Any]  # its pod template: the schema Job is made from it

    @property
    def version(self) -> str:
        return tag_of(self.image)

    def patch(self, version: str, replicas: int) -> list[dict[str, Any]]:
        """The JSON patch that runs the server and its schema step on `version`'s images (the
        images it had when `version` is the one it ran), at `replicas`."""
        spec = self.template["spec"]
        server = image_with_tag(self.image, version) if version != self.version else self.image
        ops = [{"op": "add", "path": "/spec/replicas", "value": replicas}]
        for i, c in enumerate(spec["containers"]):
            if c["name"] == TEMPORAL_CONTAINER:
                path = f"/spec/template/spec/containers/{i}/image"
                ops.append({"op": "add", "path": path, "value": server})
        for i, c in enumerate(spec.get("initContainers") or []):
            if c["name"] == SCHEMA_CONTAINER:
                schema = self.schema_image
                schema = image_with_tag(schema, version) if version != self.version else schema
                path = f"/spec/template/spec/initContainers/{i}/image"
                ops.append({"op": "add", "path": path, "value": schema})
        return ops

    def schema_template(self, version: str) -> dict[str, Any]:
        """A pod template holding only the schema step, on `version`'s admin-tools image."""
        spec = json.loads(json.dumps(self.template["spec"]))
        steps = [c for c in spec.get("initContainers") or [] if c["name"] == SCHEMA_CONTAINER]
        if not steps:
            raise UpgradeError(f"Deployment {self.deployment} has no {SCHEMA_CONTAINER!r} init "
                               "container (the chart's Temporal schema step)")  # fmt: skip
        steps[0]["image"] = image_with_tag(self.schema_image, version)
        spec["containers"], spec["initContainers"] = steps, []
        return {"metadata": self.template.get("metadata") or {}, "spec": spec}


def temporal_server(deployment: dict[str, Any]) -> TemporalServer | None:
    """The Temporal server a Deployment of the chart runs (None: it runs none)."""
    meta, spec = deployment["metadata"], deployment["spec"]
    if (meta.get("labels") or {}).get(COMPONENT_LABEL) != TEMPORAL_COMPONENT:
        return None
    template = spec["template"]
    by_name = {c["name"]: c for c in template["spec"]["containers"]}
    inits = {c["name"]: c for c in template["spec"].get("initContainers") or []}
    if TEMPORAL_CONTAINER not in by_name:
        return None
    kept = (meta.get("annotations") or {}).get(REPLICAS_ANNOTATION)
    replicas = int(kept) if kept is not None else int(spec.get("replicas") or 0)
    labels = spec["selector"]["matchLabels"]
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    schema = inits.get(SCHEMA_CONTAINER, {}).get("image", "")
    return TemporalServer(meta["name"], by_name[TEMPORAL_CONTAINER]["image"], schema,
                          max(1, replicas), selector, template)  # fmt: skip


@dataclass(frozen=True)
class _ServerControl:
    """The instance's Temporal server as a restore stops and starts it (a TemporalServerControl
    of eventos.fleet.backups): scaled to 0, then back on `release`'s version."""

    instance: KubernetesInstance
    release: ReleaseRef

    async def stop(self) -> None:
        await self.instance._stop_temporal()

    async def start(self) -> None:
        await self.instance.start_temporal(self.release, self.instance.settings.rollback_ready_s)


@dataclass
class KubernetesInstance:
    """An instance the chart installed: its release's Deployments in one namespace."""

    where: KubernetesUpgradeSettings
    settings: UpgradeSettings = field(default_factory=UpgradeSettings)
    roles: dict[str, Role] = field(default_factory=dict)  # by Deployment name
    template: dict[str, Any] = field(default_factory=dict)  # the ingress pod template
    temporal: TemporalServer | None = None  # tier L's Temporal server
    old: ReleaseRef | None = None
    api: k8s.ApiClient | None = None

    def __post_init__(self) -> None:
        if not self.where.namespace:
            raise ConfigError("which namespace? EVENTOS_UPGRADE_NAMESPACE or --namespace "
                              "(a pod of the chart's upgrade CronJob uses its own)")  # fmt: skip
        if not self.where.release:
            raise ConfigError("which release of the chart? EVENTOS_UPGRADE_RELEASE or "
                              "--release (the app.kubernetes.io/instance label)")  # fmt: skip

    @property
    def ns(self) -> str:
        return self.where.namespace

    def _client(self) -> k8s.ApiClient:
        if self.api is None:
            if self.where.in_cluster and not self.where.kubeconfig:
                k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
                self.api = k8s.ApiClient()
            else:
                self.api = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
                    self.where.kubeconfig or None
                )
        return self.api

    async def _call(self, what: str, call: Callable[[], T]) -> T:
        """One API call, off the event loop; UpgradeError naming `what` when it fails."""
        try:
            return await asyncio.to_thread(call)
        except ApiException as exc:
            said = f"{exc.status} {exc.reason}: {str(exc.body)[:300]}"
            raise UpgradeError(f"{what}: {said}") from None

    def _apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self._client())

    def _core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self._client())

    def _batch(self) -> k8s.BatchV1Api:
        return k8s.BatchV1Api(self._client())

    def _plain(self, obj: Any) -> Any:
        return self._client().sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]

    # -- releases ------------------------------------------------------------------------

    async def _deployments(self) -> list[dict[str, Any]]:
        selector = f"{INSTANCE_LABEL}={self.where.release}"
        listed = await self._call(
            "listing the Deployments",
            lambda: self._apps().list_namespaced_deployment(self.ns, label_selector=selector),
        )
        return [self._plain(d) for d in listed.items]

    async def _pods(self, selector: str) -> list[Any]:
        listed = await self._call(
            f"listing the pods {selector}",
            lambda: self._core().list_namespaced_pod(self.ns, label_selector=selector),
        )
        return list(listed.items)

    async def current(self) -> ReleaseRef:
        self.roles.clear()
        self.temporal = None
        for d in await self._deployments():
            self.temporal = self.temporal or temporal_server(d)
            containers = d["spec"]["template"]["spec"]["containers"]
            for i, c in enumerate(containers):
                if c["name"] not in SERVICES:
                    continue
                kept = (d["metadata"].get("annotations") or {}).get(REPLICAS_ANNOTATION)
                replicas = int(kept) if kept is not None else int(d["spec"].get("replicas") or 0)
                labels = d["spec"]["selector"]["matchLabels"]
                name = d["metadata"]["name"]
                selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
                env = list(c.get("env") or [])
                ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
                self.roles[name] = Role(name, c["name"], i, c["image"], env, replicas, selector,
                                        int(ports.get("http", 8080)))  # fmt: skip
                if c["name"] == "ingress":
                    self.template = d["spec"]["template"]
        missing = sorted(set(SERVICES) - {r.service for r in self.roles.values()})
        if missing or not self.template:
            raise UpgradeError(f"release {self.where.release} in {self.ns} has no Deployment of "
                               f"{', '.join(missing) or 'ingress'}")  # fmt: skip
        tags = {tag_of(r.image) for r in self.roles.values()}
        if len(tags) != 1:
            raise UpgradeError(f"the services run different image tags ({', '.join(sorted(tags))})"
                               ": finish or undo that change first")  # fmt: skip
        ingress = next(r for r in self.roles.values() if r.service == "ingress")
        ref = await self._release_of(ingress.image, tags.pop())
        running = self.temporal.version if self.temporal else ""
        self.old = dataclasses.replace(ref, temporal=running)
        return self.old

    async def install(self, target: str) -> ReleaseRef:
        if not TAG.fullmatch(target):
            raise UpgradeError(f"{target!r} is not an image tag")
        self._backups()  # the snapshot's store must be there before anything changes
        ingress = next(r for r in self.roles.values() if r.service == "ingress")
        return await self._release_of(image_with_tag(ingress.image, target), target)

    async def _release_of(self, image: str, tag: str) -> ReleaseRef:
        """The release `image` holds, as its own Python reads it (a Job), with the Temporal
        version it pins (its TEMPORAL_PIN_VAR) where the instance runs its own server."""
        args = ["python", "-c", RELEASE_AND_PIN]
        out = await self._job("release", image, tag, args, READ_RELEASE_S)
        try:
            *_, line, pin_line = out.strip().splitlines()
            rel, pin = json.loads(line), json.loads(pin_line)
        except ValueError:
            raise UpgradeError(f"{image} printed no release: {out[-500:]!r}") from None
        return ReleaseRef(name=tag, source=image, build=str(rel["build"]),
                          migrations=int(rel["migrations"]),
                          temporal=str(pin) if self.temporal else "")  # fmt: skip

    # -- Jobs ----------------------------------------------------------------------------

    async def _job(self, step: str, image: str, tag: str, args: list[str], timeout_s: float,
                   template: dict[str, Any] | None = None) -> str:  # fmt: skip
        """Run `args` in `image` as a Job made from `template` (the ingress pod template unless
        given); its log. UpgradeError when it fails, cannot start, or outlives `timeout_s`."""
        name = f"{self.where.release}-upgrade-{step}-{secrets.token_hex(3)}"[-63:].lstrip("-")
        body = job_manifest(template or self.template, name=name, image=image, args=args,
                            tag=tag, deadline_s=timeout_s)  # fmt: skip
        await self._call(f"creating Job {name}",
                         lambda: self._batch().create_namespaced_job(self.ns, body))  # type: ignore[arg-type]  # fmt: skip
        try:
            code, pod = await self._wait_job(name, timeout_s + 30)
            log = await self._call(
                f"reading the log of {pod}",
                lambda: self._core().read_namespaced_pod_log(pod, self.ns),
            )
            if code != 0:
                raise UpgradeError(f"Job {name} ({' '.join(args[:3])}) exited {code}: "
                                   f"{log[-LOG_TAIL:]}")  # fmt: skip
            return str(log)
        finally:
            await self._call(f"deleting Job {name}", lambda: self._batch().delete_namespaced_job(
                name, self.ns, propagation_policy="Background"))  # fmt: skip

    async def _wait_job(self, name: str, timeout_s: float) -> tuple[int, str]:
        """The exit code of the Job's pod and its name, once it ended."""
        deadline = time.monotonic() + timeout_s
        while True:
            for pod in await self._pods(f"job-name={name}"):
                for status in pod.status.container_statuses or []:
                    if status.state.terminated is not None:
                        return int(status.state.terminated.exit_code), pod.metadata.name
                    waiting = status.state.waiting
                    if waiting is not None and waiting.reason in STUCK:
                        raise UpgradeError(f"Job {name} cannot start: {waiting.reason}: "
                                           f"{(waiting.message or '')[:300]}")  # fmt: skip
            if time.monotonic() > deadline:
                raise UpgradeError(f"Job {name} did not finish within {timeout_s:g}s")
            await asyncio.sleep(POLL_S)

    # -- the services --------------------------------------------------------------------

    async def _patch(self, name: str, body: Any) -> None:
        await self._call(
            f"patching Deployment {name}",
            lambda: self._apps().patch_namespaced_deployment(name, self.ns, body),
        )

    async def stop(self) -> None:
        for role in self.roles.values():
            annotation = {"metadata": {"annotations": {REPLICAS_ANNOTATION: str(role.replicas)}},
                          "spec": {"replicas": 0}}  # fmt: skip
            await self._patch(role.deployment, annotation)
        deadline = time.monotonic() + self.settings.stop_s + 60.0
        while left := await self._pods_left():
            if time.monotonic() > deadline:
                raise UpgradeError(f"pods still running after the stop: {', '.join(left[:10])}")
            await asyncio.sleep(POLL_S)

    async def _pods_left(self) -> list[str]:
        left = []
        for role in self.roles.values():
            left += [p.metadata.name for p in await self._pods(role.selector)]
        return left

    async def start(self, release: ReleaseRef, services: tuple[str, ...], drill: bool) -> None:
        back = self.old is not None and release.name == self.old.name and not drill
        for role in self.roles.values():
            if role.service not in services:
                continue
            if back:
                image, env = role.image, role.env
            else:
                image = image_with_tag(role.image, release.name)
                env = target_env(role, release.name, drill)
            ops = start_patch(role, image, env, role.replicas)
            await self._patch(role.deployment, ops)
            drop = {"metadata": {"annotations": {REPLICAS_ANNOTATION: None}}}
            await self._patch(role.deployment, drop)

    async def ready(self, release: ReleaseRef, services: tuple[str, ...], timeout_s: float) -> None:
        roles = [r for r in self.roles.values() if r.service in services]
        deadline = time.monotonic() + timeout_s
        while True:
            pending = {}
            for role in roles:
                said = await self._role_ready(role, release)
                if said is not None:
                    pending[role.deployment] = said
            if not pending:
                return
            if time.monotonic() > deadline:
                said = "; ".join(f"{n}: {why}" for n, why in sorted(pending.items()))
                raise UpgradeError(f"not ready on {release.name} after {timeout_s:g}s: {said}")
            await asyncio.sleep(POLL_S)

    async def _role_ready(self, role: Role, release: ReleaseRef) -> str | None:
        found = await self._call(f"reading Deployment {role.deployment}", lambda: self._apps()
                                 .read_namespaced_deployment(role.deployment, self.ns))  # fmt: skip
        pending = rollout_pending(self._plain(found))
        if pending is not None:
            return pending
        for pod in await self._pods(role.selector):
            said = await self._readyz(f"{pod.metadata.name}:{role.port}", release)
            if said is not None:
                return f"{pod.metadata.name}: {said}"
        return None

    async def _readyz(self, pod: str, release: ReleaseRef) -> str | None:
        """What the pod's `/readyz` says, through the API server's pod proxy (None: ready on
        `release`)."""

        def get() -> tuple[int, str]:
            answer: Any = self._core().connect_get_namespaced_pod_proxy_with_path(
                pod, self.ns, "readyz", _preload_content=False,
                _request_timeout=PROBE_TIMEOUT_S)  # fmt: skip
            raw = answer.read() or answer.data or b""
            return int(answer.status), raw.decode() if isinstance(raw, bytes) else str(raw)

        try:
            status, text = await asyncio.to_thread(get)
        except ApiException as exc:
            status, text = int(exc.status or 0), str(exc.body or "")
        except Exception as exc:  # a timeout, a reset: not ready yet
            return type(exc).__name__
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        return checks.readyz_says(status, body, release.build, release.name)

    # -- the databases -------------------------------------------------------------------

    def _backups(self) -> BackupSettings:
        """The settings of the snapshot and its restore: the pod's backup settings
        (EVENTOS_BACKUP_*, the database's URL, Temporal), re-arming without waiting."""
        try:
            found = BackupSettings.from_env()
        except ConfigError as exc:
            raise UpgradeError(f"the snapshot's settings: {exc}") from None
        return dataclasses.replace(found, rearm_wait_s=REARM_WAIT_S)

    @property
    def database_url(self) -> str:
        return self._backups().app_url()

    async def snapshot(self) -> str:
        to = self.old.name if self.old else "?"
        return (await take_backup(self._backups(), reason=f"before an upgrade from {to}")).id

    async def restore(self, snapshot: str) -> None:
        """Restore the snapshot; at tier L never under a running Temporal server: restore_backup
        has it stopped for the swap and started again on the version its databases were taken
        under (the one it ran before the upgrade; the rollback's start_temporal finds it
        serving) before it clears Temporal as every restore does (docs/backups.md)."""
        server = None
        if self.temporal is not None:
            assert self.old is not None, "current() first"
            server = _ServerControl(self, self.old)
        await restore_backup(self._backups(), snapshot, temporal_server=server)

    # -- Temporal (tier L) ---------------------------------------------------------------

    def _server(self) -> TemporalServer:
        if self.temporal is None:
            where = f"release {self.where.release} in {self.ns}"
            raise UpgradeError(f"{where} runs no Temporal server Deployment (tier S: the "
                               "upgrader does not move its dev server)")  # fmt: skip
        return self.temporal

    async def _temporal_deployment(self) -> dict[str, Any]:
        name = self._server().deployment
        found = await self._call(f"reading Deployment {name}", lambda: self._apps()
                                 .read_namespaced_deployment(name, self.ns))  # fmt: skip
        deployment: dict[str, Any] = self._plain(found)
        return deployment

    async def _stop_temporal(self) -> None:
        """Scale the Temporal server to 0 (its replicas kept in the annotation) and wait until
        no pod of it is left."""
        server = self._server()
        await self._patch(server.deployment, {
            "metadata": {"annotations": {REPLICAS_ANNOTATION: str(server.replicas)}},
            "spec": {"replicas": 0}})  # fmt: skip
        deadline = time.monotonic() + self.settings.stop_s + 60.0
        while left := await self._pods(server.selector):
            if time.monotonic() > deadline:
                names = ", ".join(p.metadata.name for p in left)
                raise UpgradeError(f"Temporal pods still running after the stop: {names}")
            await asyncio.sleep(POLL_S)

    async def update_temporal_schema(self, release: ReleaseRef) -> None:
        server = self._server()
        template = server.schema_template(release.temporal)
        step = template["spec"]["containers"][0]
        await self._job("temporal-schema", step["image"], release.name, step.get("args") or [],
                        self.settings.install_s, template)  # fmt: skip

    async def start_temporal(self, release: ReleaseRef, timeout_s: float) -> None:
        server = self._server()
        await self._patch(server.deployment, server.patch(release.temporal, server.replicas))
        drop = {"metadata": {"annotations": {REPLICAS_ANNOTATION: None}}}
        await self._patch(server.deployment, drop)
        deadline = time.monotonic() + timeout_s
        while pending := rollout_pending(await self._temporal_deployment()):
            if time.monotonic() > deadline:
                raise UpgradeError(f"Temporal's rollout to {release.temporal} not done after "
                                   f"{timeout_s:g}s: {pending}")  # fmt: skip
            await asyncio.sleep(POLL_S)
        left = max(1.0, deadline - time.monotonic())
        await checks.temporal_serves(self._temporal_settings(), release.temporal, left)

    def _temporal_settings(self) -> TemporalSettings:
        return self._backups().temporal or TemporalSettings.from_env()

    async def migrate(self, release: ReleaseRef) -> list[str]:
        out = await self._job("migrate", self._target_image(release), release.name,
                              ["eventosctl", "migrate", "--wait", str(MIGRATE_WAIT_S)],
                              self.settings.install_s)  # fmt: skip
        return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("applied ")]

    async def replay(self, release: ReleaseRef) -> GateReport:
        args = ["python", "-m", "eventos.fleet.replay_gate",
                "--max-runs", str(self.settings.replay_max_runs)]  # fmt: skip
        out = await self._job("replay", self._target_image(release), release.name, args,
                              self.settings.replay_s)  # fmt: skip
        lines = out.strip().splitlines()  # the SDK's core logs to stdout too: the report is last
        try:
            doc = json.loads(lines[-1])
        except (IndexError, ValueError):
            raise UpgradeError(f"the replay gate printed no report: {out[-500:]!r}") from None
        return GateReport(int(doc["replayed"]), list(doc["failed"]), bool(doc["truncated"]))

    def _target_image(self, release: ReleaseRef) -> str:
        ingress = next(r for r in self.roles.values() if r.service == "ingress")
        return image_with_tag(ingress.image, release.name)

    async def generations_of(self, workflow_ids: list[str]) -> list[NeedsReset]:
        return await checks.generations_of(self.database_url, workflow_ids)

    async def workflow_task_completed_since(self, since: datetime) -> bool:
        return await checks.workflow_task_completed_since(self._temporal_settings(), since)
