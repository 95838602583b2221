#!/usr/bin/env python
"""Bounded load: many concurrent clients with mixed requests; every answer checked against the core.

Starts ``litestar run`` (the packaged MiniLM) on a free loopback port and runs ``--clients`` (64) clients
for ``--seconds`` (60), each on its own keep-alive connection, sending at random one of: embeddings of 1
query, embeddings of 16 passages, or a rerank of a query against 10-50 passages (SciFact texts). Every
200 answer is compared with in-process results of the same model (vectors to 1e-4, rerank scores and
order; a passage longer than the model's window scores its best window, as the service chunks by default); a 429 must carry ``Retry-After`` (the client waits that long and goes on). It prints requests
sent and answered by status, wrong, lost (no answer at all), latency p50/p95/p99 of the 200 answers and
the number of 429 answers per kind, and the
server's resident memory: before, peak, right after the load, and after ``EMBEDRANK_IDLE_SECONDS``
without work (the engine then gives its kept heap back).

Goals: 0 lost, 0 wrong, only 200 and 429 (each with Retry-After).

    python -m eval bench load                       # 64 clients, 60 s
    python -m eval bench load --clients 16 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import random
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from eval.harness.stats import percentile, rss_mib

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
KEY = "bench-load-key"
IDLE_SECONDS = 5


def texts() -> tuple[list[str], list[str]]:
    from embedrank.retrieval.data import default_data_dir, doc_text, load_beir

    root = default_data_dir()
    if root is None or not (root / "scifact" / "corpus.jsonl").is_file():
        raise SystemExit(
            "needs scifact in $EMBEDRANK_DATA (else ~/.local/share/embedrank): python eval/get_data.py fetch scifact"
        )
    ds = load_beir(root / "scifact")
    return list(ds.queries.values())[:200], [doc_text(d) for d in list(ds.corpus.values())[:400]]


class Tally:
    def __init__(self) -> None:
        self.sent = 0
        self.status: collections.Counter[int] = collections.Counter()
        self.wrong: list[str] = []
        self.lost: list[str] = []
        self.latency: dict[str, list[float]] = collections.defaultdict(list)
        self.refused: collections.Counter[str] = collections.Counter()  # 429 answers per kind
        self.no_retry_after = 0


async def client(base, queries, passages, ref, windows, deadline, tally, seed):
    import httpx
    import numpy as np

    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=300) as http:
        while time.monotonic() < deadline:
            kind = rng.choice(["embed1", "embed16", "rerank"])
            if kind == "embed1":
                items = [rng.choice(queries)]
                body = {"model": MODEL, "input": items}
            elif kind == "embed16":
                items = rng.sample(passages, 16)
                body = {"model": MODEL, "input": items}
            else:
                query, docs = rng.choice(queries), rng.sample(passages, rng.randint(10, 50))
                body = {"model": MODEL, "query": query, "documents": docs}
            tally.sent += 1
            start = time.perf_counter()
            try:
                resp = await http.post("/v1/rerank" if kind == "rerank" else "/v1/embeddings", json=body)
            except httpx.HTTPError as exc:
                tally.lost.append(f"{kind}: {type(exc).__name__}")
                continue
            tally.status[resp.status_code] += 1
            if resp.status_code == 200:
                tally.latency[kind].append(time.perf_counter() - start)
            if resp.status_code == 429:
                tally.refused[kind] += 1
                if "retry-after" not in resp.headers:
                    tally.no_retry_after += 1
                await asyncio.sleep(float(resp.headers.get("retry-after", 1)))
                continue
            if resp.status_code != 200:
                continue
            data = resp.json()
            if kind == "rerank":
                q = ref[query]  # the service chunks long passages by default: a passage scores its best window
                expected = np.array([(windows[t] @ q).max() for t in docs])
                got = {r["index"]: r["relevance_score"] for r in data["results"]}
                order = [r["index"] for r in data["results"]]
                if sorted(got) != list(range(len(docs))) or max(abs(got[i] - expected[i]) for i in got) > 1e-4:
                    tally.wrong.append("rerank scores")
                elif any(got[a] < got[b] for a, b in itertools.pairwise(order)):
                    tally.wrong.append("rerank order")
            else:
                vectors = np.array([e["embedding"] for e in data["data"]], dtype=np.float32)
                if vectors.shape[0] != len(items) or np.abs(vectors - np.stack([ref[t] for t in items])).max() > 1e-4:
                    tally.wrong.append(kind)


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args(argv)
    from embedrank import Chunking, Encoder
    from embedrank.models.chunking import split_windows
    from embedrank.testing.launch import running_server

    queries, passages = texts()
    encoder = Encoder.from_pretrained(MODEL)
    pool = list(dict.fromkeys(queries + passages))
    ref = dict(zip(pool, encoder.encode(pool, show_progress=False), strict=True))
    split = split_windows(passages, encoder.token_offsets, window=encoder.chunk_window(), chunking=Chunking())
    window_vectors = encoder.encode(split.texts, show_progress=False)
    windows = {t: window_vectors[split.owners == i] for i, t in enumerate(passages)}  # (W, D) per passage
    tally = Tally()
    env = {"EMBEDRANK_API_KEYS": KEY, "HF_HUB_OFFLINE": "1", "EMBEDRANK_IDLE_SECONDS": str(IDLE_SECONDS)}
    with running_server(env) as base:
        before = rss_mib(base.pid)

        async def run() -> None:
            deadline = time.monotonic() + args.seconds
            await asyncio.gather(
                *(client(base, queries, passages, ref, windows, deadline, tally, seed) for seed in range(args.clients))
            )

        start = time.monotonic()
        asyncio.run(run())
        elapsed = time.monotonic() - start
        after, peak = rss_mib(base.pid), rss_mib(base.pid, "VmHWM")
        time.sleep(IDLE_SECONDS + 2)
        quiet = rss_mib(base.pid)
    answered = sum(tally.status.values())
    print(f"{args.clients} clients for {args.seconds:.0f} s (last answers after {elapsed:.0f} s)")
    print(f"sent {tally.sent}, answered {answered}: " + ", ".join(f"{s}: {n}" for s, n in sorted(tally.status.items())))
    print(f"wrong {len(tally.wrong)} {sorted(set(tally.wrong))}, lost {len(tally.lost)} {sorted(set(tally.lost))[:3]}")
    for kind, values in sorted(tally.latency.items()):
        print(
            f"  {kind:8s} 200: {len(values):4d}  p50 {percentile(values, 50):7.3f} s  p95 {percentile(values, 95):7.3f} s"
            f"  p99 {percentile(values, 99):7.3f} s   429: {tally.refused[kind]}"
        )
    print(
        f"server RSS: before {before:.0f} MB, peak {peak:.0f} MB, after the load {after:.0f} MB, "
        f"after {IDLE_SECONDS} s quiet {quiet:.0f} MB"
    )
    only_ok = set(tally.status) <= {200, 429} and not tally.no_retry_after
    print(
        f"goal 0 lost: {'met' if not tally.lost else 'NOT met'}; goal 0 wrong: {'met' if not tally.wrong else 'NOT met'}; "
        f"goal only 200 and 429 with Retry-After: {'met' if only_ok else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run())
