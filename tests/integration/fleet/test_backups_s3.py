"""Backups to a real S3-compatible server (SeaweedFS, tests/s3_server.py): take, list, restore;
a truncated dump, a partial upload and refused credentials each fail with an error naming what
failed (docs/backups.md)."""

from __future__ import annotations

import io

import pytest
from fleet_helpers import app, note, notes, settings_for  # noqa: F401 (app: a fixture)
from s3_server import S3Server, s3_server_fixture  # noqa: F401 (the fixture)

from eventos.fleet.backups import (
    MANIFEST,
    BackupCorrupt,
    BackupNotFound,
    list_backups,
    restore_backup,
    take_backup,
)
from eventos.fleet.stores import StoreError
from eventos.settings import BackupSettings


def s3_settings(app: str, server: S3Server, bucket: str, **given: str) -> BackupSettings:
    keys = {"s3_access_key": server.access_key, "s3_secret_key": server.secret_key, **given}
    return settings_for(app, f"s3://{bucket}/instance-1", s3_endpoint=server.endpoint, **keys)


async def test_an_s3_backup_is_listed_and_restores(app: str, s3_server: S3Server) -> None:
    bucket = s3_server.bucket()
    settings = s3_settings(app, s3_server, bucket)
    note(app, "before")
    first = await take_backup(settings, reason="test")
    note(app, "after")
    second = await take_backup(settings, reason="test")
    assert [b.id for b in await list_backups(settings)] == [second.id, first.id]
    names = {o.object_name for o in s3_server.client().list_objects(bucket, recursive=True)}
    assert f"instance-1/{first.id}/{MANIFEST}" in names
    assert f"instance-1/{first.id}/app.dump" in names

    report = await restore_backup(settings, first.id)
    assert notes(app) == ["before"]
    assert report.databases == ("app",)


async def test_a_truncated_object_or_a_partial_upload_is_refused(
    app: str, s3_server: S3Server
) -> None:
    bucket = s3_server.bucket()
    settings = s3_settings(app, s3_server, bucket)
    note(app, "before")
    backup = await take_backup(settings, reason="test")
    note(app, "after")
    client = s3_server.client()
    key = f"instance-1/{backup.id}/app.dump"
    answer = client.get_object(bucket, key)
    whole = answer.read()
    answer.close()
    client.put_object(bucket, key, io.BytesIO(whole[:100]), 100)
    with pytest.raises(BackupCorrupt, match=r"app\.dump has 100 bytes, the manifest says"):
        await restore_backup(settings, backup.id)

    client.remove_object(bucket, f"instance-1/{backup.id}/{MANIFEST}")
    assert await list_backups(settings) == []
    with pytest.raises(BackupNotFound, match="it has no manifest"):
        await restore_backup(settings, backup.id)
    assert notes(app) == ["before", "after"]


async def test_refused_credentials_and_a_missing_bucket_are_named(
    app: str, s3_server: S3Server
) -> None:
    bucket = s3_server.bucket()
    wrong = s3_settings(app, s3_server, bucket, s3_secret_key="not-the-secret")
    with pytest.raises(StoreError, match=rf"uploading .*app\.dump in s3://{bucket}/instance-1"):
        await take_backup(wrong, reason="test")
    missing = s3_settings(app, s3_server, "no-such-bucket")
    with pytest.raises(StoreError, match="the bucket 'no-such-bucket' does not exist"):
        await take_backup(missing, reason="test")
