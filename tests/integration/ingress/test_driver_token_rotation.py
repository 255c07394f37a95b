"""A driver's token rotates under a running ingress (issue 29 point 6): after its file is
rewritten the new token publishes, the previous one still does for the overlap window, and is
refused after it."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import grpc
from conftest import PURPOSES, ingress_config, run_service
from eventos_ingress.app import build
from grpc_calls import ACCEPTED, event, publish

from eventos.secret_purposes import VAR as PURPOSES_VAR
from eventos.settings import DatabaseSettings, SecretStore
from eventos.testing import wait_for

OLD, NEW = "driver-token-old-0123456789", "driver-token-new-9876543210"
OVERLAP_S = 10  # the checks inside the window take milliseconds; the refusal waits it out
SEQ = itertools.count(1)


def write_token(folder: Path, value: str) -> None:
    staged = folder / ".driver-drv-1.new"
    staged.write_text(value + "\n")
    os.replace(staged, folder / "driver-drv-1")  # in one step, as the kubelet does


async def accepts(target: str, token: str) -> bool:
    """Whether a Publish with `token` is acknowledged (False: refused as unauthenticated)."""
    seq = next(SEQ)
    try:
        acks = await publish(target, [event(seq, f"rot-{seq}")], token)
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc
        return False
    assert [a.status for a in acks] == [ACCEPTED], acks
    return True


async def test_a_rotated_driver_token_is_accepted_for_the_window_then_refused(
    started: str, db_settings: DatabaseSettings, tmp_path: Path
) -> None:
    folder = tmp_path / "secrets"
    folder.mkdir(mode=0o700)
    write_token(folder, OLD)
    env = {PURPOSES_VAR: PURPOSES, "EVENTOS_SECRETS_OVERLAP_S": str(OVERLAP_S),
           "EVENTOS_SECRETS_RECHECK_S": "0"}  # fmt: skip
    cfg = ingress_config(db_settings, tmp_path, secrets=SecretStore(env=env, directory=folder))
    service = await build(cfg)
    task = await run_service(service)
    target = f"127.0.0.1:{service.bound_grpc_port}"
    try:
        assert await accepts(target, OLD)
        write_token(folder, NEW)

        async def new_works() -> bool:
            return await accepts(target, NEW)

        await wait_for(new_works, timeout=30, interval=0.2, what="the new token accepted")
        assert await accepts(target, OLD), "the previous token refused within the window"

        async def old_refused() -> bool:
            return not await accepts(target, OLD)

        await wait_for(old_refused, timeout=OVERLAP_S + 30, interval=0.5, what="old refused")
        assert await accepts(target, NEW)
    finally:
        service.stop()
        await task
