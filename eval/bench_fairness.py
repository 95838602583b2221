#!/usr/bin/env python
"""Head-of-line blocking: 1-text requests while one bulk request is being computed, over HTTP.

Starts ``litestar run`` on a free loopback port (the packaged MiniLM) and alternates two cases, A B A B:

- **alone**: one ``/v1/embeddings`` request with ``--bulk`` SciFact passages (title + text), timed;
- **shared**: the same bulk request, and meanwhile a 1-text request (a SciFact query) every
  ``--interval-ms`` until the bulk answer arrives; each small request's latency is recorded.

It prints, per round and as medians over rounds, the bulk time alone and shared (the growth is the cost
of fairness to the bulk job) and the small requests' p50 / p95 / p99 latency, then its goals:
small p50 <= 0.5 s and p99 <= 1.5 s, bulk growth <= 15%.

    python eval/bench_fairness.py                 # 1,024 passages, 2 rounds (~5 minutes on 2 cores)
    python eval/bench_fairness.py --bulk 256 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from latency import percentile  # eval/latency.py, next to this script

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
KEY = "bench-fairness-key"


def load_texts(bulk: int) -> tuple[list[str], list[str], str]:
    from embedrank.retrieval.data import default_data_dir, doc_text, load_beir

    root = default_data_dir()
    if root is not None and (root / "scifact" / "corpus.jsonl").is_file():
        ds = load_beir(root / "scifact")
        passages = [doc_text(d) for d in list(ds.corpus.values())[:bulk]]
        return passages, list(ds.queries.values()), f"SciFact: {len(passages)} passages, {len(ds.queries)} queries"
    words = "retrieval dense sparse ranking passage query vector embedding model transformer index".split()
    passages = [" ".join(words[(i + j) % len(words)] for j in range(180)) for i in range(bulk)]
    queries = [" ".join(words[(i + j) % len(words)] for j in range(8)) for i in range(200)]
    return passages, queries, "synthetic texts (no $EMBEDRANK_DATA)"


async def embed(client, texts: list[str]) -> float:
    start = time.perf_counter()
    resp = await client.post("/v1/embeddings", json={"model": MODEL, "input": texts})
    resp.raise_for_status()
    assert len(resp.json()["data"]) == len(texts)
    return time.perf_counter() - start


async def alone(base: str, passages: list[str]) -> float:
    import httpx

    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=600) as client:
        return await embed(client, passages)


async def shared(base: str, passages: list[str], queries: list[str], interval: float) -> tuple[float, list[float]]:
    import httpx

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=600, limits=limits) as client:
        bulk = asyncio.ensure_future(embed(client, passages))
        smalls: list[asyncio.Future[float]] = []
        i = 0
        while not bulk.done():
            smalls.append(asyncio.ensure_future(embed(client, [queries[i % len(queries)]])))
            i += 1
            await asyncio.sleep(interval)
        bulk_s = await bulk
        return bulk_s, list(await asyncio.gather(*smalls))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bulk", type=int, default=1024, help="passages in the bulk request (default 1024)")
    p.add_argument("--interval-ms", type=float, default=100.0, help="between small requests (default 100)")
    p.add_argument("--rounds", type=int, default=2, help="A B rounds (default 2)")
    p.add_argument("--max-batch-tokens", type=int, help="server's EMBEDRANK_MAX_BATCH_TOKENS (default: its own)")
    p.add_argument(
        "--target-batch-seconds", type=float, help="server's EMBEDRANK_TARGET_BATCH_SECONDS (default: its own; 0: off)"
    )
    args = p.parse_args()
    from embedrank.testing.launch import running_server

    passages, queries, source = load_texts(args.bulk)
    env = {"EMBEDRANK_API_KEYS": KEY, "HF_HUB_OFFLINE": "1"}
    if args.max_batch_tokens:
        env["EMBEDRANK_MAX_BATCH_TOKENS"] = str(args.max_batch_tokens)
    if args.target_batch_seconds is not None:
        env["EMBEDRANK_TARGET_BATCH_SECONDS"] = str(args.target_batch_seconds)
    print(f"inputs: {source}; one small request every {args.interval_ms:.0f} ms during the shared case")
    alone_s, shared_s, p50s, p99s = [], [], [], []
    with running_server(env) as base:
        asyncio.run(alone(base, passages[:64]))  # warm-up
        for r in range(1, args.rounds + 1):
            a = asyncio.run(alone(base, passages))
            b, small = asyncio.run(shared(base, passages, queries, args.interval_ms / 1000))
            alone_s.append(a)
            shared_s.append(b)
            p50s.append(percentile(small, 50))
            p99s.append(percentile(small, 99))
            print(
                f"round {r}: bulk alone {a:6.1f} s | shared {b:6.1f} s ({b / a - 1:+.1%}) | {len(small)} small requests: "
                f"p50 {percentile(small, 50):.3f} s  p95 {percentile(small, 95):.3f} s  p99 {percentile(small, 99):.3f} s  max {max(small):.3f} s",
                flush=True,
            )
    growth = statistics.median(shared_s) / statistics.median(alone_s) - 1
    p50, p99 = statistics.median(p50s), statistics.median(p99s)
    print(
        f"median over {args.rounds} rounds: bulk alone {statistics.median(alone_s):.1f} s "
        f"({args.bulk / statistics.median(alone_s):.1f} passages/s), shared {statistics.median(shared_s):.1f} s"
    )
    print(f"goal small p50 <= 0.5 s: {p50:.3f} s {'met' if p50 <= 0.5 else 'NOT met'}")
    print(f"goal small p99 <= 1.5 s: {p99:.3f} s {'met' if p99 <= 1.5 else 'NOT met'}")
    print(f"goal bulk growth <= 15%: {growth:+.1%} {'met' if growth <= 0.15 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
