"""The instance chart's daily backup CronJob (docs/backups.md): off by default; to a bucket with
its keys from a Secret, or to a volume; Temporal's databases too at tier L; non-root, read-only,
no ServiceAccount token, secrets only as files; refused without a store."""

from __future__ import annotations

import re

import charts
import pytest
from charts import Doc, RenderError, env_of, named, of_kind

P = "acme-eventos"
S3 = (
    "backups.enabled=true",
    "backups.store=s3://acme-backups/inst-7f3a",
    "backups.s3.endpoint=https://s3.eu-central-1.amazonaws.com",
    "backups.s3.existingSecret=acme-backup-store",
)
VOLUME = (
    "backups.enabled=true",
    "backups.store=file:///backups/inst-7f3a",
    "backups.volume.existingClaim=acme-backups",
)


def pod(cronjob: Doc) -> Doc:
    spec: Doc = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return spec


def test_no_backup_cronjob_unless_enabled() -> None:
    assert of_kind(charts.instance("S"), "CronJob") == []


def test_a_daily_backup_to_a_bucket_reads_its_keys_from_a_mounted_secret() -> None:
    job = named(charts.instance("S", *S3), "CronJob", f"{P}-backup")
    assert job["spec"]["schedule"] == "0 2 * * *"
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    spec = pod(job)
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    container = spec["containers"][0]
    assert container["args"] == ["eventosctl", "backup", "--reason", "daily"]
    env = {k: v.get("value") for k, v in env_of(container).items()}
    assert env["EVENTOS_BACKUP_STORE"] == "s3://acme-backups/inst-7f3a"
    assert env["EVENTOS_BACKUP_S3_ENDPOINT"] == "https://s3.eu-central-1.amazonaws.com"
    assert env["EVENTOS_BACKUP_PG_BIN"] == "/pgtools/lib/postgresql-16/bin"
    assert "EVENTOS_BACKUP_TEMPORAL_DATABASE_URL" not in env  # tier S: Temporal is rebuilt (I10)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for var in ("EVENTOS_BACKUP_S3_ACCESS_KEY_FILE", "EVENTOS_BACKUP_S3_SECRET_KEY_FILE",
                "EVENTOS_DATABASE_URL_FILE"):  # fmt: skip
        assert env[var].startswith(mounts["backup-store" if "S3" in var else "database"])
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["backup-store"]["secret"]["secretName"] == "acme-backup-store"
    # pg_dump of PostgreSQL 16 comes from the PostgreSQL image by an init container.
    assert spec["initContainers"][0]["volumeMounts"] == [
        {"name": "pgtools", "mountPath": "/pgtools"}
    ]


@pytest.mark.parametrize("tier", ["S", "L"])
def test_the_backup_pod_reads_the_services_config_the_release_and_temporals_address(
    tier: str,
) -> None:
    """The manifest keeps the release record of the code that took the backup, and a restore
    run from this template reconciles Temporal: both come from the services' ConfigMap."""
    docs = charts.instance(tier, *S3)
    container = pod(named(docs, "CronJob", f"{P}-backup"))["containers"][0]
    assert container["envFrom"] == [{"configMapRef": {"name": f"{P}-config"}}]
    config = named(docs, "ConfigMap", f"{P}-config")["data"]
    for var in ("EVENTOS_IMAGE_TAG", "EVENTOS_CHART_VERSION", "EVENTOS_TEMPORAL_SERVER",
                "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE"):  # fmt: skip
        assert config[var], var
    assert "EVENTOS_DATABASE_URL" not in config  # the URL stays in its Secret's file


def test_a_backup_to_a_volume_mounts_its_claim() -> None:
    spec = pod(named(charts.instance("S", *VOLUME), "CronJob", f"{P}-backup"))
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["backups"]["persistentVolumeClaim"]["claimName"] == "acme-backups"
    env = env_of(spec["containers"][0])
    assert "EVENTOS_BACKUP_S3_ENDPOINT" not in env
    assert {"name": "backups", "mountPath": "/backups"} in spec["containers"][0]["volumeMounts"]


def test_tier_l_backs_up_temporals_databases_with_the_servers_password_file() -> None:
    spec = pod(named(charts.instance("L", *S3), "CronJob", f"{P}-backup"))
    env = {k: v.get("value") for k, v in env_of(spec["containers"][0]).items()}
    assert env["EVENTOS_BACKUP_TEMPORAL_DATABASE_URL"] == (
        "host=pg.acme.internal port=5432 user=temporal dbname=temporal"
    )
    assert env["EVENTOS_BACKUP_TEMPORAL_VISIBILITY_DATABASE_URL"].endswith(
        "dbname=temporal_visibility"
    )
    assert env["EVENTOS_BACKUP_TEMPORAL_PASSWORD_FILE"].endswith("/temporal-sql/password")
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["temporal-sql"]["secret"]["secretName"] == "acme-temporal-sql"


@pytest.mark.parametrize("tier", ["S", "L"])
def test_the_backup_pod_runs_as_every_pod_of_the_chart(tier: str) -> None:
    spec = pod(named(charts.instance(tier, *S3), "CronJob", f"{P}-backup"))
    for container in spec["initContainers"] + spec["containers"]:
        ctx = {**spec["securityContext"], **container["securityContext"]}
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] != 0
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["allowPrivilegeEscalation"] is False
        for env in container.get("env", []):
            assert "valueFrom" not in env
            assert not re.search(r"PASSWORD|KEY|TOKEN|SECRET", env["name"]) or env["name"].endswith(
                ("_FILE", "PG_BIN")
            ), env["name"]
            assert not re.search(r"://[^/\s]*:[^/\s]*@", str(env.get("value"))), env["name"]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("backups.enabled=true",), "backups.store is required"),
        (("backups.enabled=true", "backups.store=s3://b"), "backups.s3.endpoint is required"),
        (
            ("backups.enabled=true", "backups.store=s3://b", "backups.s3.endpoint=http://s3:8333"),
            "backups.s3.existingSecret is required",
        ),
        (
            ("backups.enabled=true", "backups.store=file:///backups"),
            "backups.volume.existingClaim is required",
        ),
        (("backups.enabled=true", "backups.store=ftp://x"), "backups.store"),
    ],
)
def test_a_backup_without_its_store_fails_the_render(sets: tuple[str, ...], message: str) -> None:
    with pytest.raises(RenderError, match=re.escape(message)):
        charts.instance("S", *sets)
