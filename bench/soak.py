"""Ingress memory and latency under slow large uploads (issue 11, point 4).

    .venv/bin/python bench/soak.py [--uploads 300] [--upload-s 60] [--size-mib 10] [--quick]

Starts a durable embedded PostgreSQL (unless EVENTOS_DATABASE_URL is set), the router and the
real ingress with its default bounds, then runs signed ~1 KB webhooks at --rate events/s
(bench/loadgen.py, open loop) twice: alone (the baseline of this run), and while --uploads
connections each upload a signed --size-mib body slowly over --upload-s seconds
(bench/slow_uploads.py). The ingress's resident memory is sampled from /proc every 0.25 s.

Prints the ingress's peak RSS in each phase against the chart's memory limit for the ingress
(deploy/helm/eventos/values.yaml), the normal traffic's p50/p99 in each phase and their ratio,
and what the uploads were answered; then checks every upload answered 200 is a row with its
whole body in event_blobs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from harness import (
    PYTHON,
    BenchError,
    Stack,
    apply_employee,
    die_with_parent,
    fmt,
    interrupt_guard,
    parse_with_quick,
    progress,
    scalar,
    start_ingress,
    start_router,
    table,
)
from ingress import SECRET_REF, SECRET_VALUE, SIGNATURE_HEADER, employee_specs, run_load

HERE = Path(__file__).resolve().parent
VALUES = HERE.parent / "deploy" / "helm" / "eventos" / "values.yaml"
UPLOAD_PATHS = 60  # the uploads' paths: generic webhooks allow a burst of 20 per path
SAMPLE_S = 0.25


def chart_memory_limit_mib() -> float:
    """The ingress's memory limit in the chart's default values."""
    values = yaml.safe_load(VALUES.read_text())
    size = values["roles"]["ingress"].get("size") or values["defaults"]["size"]
    limit = str(values["sizes"][size]["limits"]["memory"])
    number, unit = float(limit[:-2]), limit[-2:]
    return number * {"Mi": 1, "Gi": 1024}[unit]


class RssSampler:
    """Peak resident memory of one process, sampled from /proc in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.peak_kib = max(self.peak_kib, self.rss_kib())

    def __enter__(self) -> RssSampler:
        self.peak_kib = self.rss_kib()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def upload_specs(tag: str, max_body: int) -> list[tuple[str, str, list[str]]]:
    paths = [f"{tag}/up{j}" for j in range(UPLOAD_PATHS)]
    triggers = "\n".join(
        f"    - {{kind: webhook, path: {p}, dedupe_header: X-Event-Id, max_body: {max_body}, "
        f"verify: {{scheme: hmac-sha256, secret: {SECRET_REF}, header: {SIGNATURE_HEADER}}}}}"
        for p in paths
    )
    name = f"soak-{tag}-up"
    spec = (
        f"apiVersion: eventos/v1\nkind: Employee\nmetadata: {{name: {name}}}\nspec:\n"
        f"  agents:\n    - {{name: main, model: {{provider: local, name: scripted}}}}\n"
        f"  triggers:\n{triggers}\n"
    )
    return [(name, spec, paths)]


def run_uploads(cfg: dict[str, Any], out: dict[str, Any]) -> None:
    proc = subprocess.Popen(
        [PYTHON, str(HERE / "slow_uploads.py"), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    stdout, _ = proc.communicate(timeout=cfg["seconds"] + 300)
    if proc.returncode != 0:
        raise BenchError(f"the uploader failed (exit {proc.returncode})")
    out.update(json.loads(stdout.decode().strip().splitlines()[-1]))


def answers(result: dict[str, Any]) -> str:
    """Answers by status, and what got none (timeouts, resets) by error."""
    return json.dumps({**result["statuses"], **result.get("errors", {})})


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--uploads", type=int, default=300, help="slow uploads at once (300)")
    p.add_argument("--upload-s", type=float, default=60.0, help="seconds each upload takes (60)")
    p.add_argument("--size-mib", type=float, default=10.0, help="size of each upload (10)")
    p.add_argument("--rate", type=float, default=50.0, help="normal webhooks per second (50)")
    return parse_with_quick(p, {"uploads": 3, "upload_s": 2.0, "size_mib": 1.0})


def main() -> None:
    args = parse_args()
    size = int(args.size_mib * 1024 * 1024)
    tag = "s" + str(int(time.time()) % 100000)
    with Stack() as stack, interrupt_guard():
        url = stack.database()
        router = start_router(stack, url, wait=False)
        env = {
            "EVENTOS_SECRET_" + SECRET_REF.upper().replace("-", "_"): SECRET_VALUE,
            "EVENTOS_SECRETS_PURPOSES": f"{SECRET_REF}=webhook",
        }
        ingress = start_ingress(stack, url, router=router, env=env, wait=False)
        stack.wait_ready(router, ingress)
        normal: list[str] = []
        for name, spec, paths in employee_specs(tag, 64):
            apply_employee(ingress.base_url, spec, name)
            normal += paths
        ((name, spec, up_paths),) = upload_specs(tag, size)
        apply_employee(ingress.base_url, spec, name)
        load = {"host": "127.0.0.1", "port": ingress.http_port, "mode": "rate", "rate": args.rate,
                "duration": args.upload_s, "paths": normal, "secret": SECRET_VALUE,
                "signature_header": SIGNATURE_HEADER, "warmup": 1.0}  # fmt: skip
        progress(f"phase 1: {args.rate:g} webhooks/s alone for {args.upload_s:g} s")
        with RssSampler(ingress.pid) as alone_rss:
            alone = run_load("alone", {**load, "id_prefix": f"{tag}-a-"})
        progress(f"phase 2: the same with {args.uploads} uploads of {args.size_mib:g} MiB")
        uploads: dict[str, Any] = {}
        cfg = {"host": "127.0.0.1", "port": ingress.http_port, "paths": up_paths,
               "secret": SECRET_VALUE, "signature_header": SIGNATURE_HEADER,
               "id_prefix": f"{tag}-u-", "uploads": args.uploads, "seconds": args.upload_s,
               "size": size}  # fmt: skip
        uploader = threading.Thread(target=run_uploads, args=(cfg, uploads))
        with RssSampler(ingress.pid) as soak_rss:
            uploader.start()
            soaked = run_load("soak", {**load, "id_prefix": f"{tag}-b-"})
            uploader.join()
        stored = scalar(url, "SELECT count(*) FROM bus_ingress i JOIN event_blobs b "
                        "ON b.id = i.body_ref WHERE i.source_key LIKE %s AND b.size = %s",
                        (f"webhook:{tag}/up%", size))  # fmt: skip
    limit = chart_memory_limit_mib()
    a_mib, s_mib = alone_rss.peak_kib / 1024, soak_rss.peak_kib / 1024
    rows = [
        ["ingress peak RSS (MiB)", fmt(a_mib, 0), fmt(s_mib, 0), fmt(s_mib / a_mib, 2)],
        ["chart memory limit (MiB)", fmt(limit, 0), fmt(limit, 0), fmt(s_mib / limit, 2)],
        ["normal p50 (ms)", fmt(alone["p50_ms"], 1), fmt(soaked["p50_ms"], 1),
         fmt(soaked["p50_ms"] / alone["p50_ms"], 2)],
        ["normal p99 (ms)", fmt(alone["p99_ms"], 1), fmt(soaked["p99_ms"], 1),
         fmt(soaked["p99_ms"] / alone["p99_ms"], 2)],
        ["normal answers", answers(alone), answers(soaked), ""],
    ]  # fmt: skip
    print(table(["", "alone", "with uploads", "ratio"], rows))
    answered = uploads.get("answers", {})
    print(f"uploads: {args.uploads} x {args.size_mib:g} MiB over {args.upload_s:g} s, answered "
          f"{json.dumps(answered)} in {uploads.get('seconds', 0):.0f} s; "
          f"{stored} stored whole")  # fmt: skip
    verdict_rss = "PASS" if s_mib < limit else "MISS"
    print(f"{verdict_rss}: ingress peak RSS {s_mib:.0f} MiB vs the chart's {limit:.0f} MiB limit")
    if stored != answered.get("200", 0):
        raise BenchError(f"{answered.get('200', 0)} uploads answered 200 but {stored} stored")


if __name__ == "__main__":
    main()
