#!/usr/bin/env python
"""Batch jobs over HTTP: their throughput, what they cost direct requests, and what the embedding cache saves.

Starts ``litestar run`` on a free loopback port (the packaged MiniLM) with a Batch API folder of its own,
and measures, with one SciFact sentence per line (``/v1/embeddings``, sentences of 5 words or more):

- **throughput**: a batch of ``--lines`` lines from its creation to ``completed``, alternated A B A B with
  the same texts sent directly as 32-text requests by ``--clients`` concurrent clients; the ratio of their
  texts per second. The server's embedding cache is off for this part, so each round computes every text.
- **fairness**: a batch of ``--fairness-lines`` lines running while 1-text requests (SciFact queries) are
  sent every ``--interval-ms``: their p50 / p95 / p99 latency, and the batch's lines per second meanwhile.
  Cache off as well (the sentences repeat past 48,000).
- **cache**: on a server with the cache on, a batch of ``--lines`` distinct sentences, then the same batch
  with ``--changed`` of its lines edited: the second run's time against the first's.

It prints each round and its goals: batch throughput >= 90% of the direct requests', small p99 <= 1.5 s
while the batch runs, and the re-run after 5% changed costs <= 10% of the first run.

    python -m eval bench batch                                   # about 12 minutes on 2 cores
    python -m eval bench batch --lines 5000 --fairness-lines 20000 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from eval.harness.stats import percentile

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
KEY = "bench-batch-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}


def load_sentences() -> tuple[list[str], list[str], str]:
    """SciFact's passages cut into sentences of 5 words or more (distinct, in corpus order), and its queries."""
    from embedrank.retrieval.data import default_data_dir, doc_text, load_beir

    root = default_data_dir()
    if root is None or not (root / "scifact" / "corpus.jsonl").is_file():
        raise SystemExit("needs SciFact in $EMBEDRANK_DATA (python eval/get_data.py scifact)")
    ds = load_beir(root / "scifact")
    seen: dict[str, None] = {}
    for doc in ds.corpus.values():
        for sentence in re.split(r"(?<=[.!?])\s+", doc_text(doc)):
            if len(sentence.split()) >= 5:
                seen.setdefault(sentence.strip())
    sentences = list(seen)
    return sentences, list(ds.queries.values()), f"SciFact: {len(sentences):,} sentences, {len(ds.queries)} queries"


def batch_file(texts: list[str]) -> bytes:
    return b"".join(
        json.dumps(
            {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": t}}
        ).encode()
        + b"\n"
        for i, t in enumerate(texts)
    )


def _client(base: str):
    import httpx

    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    return httpx.AsyncClient(base_url=base, headers=HEADERS, timeout=3600, limits=limits)


async def run_batch(base: str, texts: list[str], during=None) -> tuple[float, dict]:
    """Upload ``texts`` as a batch, create it and wait for it to finish; the seconds from its creation to its
    end and its final object. ``during(batch_id)``, a coroutine, runs meanwhile and is cancelled at the end."""
    async with _client(base) as client:
        files = {"file": ("in.jsonl", batch_file(texts), "application/jsonl")}
        upload = await client.post("/v1/files", data={"purpose": "batch"}, files=files)
        upload.raise_for_status()
        body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
        start = time.perf_counter()
        created = await client.post("/v1/batches", json=body)
        created.raise_for_status()
        batch_id = created.json()["id"]
        side = asyncio.ensure_future(during(batch_id)) if during is not None else None
        while True:
            batch = (await client.get(f"/v1/batches/{batch_id}")).json()
            if batch["status"] in ("completed", "failed", "expired", "cancelled"):
                break
            await asyncio.sleep(0.2)
        seconds = time.perf_counter() - start
        if side is not None:
            side.cancel()
            await asyncio.gather(side, return_exceptions=True)
        if batch["status"] != "completed" or batch["request_counts"]["failed"]:
            raise SystemExit(f"the batch did not complete: {batch}")
        return seconds, batch


async def run_direct(base: str, texts: list[str], clients: int, size: int = 32) -> float:
    """``texts`` as ``size``-text requests from ``clients`` concurrent clients; the seconds it took."""
    requests = [texts[i : i + size] for i in range(0, len(texts), size)]
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for r in requests:
        queue.put_nowait(r)

    async def worker(client) -> None:
        while not queue.empty():
            part = queue.get_nowait()
            resp = await client.post("/v1/embeddings", json={"model": MODEL, "input": part})
            resp.raise_for_status()

    async with _client(base) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        return time.perf_counter() - start


async def smalls_meanwhile(base: str, queries: list[str], interval: float, latencies: list[float]) -> None:
    """1-text requests every ``interval`` seconds until cancelled; each one's latency into ``latencies``."""

    async def one(client, text: str) -> None:
        start = time.perf_counter()
        resp = await client.post("/v1/embeddings", json={"model": MODEL, "input": [text]})
        resp.raise_for_status()
        latencies.append(time.perf_counter() - start)

    async with _client(base) as client:
        sent: list[asyncio.Future[None]] = []
        try:
            while True:
                sent.append(asyncio.ensure_future(one(client, queries[len(sent) % len(queries)])))
                await asyncio.sleep(interval)
        finally:
            await asyncio.gather(*sent, return_exceptions=True)


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=20_000, help="lines of the throughput and cache batches (20,000)")
    p.add_argument("--fairness-lines", type=int, default=100_000, help="lines of the fairness batch (100,000)")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients of the direct requests (4)")
    p.add_argument("--rounds", type=int, default=2, help="A B rounds of the throughput part (2)")
    p.add_argument("--interval-ms", type=float, default=100.0, help="between 1-text requests (100)")
    p.add_argument("--changed", type=float, default=0.05, help="share of lines edited for the cache re-run (0.05)")
    p.add_argument("--parts", nargs="+", choices=("throughput", "fairness", "cache"), default=["throughput", "fairness", "cache"])  # fmt: skip
    args = p.parse_args(argv)
    from embedrank.testing.launch import running_server

    sentences, queries, source = load_sentences()
    texts = sentences[: args.lines]
    print(f"inputs: {source}; one sentence per batch line, /v1/embeddings, {MODEL}")
    folder = tempfile.mkdtemp(prefix="bench-batch-")
    limits = {"EMBEDRANK_MAX_BATCH_LINES": str(max(args.lines, args.fairness_lines)), "EMBEDRANK_MAX_FILE_BYTES": str(1 << 30)}  # fmt: skip
    env = {"EMBEDRANK_API_KEYS": KEY, "HF_HUB_OFFLINE": "1", **limits}
    goals = []
    if {"throughput", "fairness"} & set(args.parts):
        uncached = {**env, "EMBEDRANK_BATCH_DIR": f"{folder}/uncached", "EMBEDRANK_EMBEDDING_CACHE_BYTES": "0"}
        with running_server(uncached) as base:
            asyncio.run(run_direct(base, texts[:512], args.clients))  # warm-up
            if "throughput" in args.parts:
                batch_s, direct_s = [], []
                for r in range(1, args.rounds + 1):
                    a, _ = asyncio.run(run_batch(base, texts))
                    b = asyncio.run(run_direct(base, texts, args.clients))
                    batch_s.append(a)
                    direct_s.append(b)
                    print(
                        f"throughput round {r}: batch of {len(texts):,} lines {a:6.1f} s ({len(texts) / a:6.1f} lines/s) "
                        f"| 32-text requests x {args.clients} clients {b:6.1f} s ({len(texts) / b:6.1f} texts/s) "
                        f"| batch / direct {b / a:.2f}",
                        flush=True,
                    )
                ratio = statistics.median(direct_s) / statistics.median(batch_s)
                print(
                    f"throughput, median over {args.rounds} rounds: batch {len(texts) / statistics.median(batch_s):.1f} "
                    f"lines/s, direct {len(texts) / statistics.median(direct_s):.1f} texts/s: batch / direct {ratio:.2f}"
                )
                goals.append(
                    f"goal throughput: batch >= 90% of direct: {ratio:.0%} {'met' if ratio >= 0.9 else 'NOT met'}"
                )
            if "fairness" in args.parts:
                lines = [sentences[i % len(sentences)] for i in range(args.fairness_lines)]
                latencies: list[float] = []
                seconds, _ = asyncio.run(
                    run_batch(
                        base, lines, lambda _: smalls_meanwhile(base, queries, args.interval_ms / 1000, latencies)
                    )
                )
                p99 = percentile(latencies, 99)
                print(
                    f"fairness: batch of {len(lines):,} lines {seconds:.1f} s ({len(lines) / seconds:.1f} lines/s) while "
                    f"{len(latencies)} 1-text requests were sent, one every {args.interval_ms:.0f} ms: p50 "
                    f"{percentile(latencies, 50):.3f} s  p95 {percentile(latencies, 95):.3f} s  p99 {p99:.3f} s  "
                    f"max {max(latencies):.3f} s",
                    flush=True,
                )
                goals.append(f"goal fairness: small p99 <= 1.5 s during the batch: {p99:.3f} s {'met' if p99 <= 1.5 else 'NOT met'}")  # fmt: skip
    if "cache" in args.parts:
        cached = {**env, "EMBEDRANK_BATCH_DIR": f"{folder}/cached"}
        with running_server(cached) as base:
            asyncio.run(run_direct(base, sentences[-512:], args.clients))  # warm-up (direct: not cached)
            first, _ = asyncio.run(run_batch(base, texts))
            step = round(1 / args.changed)
            edited = [f"{t} (revised)" if i % step == 0 else t for i, t in enumerate(texts)]
            second, _ = asyncio.run(run_batch(base, edited))
            share = second / first
            print(
                f"cache: first run {first:.1f} s; again with {sum(1 for i in range(len(texts)) if i % step == 0):,} of "
                f"{len(texts):,} lines edited ({args.changed:.0%}) {second:.1f} s: {share:.1%} of the first run",
                flush=True,
            )
            goals.append(f"goal cache: re-run after {args.changed:.0%} changed <= 10% of the first: {share:.1%} {'met' if share <= 0.10 else 'NOT met'}")  # fmt: skip
    for goal in goals:
        print(goal)
    return 0


if __name__ == "__main__":
    sys.exit(run())
