"""Router drain against the ingress's own saturation rate, measured in the same run.

    .venv/bin/python bench/router.py [--quick] [--sat-duration S] [--paths N] [--py-spy OUT]

Starts a durable embedded PostgreSQL (unless EVENTOS_DATABASE_URL is set) and the real ingress
service with no router, declares `--paths` hmac-sha256 webhook paths (generic rate limits
lifted), then:

1. saturation (closed loop, --concurrency connections, bench/loadgen.py) for --sat-duration
   seconds: the ingress's accepted webhooks/s, with nothing routing them; the rows wait;
2. drain: the real router service (`python -m eventos_router`) starts on that backlog, the
   ingress idle; its rate is the settled rows over the time from its first pass's start (the
   earliest `routed_at`) to the moment no row is left accepted (the database's clock).

Prints both rates and their ratio against the target of issue 12 (router drain >= 3x the
ingress's saturation rate). With --py-spy, py-spy records the router during the drain (raw
collapsed stacks to OUT) and the top frames are printed. A MISS does not fail the run.
"""

from __future__ import annotations

import argparse
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg
from harness import (
    ROOT,
    BenchError,
    CpuMeter,
    Stack,
    apply_employee,
    cpu_summary,
    fmt,
    interrupt_guard,
    parse_with_quick,
    progress,
    scalar,
    start_ingress,
    start_router,
    table,
    verdict,
)
from ingress import SECRET_REF, SECRET_VALUE, SIGNATURE_HEADER, employee_specs, run_load

DRAIN_RATIO_TARGET = 3.0
TOP_FRAMES = 15


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sat-duration", type=float, default=15.0, help="saturation phase, s (15)")
    p.add_argument("--concurrency", type=int, default=64, help="saturation connections (64)")
    p.add_argument("--paths", type=int, default=256, help="webhook paths = sources (256)")
    p.add_argument("--body-bytes", type=int, default=1024, help="JSON body size (1024)")
    p.add_argument("--py-spy", type=Path, help="record the router's drain with py-spy (raw)")
    args = parse_with_quick(p, {"sat_duration": 1.0, "paths": 16}, argv)
    if args.sat_duration <= 0 or args.concurrency <= 0 or args.paths <= 0:
        p.error("--sat-duration, --concurrency and --paths must be positive")
    return args


def saturate(args: argparse.Namespace, port: int, paths: list[str], tag: str) -> float:
    """Accepted webhooks/s of the ingress at saturation."""
    cfg = {
        "host": "127.0.0.1", "port": port, "paths": paths, "secret": SECRET_VALUE,
        "signature_header": SIGNATURE_HEADER, "id_prefix": f"{tag}-sat-",
        "body_bytes": args.body_bytes, "mode": "closed", "duration": args.sat_duration,
        "concurrency": args.concurrency, "warmup": 0.5,
    }  # fmt: skip
    result = run_load("saturation", cfg)
    progress(f"saturation: {result['ok_per_s']:.0f} ok/s, {result['accepted']} accepted")
    return float(result["ok_per_s"])


def py_spy_binary() -> str:
    found = shutil.which("py-spy") or str(ROOT / ".tools" / "bin" / "py-spy")
    if not Path(found).exists():
        raise BenchError("--py-spy: no py-spy on PATH nor in .tools/bin")
    return found


def top_frames(raw: Path) -> list[list[object]]:
    """(function, % of samples on the stack, % of samples at the top) from collapsed stacks."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += int(n)
        own[frames[-1]] += int(n)
        for frame in set(frames):
            inclusive[frame] += int(n)
    rows = sorted(inclusive, key=lambda f: (-own[f], -inclusive[f]))[:TOP_FRAMES]
    share = [[f, fmt(100 * inclusive[f] / total), fmt(100 * own[f] / total)] for f in rows]
    return [*share, ["(samples)", total, ""]]


def drained_at(url: str, source_like: str, timeout: float) -> float:
    """The database's clock (epoch s) when no row of the sources is left accepted, polled
    every 20 ms with a cheap probe (the first accepted row, by the router's own index)."""
    probe = ("SELECT NOT EXISTS (SELECT 1 FROM bus_ingress WHERE status = 'accepted' AND "
             "source_key LIKE %s), extract(epoch FROM clock_timestamp())")  # fmt: skip
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            done, at = conn.execute(probe.encode(), (source_like,)).fetchone() or (False, 0)
            if done:
                return float(at)
            if time.monotonic() > deadline:
                raise BenchError(f"the router left rows unrouted after {timeout:.0f}s")
            time.sleep(0.02)


def drain_rate(url: str, source_like: str, done_at: float) -> tuple[int, float]:
    """(rows the router settled, rows/s from its first pass's start to the last row settled)."""
    where = " FROM bus_ingress WHERE source_key LIKE %s AND routed_at IS NOT NULL"
    rows = scalar(url, "SELECT count(*)" + where, (source_like,))
    first_us = scalar(url, "SELECT extract(epoch FROM min(routed_at)) * 1e6" + where,
                      (source_like,))  # fmt: skip
    span = done_at - first_us / 1e6
    return rows, rows / span if span > 0 else float("nan")


def run(args: argparse.Namespace, stack: Stack) -> None:
    url = stack.database()
    tag = "d" + secrets.token_hex(3)
    env = {"EVENTOS_SECRET_" + SECRET_REF.upper().replace("-", "_"): SECRET_VALUE,
           "EVENTOS_SECRETS_PURPOSES": f"{SECRET_REF}=webhook",
           "EVENTOS_HOOKS_GENERIC_RATE": "1000000",
           "EVENTOS_HOOKS_GENERIC_HIGH_WATER": "1000000000"}  # fmt: skip
    ingress = start_ingress(stack, url, router=None, env=env)
    paths: list[str] = []
    for name, spec, mine in employee_specs(tag, args.paths):
        apply_employee(ingress.base_url, spec, name)
        paths += mine
    progress(f"{len(paths)} webhook paths declared; no router runs during saturation")
    ingress_rate = saturate(args, ingress.http_port, paths, tag)
    source_like = f"webhook:{tag}/%"
    backlog = scalar(url, "SELECT count(*) FROM bus_ingress WHERE status = 'accepted' "
                     "AND source_key LIKE %s", (source_like,))  # fmt: skip
    router = start_router(stack, url)
    spy = None
    if args.py_spy is not None:
        cmd = [py_spy_binary(), "record", "-p", str(router.pid), "-o", str(args.py_spy),
               "--format", "raw", "--rate", "500", "--nonblocking"]  # fmt: skip
        spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    meter = CpuMeter({"router": (router.pid, False), "postgres": (stack.postgres_pid, True)})
    meter.start()
    done_at = drained_at(url, source_like, timeout=600.0)
    cpu = meter.stop()
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    routed, rate = drain_rate(url, source_like, done_at)
    progress(f"drain: {routed} rows at {rate:.0f} rows/s; CPU {cpu_summary(cpu)}")
    report(args, ingress_rate, backlog, routed, rate, cpu)


def report(args: argparse.Namespace, ingress_rate: float, backlog: int, routed: int,
           rate: float, cpu: dict[str, float]) -> None:  # fmt: skip
    ratio = rate / ingress_rate if ingress_rate else float("nan")
    print()
    print(
        f"Router drain vs ingress saturation -- {args.paths} webhook sources, body "
        f"{args.body_bytes} B, c={args.concurrency}, PostgreSQL fsync on, 2 cores shared by all"
    )
    print(table(["phase", "rows/s", "rows", "router CPU%", "PG CPU%"], [
        ["ingress saturation (router off)", fmt(ingress_rate, 0), backlog, "-", "-"],
        ["router drain (ingress idle)", fmt(rate, 0), routed, fmt(cpu.get("router", 0.0), 0),
         fmt(cpu.get("postgres", float("nan")), 0)],
    ]))  # fmt: skip
    print()
    print(table(["target", "measured", "goal", "verdict"], [
        ["router drain / ingress saturation", f"{fmt(ratio, 2)}x",
         f">= {DRAIN_RATIO_TARGET:g}x", verdict(ratio >= DRAIN_RATIO_TARGET)],
    ]))  # fmt: skip
    if args.py_spy is not None and args.py_spy.exists():
        print(f"\npy-spy of the router during the drain ({args.py_spy}):")
        print(table(["frame", "on stack %", "own %"], top_frames(args.py_spy)))
    print()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with interrupt_guard(), Stack() as stack:
        run(args, stack)
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
