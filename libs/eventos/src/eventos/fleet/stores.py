"""Where backups are kept: a folder (`file:///path`, a mounted volume) or an S3-compatible bucket
(`s3://bucket/prefix`). Both hold one folder per backup; every call is bounded in time and in
what it reads, and every failure is a StoreError naming the store and the object."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import MinioException, S3Error

from eventos.errors import EventOSError
from eventos.settings import BackupSettings

T = TypeVar("T")
LIST_MAX = 10_000  # folders (backups) a listing reads at most
CHUNK = 1024 * 1024
MISSING_CODES = frozenset({"NoSuchKey", "NoSuchObject"})


class StoreError(EventOSError):
    """The backup store failed."""


class BackupStore(Protocol):
    """One folder per backup under the store's root; keys are `folder/file`."""

    @property
    def where(self) -> str:
        """The store's URL, without credentials."""
        ...

    async def put_file(self, key: str, source: Path) -> None: ...
    async def get_file(self, key: str, dest: Path, max_bytes: int) -> None: ...
    async def put_bytes(self, key: str, data: bytes) -> None: ...
    async def get_bytes(self, key: str, max_bytes: int) -> bytes | None: ...
    async def folders(self) -> list[str]: ...
    async def remove(self, folder: str) -> None: ...


def open_store(settings: BackupSettings) -> BackupStore:
    """The store `settings.store` names."""
    parsed = urllib.parse.urlsplit(settings.store)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise StoreError(f"a file store is file:///absolute/path, got {settings.store!r}")
        return VolumeStore(Path(urllib.parse.unquote(parsed.path)), settings)
    return S3Store.from_settings(settings)


async def _bounded(what: str, timeout_s: float, call: Callable[[], T]) -> T:
    """`call` in a thread, given up after `timeout_s` (the thread's own socket timeouts end it)."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(call), timeout_s)
    except TimeoutError:
        raise StoreError(f"{what}: no answer within {timeout_s:g} s") from None


def _copy_bounded(source: Path, dest: Path, max_bytes: int) -> None:
    """Copy at most `max_bytes` (more is an error) to `dest`, through a partial file."""
    partial = dest.with_name(dest.name + ".partial")
    copied = 0
    with source.open("rb") as src, partial.open("wb") as out:
        while chunk := src.read(CHUNK):
            copied += len(chunk)
            if copied > max_bytes:
                raise StoreError(f"{source} is larger than the {max_bytes} bytes expected")
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    partial.replace(dest)


@dataclass
class VolumeStore:
    """Backups in a folder (a mounted volume); each file lands by an atomic rename."""

    root: Path
    settings: BackupSettings

    @property
    def where(self) -> str:
        return f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / key

    def _io(self, what: str, call: Callable[[], T]) -> Callable[[], T]:
        def run() -> T:
            try:
                return call()
            except OSError as exc:
                raise StoreError(f"{what} in {self.where}: {exc.strerror or exc}") from None

        return run

    async def put_file(self, key: str, source: Path) -> None:
        dest = self._path(key)

        def put() -> None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            _copy_bounded(source, dest, source.stat().st_size)

        await _bounded(
            f"writing {key}", self.settings.transfer_timeout_s, self._io(f"writing {key}", put)
        )

    async def get_file(self, key: str, dest: Path, max_bytes: int) -> None:
        await _bounded(
            f"reading {key}",
            self.settings.transfer_timeout_s,
            self._io(f"reading {key}", lambda: _copy_bounded(self._path(key), dest, max_bytes)),
        )

    async def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)

        def put() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".partial")
            with partial.open("wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            partial.replace(path)

        await _bounded(
            f"writing {key}", self.settings.call_timeout_s, self._io(f"writing {key}", put)
        )

    async def get_bytes(self, key: str, max_bytes: int) -> bytes | None:
        path = self._path(key)

        def get() -> bytes | None:
            if not path.is_file():
                return None
            with path.open("rb") as f:
                data = f.read(max_bytes + 1)
            if len(data) > max_bytes:
                raise StoreError(f"{key} in {self.where} is over {max_bytes} bytes")
            return data

        return await _bounded(
            f"reading {key}", self.settings.call_timeout_s, self._io(f"reading {key}", get)
        )

    async def folders(self) -> list[str]:
        def listing() -> list[str]:
            if not self.root.is_dir():
                return []
            found = []
            for entry in os.scandir(self.root):
                if entry.is_dir():
                    found.append(entry.name)
                    if len(found) >= LIST_MAX:
                        break
            return found

        return await _bounded("listing", self.settings.call_timeout_s, self._io("listing", listing))

    async def remove(self, folder: str) -> None:
        target = self._path(folder)
        await _bounded(
            f"removing {folder}",
            self.settings.transfer_timeout_s,
            self._io(f"removing {folder}", lambda: shutil.rmtree(target)),
        )


@dataclass
class S3Store:
    """Backups in an S3-compatible bucket under a prefix (MinIO's client: multipart uploads,
    signed requests); its HTTP pool bounds connecting and each read, and retries a failed
    call a few times before the error names it."""

    client: Minio
    endpoint: str
    bucket: str
    prefix: str
    settings: BackupSettings = field(repr=False)

    @classmethod
    def from_settings(cls, settings: BackupSettings) -> S3Store:
        parsed = urllib.parse.urlsplit(settings.store)
        endpoint = urllib.parse.urlsplit(settings.s3_endpoint)
        if not parsed.netloc:
            raise StoreError(f"an S3 store is s3://bucket[/prefix], got {settings.store!r}")
        if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
            raise StoreError(f"the S3 endpoint is http(s)://host[:port], got {endpoint.geturl()!r}")
        pool = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=settings.call_timeout_s, read=settings.call_timeout_s),
            retries=urllib3.Retry(
                total=3, backoff_factor=0.5, status_forcelist=(500, 502, 503, 504)
            ),
        )
        client = Minio(
            endpoint.netloc,
            access_key=settings.s3_access_key,
            secret_key=settings.s3_secret_key,
            secure=endpoint.scheme == "https",
            region=settings.s3_region or None,
            http_client=pool,
        )
        return cls(client, endpoint.geturl(), parsed.netloc, parsed.path.strip("/"), settings)

    @property
    def where(self) -> str:
        path = f"{self.bucket}/{self.prefix}".rstrip("/")
        return f"s3://{path} at {self.endpoint}"

    def _name(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _s3(self, what: str, call: Callable[[], T]) -> Callable[[], T]:
        def run() -> T:
            try:
                return call()
            except S3Error as exc:
                if exc.code == "NoSuchBucket":
                    text = f"the bucket {self.bucket!r} does not exist (create it first)"
                else:
                    text = f"{exc.code}: {exc.message}"
                raise StoreError(f"{what} in {self.where}: {text}") from None
            except (MinioException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                raise StoreError(f"{what} in {self.where}: {exc}") from None

        return run

    async def put_file(self, key: str, source: Path) -> None:
        await _bounded(
            f"uploading {key}",
            self.settings.transfer_timeout_s,
            self._s3(
                f"uploading {key}",
                lambda: self.client.fput_object(self.bucket, self._name(key), str(source)),
            ),
        )

    async def get_file(self, key: str, dest: Path, max_bytes: int) -> None:
        def get() -> None:
            size = self.client.stat_object(self.bucket, self._name(key)).size or 0
            if size > max_bytes:
                raise StoreError(f"{key} in {self.where} has {size} bytes, over {max_bytes}")
            self.client.fget_object(self.bucket, self._name(key), str(dest))

        await _bounded(
            f"downloading {key}",
            self.settings.transfer_timeout_s,
            self._s3(f"downloading {key}", get),
        )

    async def put_bytes(self, key: str, data: bytes) -> None:
        def put() -> None:
            self.client.put_object(self.bucket, self._name(key), io.BytesIO(data), len(data))

        await _bounded(
            f"uploading {key}", self.settings.call_timeout_s, self._s3(f"uploading {key}", put)
        )

    async def get_bytes(self, key: str, max_bytes: int) -> bytes | None:
        def get() -> bytes | None:
            try:
                answer = self.client.get_object(self.bucket, self._name(key), length=max_bytes + 1)
            except S3Error as exc:
                if exc.code in MISSING_CODES:
                    return None
                raise
            try:
                data = answer.read(max_bytes + 1)
            finally:
                answer.close()
                answer.release_conn()
            if len(data) > max_bytes:
                raise StoreError(f"{key} in {self.where} is over {max_bytes} bytes")
            return data

        return await _bounded(
            f"reading {key}", self.settings.call_timeout_s, self._s3(f"reading {key}", get)
        )

    async def folders(self) -> list[str]:
        def listing() -> list[str]:
            root = f"{self.prefix}/" if self.prefix else ""
            found = []
            for obj in self.client.list_objects(self.bucket, prefix=root):
                name = (obj.object_name or "")[len(root) :]
                if obj.is_dir and name.strip("/"):
                    found.append(name.strip("/"))
                    if len(found) >= LIST_MAX:
                        break
            return found

        return await _bounded("listing", self.settings.call_timeout_s, self._s3("listing", listing))

    async def remove(self, folder: str) -> None:
        def remove() -> None:
            names = self.client.list_objects(
                self.bucket, prefix=self._name(folder) + "/", recursive=True
            )
            doomed = [DeleteObject(o.object_name) for o in names if o.object_name]
            for error in self.client.remove_objects(self.bucket, doomed):
                raise StoreError(f"removing {error.name}: {error.message}")

        await _bounded(
            f"removing {folder}",
            self.settings.transfer_timeout_s,
            self._s3(f"removing {folder}", remove),
        )
