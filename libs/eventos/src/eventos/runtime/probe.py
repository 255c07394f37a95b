"""`python -m eventos.runtime.probe`: whether services answer Ready, one line per target.

Each `--http NAME=URL` is asked `GET URL/readyz` (ready: 200) and each `--grpc NAME=HOST:PORT`
`grpc.health.v1.Health/Check` for the server as a whole (ready: SERVING), each with a timeout,
and asked again every second until it is ready or `--wait` seconds have passed since the start
(a new pod's traffic may be let through by the NetworkPolicy agent only a moment after it
starts). The exit status is 1 when any target is not ready, 2 on bad arguments. The chart's
`helm test` runs it in a pod of the release (deploy/helm/eventos/templates/tests/).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

TIMEOUT_S = 5.0
WAIT_S = 60.0
RETRY_S = 1.0
MAX_BODY = 2048  # of a /readyz answer shown when it is not ready

Check = Callable[[str, float], tuple[bool, str]]  # an address and a timeout -> ready, detail


def http_ready(url: str, timeout_s: float) -> tuple[bool, str]:
    """GET `url`/readyz: ready on 200; otherwise the status and the start of the body."""
    target = url.rstrip("/") + "/readyz"
    try:
        with urllib.request.urlopen(target, timeout=timeout_s) as answer:
            return answer.status == 200, f"{answer.status}"
    except urllib.error.HTTPError as exc:
        body = exc.read(MAX_BODY).decode("utf-8", "replace").strip()
        return False, f"{exc.code} {body}"
    except (urllib.error.URLError, OSError) as exc:
        return False, f"unreachable: {getattr(exc, 'reason', exc)}"


def grpc_ready(address: str, timeout_s: float) -> tuple[bool, str]:
    """grpc.health.v1 Check of the whole server (service ""): ready when SERVING."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError as exc:
            return False, f"{exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, status


def target(text: str) -> tuple[str, str]:
    """NAME=ADDRESS."""
    name, sep, address = text.partition("=")
    if not sep or not name or not address:
        raise argparse.ArgumentTypeError(f"expected NAME=ADDRESS, got {text!r}")
    return name, address


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eventos.runtime.probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--http", type=target, action="append", default=[], metavar="NAME=URL")
    parser.add_argument("--grpc", type=target, action="append", default=[],
                        metavar="NAME=HOST:PORT")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per attempt")
    parser.add_argument(
        "--wait", type=float, default=WAIT_S, help="seconds within which every target is ready"
    )
    args = parser.parse_args(argv)
    if not args.http and not args.grpc:
        parser.error("name at least one --http or --grpc target")
    checks: list[tuple[str, str, str, Check]] = [
        ("http", name, addr, http_ready) for name, addr in args.http
    ]
    checks += [("grpc", name, addr, grpc_ready) for name, addr in args.grpc]
    deadline = time.monotonic() + args.wait
    failed = 0
    for kind, name, address, check in checks:
        ok, detail = check(address, args.timeout)
        while not ok and time.monotonic() + RETRY_S < deadline:
            time.sleep(RETRY_S)
            ok, detail = check(address, args.timeout)
        failed += not ok
        print(f"{'ready' if ok else 'NOT READY':9}  {kind:4}  {name:20}  {address}  {detail}")
    print(f"{len(checks) - failed} of {len(checks)} ready")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
