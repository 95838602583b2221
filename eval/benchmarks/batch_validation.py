#!/usr/bin/env python
"""Validating a batch's input file: the memory it takes and what it costs the event loop.

The Batch API's store and worker in this process (no HTTP, no model: only the validation runs), on SQLite in a
temporary folder. For each input file it prints the process's peak resident memory above what it held
before (sampled every 10 ms), the time the validation took, and the event loop's lag meanwhile (how late a
10 ms timer fires: what a ``/health`` request served by this loop would wait), as p50 / p99 / max:

- ``lines``: 50,000 request lines of two short texts each (the default ``max_batch_lines``);
- ``blank``: 90 MB of blank lines and one request line.

Goals: peak memory independent of the file's size, loop lag p99 under 100 ms.

    python -m eval bench batch-validation
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from service.batches.store import BatchStore
from service.batches.worker import BatchWorker
from service.settings import Auth, Engine, Settings

LINE = {
    "custom_id": "r{}",
    "method": "POST",
    "url": "/v1/embeddings",
    "body": {"model": "enc", "input": ["tea", "milk"]},
}


def request_lines(n: int) -> bytes:
    text = json.dumps(LINE)
    return "".join(text.replace("r{}", f"r{i}") + "\n" for i in range(n)).encode()


async def measure(store: BatchStore, make: Callable[[], bytes]) -> dict[str, Any]:
    file = store.files.add_file("key", "in.jsonl", "batch", make())  # on disk; nothing of it kept here
    batch = store.create_batch(
        "key", endpoint="/v1/embeddings", input_file_id=file.id, completion_window="24h", window_seconds=86400,
        metadata=None,
    )  # fmt: skip
    worker = BatchWorker(store, lambda: None, Settings(auth=Auth(api_keys=("k",)), engine=Engine(tune_malloc=False)))
    process = psutil.Process()
    base = process.memory_info().rss
    peak = base
    sampling = True

    def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    lags: list[float] = []
    validating = asyncio.create_task(worker.validate(batch))
    started = time.perf_counter()
    while not validating.done():
        before = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append(time.perf_counter() - before - 0.01)
    took = time.perf_counter() - started
    await validating
    sampling = False
    sampler.join()
    status = store.get_batch(None, batch.id).status
    lags.sort()
    return {
        "bytes": file.bytes,
        "status": status,
        "peak_mib": (peak - base) / 2**20,
        "seconds": took,
        "lag_p50_ms": 1000 * statistics.median(lags),
        "lag_p99_ms": 1000 * lags[min(len(lags) - 1, int(0.99 * len(lags)))],
        "lag_max_ms": 1000 * lags[-1],
    }


async def measure_all() -> None:
    gc.freeze()  # as the service does once its models are loaded: a full collection then skips what import made
    cases = {
        "lines": lambda: request_lines(50_000),
        "blank": lambda: b"\n" * (90 * 2**20) + request_lines(1),
    }
    print("file     size MB  status       peak MiB above start  seconds  loop lag p50 / p99 / max ms")
    results = {}
    with tempfile.TemporaryDirectory(prefix="embedrank-bench-validation-") as folder:
        store = BatchStore.at(Path(folder))
        for name, make in cases.items():
            got = await measure(store, make)
            size = got["bytes"] / 2**20
            results[name] = got
            print(
                f"{name:<8} {size:7.1f}  {got['status']:<12} {got['peak_mib']:20.1f}  {got['seconds']:7.2f}  "
                f"{got['lag_p50_ms']:.1f} / {got['lag_p99_ms']:.1f} / {got['lag_max_ms']:.1f}"
            )
        store.close()
    worst = max(r["lag_p99_ms"] for r in results.values())
    print(f"goal loop lag p99 < 100 ms: {worst:.1f} ms {'met' if worst < 100 else 'NOT met'}")


def run(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    asyncio.run(measure_all())


if __name__ == "__main__":
    sys.exit(run())
