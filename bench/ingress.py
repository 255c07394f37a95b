"""Webhook ingress under load, against a bare INSERT-per-request baseline in the same run.

    .venv/bin/python bench/ingress.py [--quick] [--duration S] [--rate R] [--concurrency N]

Starts a durable embedded PostgreSQL (unless EVENTOS_DATABASE_URL is set), the real ingress
service (`python -m eventos_ingress`), the router (unless --no-router) and the baseline app
(bench/baseline_app.py), then drives both HTTP targets from a separate generator process
(bench/loadgen.py) with signed ~1 KB webhook POSTs, each with a unique X-Event-Id:

1. fixed rate (open loop) for --duration seconds: latency from the scheduled send;
2. saturation (closed loop, --concurrency connections) for --sat-duration seconds.

Prints a table with both targets and their ratios, PASS/MISS against EG8 (p99 < 25 ms at
50 events/s) and against ingress/baseline throughput >= 2.0, and checks that every
"accepted" answer of ingress is a row in bus_ingress. A MISS does not fail the run.

Load is spread over many webhook paths: hmac-sha256 is a generic scheme, limited to
10 events/s (burst 20) per path by ingress (SPEC §15), so one path would mostly get 429.
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from baseline_app import TABLE_DDL
from harness import (
    NAN,
    PYTHON,
    BenchError,
    CpuMeter,
    ServiceProc,
    Stack,
    apply_employee,
    counts,
    cpu_summary,
    die_with_parent,
    fmt,
    free_ports,
    interrupt_guard,
    others_cpu,
    parse_with_quick,
    progress,
    scalar,
    start_ingress,
    start_router,
    table,
    verdict,
    wait_routed,
)

HERE = Path(__file__).resolve().parent
SECRET_REF = "bench-hook"
SECRET_VALUE = "bench-hook-secret-value"
SIGNATURE_HEADER = "X-Signature"
TRIGGERS_PER_EMPLOYEE = 64  # the spec's maximum
GENERIC_PATH_RATE = 5.0  # events/s per path in the rate phase: half the 10/s generic limit
EG8_P99_MS = 25.0
THROUGHPUT_RATIO_TARGET = 2.0
GENERATOR_BUSY_PCT = 85.0


@dataclass(frozen=True)
class Phase:
    name: str
    target: str
    result: dict[str, Any]
    cpu: dict[str, float]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=30.0, help="fixed-rate phase, s (30)")
    p.add_argument("--sat-duration", type=float, default=None, help="saturation phase, s (15)")
    p.add_argument("--rate", type=float, default=50.0, help="fixed rate, events/s (50)")
    p.add_argument("--concurrency", type=int, default=64, help="saturation connections (64)")
    p.add_argument("--paths", type=int, default=256, help="webhook paths in saturation (256)")
    p.add_argument("--body-bytes", type=int, default=1024, help="JSON body size (1024)")
    p.add_argument("--no-router", action="store_true", help="do not run the router")
    p.add_argument(
        "--lift-limits",
        action="store_true",
        help="raise the generic webhook rate limit and high water (EVENTOS_HOOKS_GENERIC_*)\n"
        "so that few paths (even --paths 1) take the whole load",
    )
    p.add_argument("--profile", type=Path, help="run ingress under cProfile, write stats here")
    args = parse_with_quick(p, {"duration": 1.0, "sat_duration": 1.0, "paths": 64}, argv)
    if args.sat_duration is None:
        args.sat_duration = 15.0
    if args.rate <= 0 or args.concurrency <= 0 or args.paths <= 0:
        p.error("--rate, --concurrency and --paths must be positive")
    return args


def employee_specs(tag: str, paths: int) -> list[tuple[str, str, list[str]]]:
    """(name, YAML, paths) of the employees declaring `paths` hmac-sha256 webhook paths."""
    out: list[tuple[str, str, list[str]]] = []
    for k in range(math.ceil(paths / TRIGGERS_PER_EMPLOYEE)):
        name = f"bench-{tag}-{k}"
        mine = [
            f"{tag}/e{k}/p{j}"
            for j in range(min(TRIGGERS_PER_EMPLOYEE, paths - len(out) * TRIGGERS_PER_EMPLOYEE))
        ]
        triggers = "\n".join(
            f"    - {{kind: webhook, path: {p}, dedupe_header: X-Event-Id, verify: "
            f"{{scheme: hmac-sha256, secret: {SECRET_REF}, header: {SIGNATURE_HEADER}}}}}"
            for p in mine
        )
        spec = (
            f"apiVersion: eventos/v1\nkind: Employee\nmetadata: {{name: {name}}}\nspec:\n"
            f"  agents:\n    - {{name: main, model: {{provider: local, name: scripted}}}}\n"
            f"  triggers:\n{triggers}\n"
        )
        out.append((name, spec, mine))
    return out


def run_load(label: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run the generator process once; its JSON result."""
    cfg = {**cfg, "label": label}
    proc = subprocess.Popen(
        [PYTHON, str(HERE / "loadgen.py"), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    try:
        out, _ = proc.communicate(timeout=float(cfg["duration"]) + float(cfg["warmup"]) + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise BenchError(f"the load generator failed ({label}, exit {proc.returncode})")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


class Bench:
    """The stack and the phases of one run."""

    def __init__(self, args: argparse.Namespace, stack: Stack) -> None:
        self.args = args
        self.stack = stack
        self.tag = "r" + secrets.token_hex(3)
        self.source_like = f"webhook:{self.tag}/%"
        self.url = ""
        self.targets: dict[str, ServiceProc] = {}
        self.router: ServiceProc | None = None
        self.paths: list[str] = []
        self.phases: list[Phase] = []
        self.warm: list[Phase] = []
        self.rate_paths = 0

    def start(self) -> None:
        self.url = self.stack.database()
        if not self.args.no_router:
            self.router = start_router(self.stack, self.url, wait=False)
        env = {
            "EVENTOS_SECRET_" + SECRET_REF.upper().replace("-", "_"): SECRET_VALUE,
            "EVENTOS_SECRETS_PURPOSES": f"{SECRET_REF}=webhook",
        }
        if self.args.lift_limits:
            env |= {"EVENTOS_HOOKS_GENERIC_RATE": "1000000", "EVENTOS_HOOKS_GENERIC_HIGH_WATER":
                    "1000000000"}  # fmt: skip
        self.targets["ingress"] = start_ingress(
            self.stack, self.url, router=self.router, env=env, profile_to=self.args.profile,
            wait=False,
        )  # fmt: skip
        with_baseline_table(self.url)
        (b_http,) = free_ports(1)
        self.targets["baseline"] = self.stack.service(
            "baseline",
            [str(HERE / "baseline_app.py"), "--url", self.url, "--port", str(b_http)],
            {},
            b_http,
            wait=False,
        )
        self.stack.wait_ready(*self.targets.values(), *([self.router] if self.router else []))
        for name, spec, paths in employee_specs(self.tag, self.args.paths):
            apply_employee(self.targets["ingress"].base_url, spec, name)
            self.paths += paths
        progress(f"{len(self.paths)} hmac-sha256 webhook paths declared (run tag {self.tag})")

    def load_cfg(self, target: str, phase: str, **extra: Any) -> dict[str, Any]:
        return {
            "host": "127.0.0.1",
            "port": self.targets[target].http_port,
            "paths": self.paths,
            "secret": SECRET_VALUE,
            "signature_header": SIGNATURE_HEADER,
            "id_prefix": f"{self.tag}-{target}-{phase}-",
            "body_bytes": self.args.body_bytes,
            **extra,
        }

    def meter(self) -> CpuMeter:
        pids = {name: (svc.pid, False) for name, svc in self.targets.items()}
        if self.router is not None:
            pids["router"] = (self.router.pid, False)
        pids["postgres"] = (self.stack.postgres_pid, True)
        return CpuMeter(pids)

    def phase(self, name: str, target: str, cfg: dict[str, Any]) -> Phase:
        if self.router is not None:
            # Every phase starts with nothing left to route, so it pays only for its own work.
            waited = wait_routed(self.url, self.source_like, timeout=120.0)
            if waited > 0.5:
                progress(f"router needed {waited:.1f}s to route the previous phase's backlog")
        progress(f"{name} -> {target}")
        meter = self.meter()
        meter.start()
        result = run_load(f"{name} {target}", cfg)
        cpu = meter.stop()
        lag = result.get("max_send_lag_ms")
        progress(
            f"{name} -> {target}: {result['ok_per_s']:.0f} ok/s, p50 {result['p50_ms']:.1f} ms, "
            f"p99 {result['p99_ms']:.1f} ms; CPU: generator {result['generator_cpu_pct']:.0f}%, "
            f"{cpu_summary(cpu)}" + ("" if lag is None else f"; latest send {lag:.1f} ms late")
        )
        ph = Phase(name, target, result, cpu)
        self.phases.append(ph)
        return ph

    def run(self) -> None:
        a = self.args
        needed = math.ceil(a.rate / GENERIC_PATH_RATE)
        if needed > len(self.paths) and not a.lift_limits:
            progress(f"--rate {a.rate:g} wants {needed} paths under the 10/s generic limit")
        rate_paths = self.paths[: max(1, min(needed, len(self.paths)))]
        self.rate_paths = len(rate_paths)
        for target in ("ingress", "baseline"):
            progress(f"warm-up -> {target}")
            cfg = self.load_cfg(target, "warm", mode="closed", duration=0.3 if a.quick else 1.0,
                                warmup=0.0, concurrency=8)  # fmt: skip
            self.warm.append(Phase("warm-up", target, run_load(f"warm-up {target}", cfg), {}))
        rate_name = f"rate {a.rate:g}/s"
        for target in ("ingress", "baseline"):
            cfg = self.load_cfg(target, "rate", mode="rate", rate=a.rate, duration=a.duration,
                                warmup=0.0)  # fmt: skip
            cfg["paths"] = rate_paths
            self.phase(rate_name, target, cfg)
        sat_name = f"saturation c={a.concurrency}"
        warmup = 0.3 if a.quick else 1.0
        for target in ("ingress", "baseline"):
            cfg = self.load_cfg(target, "sat", mode="closed", duration=a.sat_duration,
                                concurrency=a.concurrency, warmup=warmup)  # fmt: skip
            self.phase(sat_name, target, cfg)
        if self.router is not None:
            waited = wait_routed(self.url, self.source_like, timeout=120.0)
            progress(f"router finished routing {waited:.1f}s after the last ingress phase")

    def committed(self, target: str) -> tuple[int, int, int, int]:
        """(accepted answers, duplicate answers, transport errors, rows) of one target."""
        accepted = duplicate = errors = 0
        for ph in self.phases_of(target):
            accepted += ph.result["accepted"]
            duplicate += ph.result["duplicate"]
            errors += sum(ph.result["errors"].values())
        if target == "ingress":
            rows = scalar(
                self.url, "SELECT count(*) FROM bus_ingress WHERE source_key LIKE %s",
                (self.source_like,),
            )  # fmt: skip
        else:
            rows = scalar(
                self.url, "SELECT count(*) FROM bench_baseline WHERE event_id LIKE %s",
                (f"{self.tag}-%",),
            )  # fmt: skip
        return accepted, duplicate, errors, rows

    def phases_of(self, target: str) -> list[Phase]:
        """Every phase that sent to `target`, warm-up included."""
        return [p for p in [*self.warm, *self.phases] if p.target == target]


def with_baseline_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLE_DDL.encode())


def phase_row(ph: Phase) -> list[object]:
    r, cpu = ph.result, ph.cpu
    others = others_cpu(cpu, r["generator_cpu_pct"])
    return [
        ph.name, ph.target, fmt(r["ok_per_s"], 0), fmt(r["p50_ms"]), fmt(r["p99_ms"]),
        fmt(r["max_ms"]), r["statuses"].get("200", 0),
        counts({k: v for k, v in r["statuses"].items() if k != "200"}), counts(r["errors"]),
        fmt(r["generator_cpu_pct"], 0), fmt(cpu.get(ph.target, NAN), 0),
        fmt(cpu.get("router", NAN), 0), fmt(cpu.get("postgres", NAN), 0), fmt(others, 0),
    ]  # fmt: skip


def report(bench: Bench) -> bool:
    """Print the figures; False when a committed-answer check failed."""
    a = bench.args
    rows = [phase_row(ph) for ph in bench.phases]
    print()
    limits = "limits lifted" if a.lift_limits else "default limits: 10/s per path"
    print(
        f"Webhook ingress vs baseline -- body {a.body_bytes} B, hmac-sha256 ({limits}), "
        f"{bench.rate_paths} paths at fixed rate, {len(bench.paths)} at saturation, "
        f"router {'off' if a.no_router else 'on'}, PostgreSQL fsync on, 2 cores shared by all"
    )
    print(table(
        ["phase", "target", "ok/s", "p50 ms", "p99 ms", "max ms", "200s", "non-200",
         "errors", "gen CPU%", "server CPU%", "router CPU%", "PG CPU%", "others CPU%"],
        rows,
    ))  # fmt: skip
    print("  CPU% is of one core (200% = the whole machine); others = processes not ours.")
    by = {(p.name.split()[0], p.target): p.result for p in bench.phases}
    ing_rate, base_rate = by[("rate", "ingress")], by[("rate", "baseline")]
    ing_sat, base_sat = by[("saturation", "ingress")], by[("saturation", "baseline")]
    ratio = ing_sat["ok_per_s"] / base_sat["ok_per_s"] if base_sat["ok_per_s"] else float("nan")
    p99_ratio = ing_rate["p99_ms"] / base_rate["p99_ms"] if base_rate["p99_ms"] else float("nan")
    rate_ok = ing_rate["statuses"].get("200", 0) == ing_rate["sent"]
    print()
    print(table(["target", "measured", "goal", "verdict"], [
        [f"EG8 ingress p99 at {a.rate:g}/s", f"{fmt(ing_rate['p99_ms'])} ms",
         f"< {EG8_P99_MS:g} ms" + ("" if a.rate == 50 else " (EG8 is at 50/s)"),
         verdict(ing_rate["p99_ms"] < EG8_P99_MS and rate_ok)],
        ["saturation throughput ingress/baseline", f"{fmt(ratio, 2)}x",
         f">= {THROUGHPUT_RATIO_TARGET:g}x", verdict(ratio >= THROUGHPUT_RATIO_TARGET)],
        [f"p99 at {a.rate:g}/s ingress/baseline", f"{fmt(p99_ratio, 2)}x", "(info)", ""],
        ["saturation p99 ingress/baseline",
         f"{fmt(ing_sat['p99_ms'] / base_sat['p99_ms'], 2)}x", "(info)", ""],
    ]))  # fmt: skip
    if not rate_ok:
        print(f"  note: not every fixed-rate request got a 200: {ing_rate['statuses']}")
    if ing_sat["statuses"].get("429"):
        print("  note: ingress answered 429 at saturation; raise --paths or use --lift-limits")
    busiest = max(p.result["generator_cpu_pct"] for p in bench.phases)
    if busiest >= GENERATOR_BUSY_PCT:
        print(f"  note: the generator used up to {busiest:.0f}% of a core: it may be the limit")
    else:
        print(f"  generator CPU peaked at {busiest:.0f}% of one core: not the limit")
    print()
    return commit_check(bench)


def commit_check(bench: Bench) -> bool:
    ok = True
    for target, where in (("ingress", "bus_ingress"), ("baseline", "bench_baseline")):
        accepted, duplicate, errors, rows = bench.committed(target)
        if rows == accepted and duplicate == 0:
            state = "OK"
        elif rows > accepted and rows - accepted <= errors:
            state = f"OK ({rows - accepted} rows from requests the generator gave up on)"
        else:
            state, ok = "FAILED: an answered event is missing or duplicated", False
        print(
            f"commit check {target}: {accepted} 'accepted' answers (+{duplicate} duplicate), "
            f"{rows} rows in {where} -> {state}"
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with interrupt_guard(), Stack() as stack:
        bench = Bench(args, stack)
        bench.start()
        bench.run()
        return 0 if report(bench) else 1
    return 1


if __name__ == "__main__":
    sys.exit(main())
