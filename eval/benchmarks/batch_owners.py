#!/usr/bin/env python
"""Batch jobs of two keys: how long one key's small batch takes while another key's large batches run.

The Batch API's store and worker in this process (no HTTP), on SQLite in a temporary folder, with the
service's default worker settings and a weightless fake embedding model, so that what is measured is the
scheduling, not a model: key A creates ``--large`` batches of ``--lines`` lines each; once they run, key B
creates one batch of ``--small`` lines; printed: the time from B's batch's creation to ``completed``, and how
many of A's lines were done meanwhile. Goal: B's batch completes within 10 s.

    python -m eval bench batch-owners                       # 16 batches of 20,000 lines beside 5 lines
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from embedrank.serving.engine import EngineConfig
from embedrank.serving.pool import ModelEntry, ModelPool
from service.batches.store import BatchStore
from service.batches.worker import BatchWorker
from service.settings import Auth, Engine, Settings

WORDS = "green tea black coffee sparkling water fresh orange juice a cup of cocoa with milk".split()


def input_file(lines: int, seed: int) -> bytes:
    """``lines`` embedding lines, two short texts each."""
    out = []
    for i in range(lines):
        texts = [" ".join(WORDS[(seed + i + k) % len(WORDS)] for k in range(j, j + 6)) for j in (0, 3)]
        body = {"model": "enc", "input": texts}
        out.append(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings", "body": body}))
    return ("\n".join(out) + "\n").encode()


def create(store: BatchStore, owner: str, content: bytes) -> str:
    file = store.files.add_file(owner, "in.jsonl", "batch", content)
    batch = store.create_batch(
        owner,
        endpoint="/v1/embeddings",
        input_file_id=file.id,
        completion_window="24h",
        window_seconds=86400,
        metadata=None,
    )
    return str(batch.id)


async def measure(args: argparse.Namespace) -> None:
    settings = Settings(auth=Auth(api_keys=("k",)), engine=Engine(tune_malloc=False))
    with tempfile.TemporaryDirectory(prefix="embedrank-bench-owners-") as folder:
        store = BatchStore.at(Path(folder))
        models = ModelPool((ModelEntry(id="enc", path="fake:encoder"),))
        models.start(models.load(), EngineConfig())
        worker = BatchWorker(store, lambda: models, settings)
        task = asyncio.create_task(worker.run())
        large = [create(store, "key-a", input_file(args.lines, seed)) for seed in range(args.large)]
        while any(store.get_batch(None, b).status == "validating" for b in large):
            await asyncio.sleep(0.05)
        await asyncio.sleep(args.settle)  # key A's chunks are running
        done_before = worker.lines_done
        started = time.perf_counter()
        small = create(store, "key-b", input_file(args.small, 99))
        worker.wake()
        while store.get_batch(None, small).status not in ("completed", "failed", "expired"):
            await asyncio.sleep(0.01)
        took = time.perf_counter() - started
        status = store.get_batch(None, small).status
        a_lines = worker.lines_done - done_before - args.small
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await models.drain(5)
        store.close()
    print(f"key A: {args.large} batches of {args.lines} lines running; key B: one batch of {args.small} lines")
    print(f"key B's batch: {status} {took:.2f} s after its creation; key A's lines done meanwhile: {a_lines}")
    print(
        f"goal key B's batch completed within 10 s: {took:.2f} s {'met' if status == 'completed' and took <= 10 else 'NOT met'}"
    )


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--large", type=int, default=16, help="key A's batches")
    p.add_argument("--lines", type=int, default=20_000, help="lines of each of key A's batches")
    p.add_argument("--small", type=int, default=5, help="lines of key B's batch")
    p.add_argument("--settle", type=float, default=2.0, help="seconds key A's batches run before key B's comes")
    asyncio.run(measure(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(run())
