#!/usr/bin/env python
"""Vector stores over HTTP: how fast a corpus is read into a store, how fast a store answers searches, and what
a stored chunk costs in memory.

Starts ``litestar run`` on a free loopback port (the packaged MiniLM, and the seeded MiniLM cross-encoder as
``reranker``: the size of ms-marco-MiniLM-L6, random head: for timing only) with a store folder of its own and
the embedding cache off, and measures on SciFact's corpus (5,183 documents):

- **ingestion**: the corpus uploaded as one JSON Lines file and attached to a new store (``auto`` chunking:
  windows of 254 tokens, 127 of overlap), from the attach to every chunk searchable; alternated A B A B with
  ``python -m embedrank.embed`` on the same chunk texts (read back from the first store), the same work without
  HTTP, database or search index. Their chunks per second, and the ratio of the medians.
- **search**: SciFact's queries against the store at 1 and 16 concurrent clients, ``ranker: none`` (the dense
  first stage alone, 10 results; ``--requests`` searches) and with ``reranker`` rescoring the top 50
  (``--reranked-requests``): p50 and p99 latency and searches per second. A search the server refuses with 429
  (its queue's estimated wait past ``max_queue_seconds``) is sent again after ``Retry-After``, as the openai SDK
  does; its latency counts from the first attempt, and the 429s are counted.
- **memory**: the server's resident memory before the store's first search and after it (when its index is
  read into memory), per chunk.

    python -m eval bench vector-store                 # about 35 minutes on 2 cores
    python -m eval bench vector-store --rounds 1 --requests 100 --reranked-requests 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from eval.harness.stats import percentile, rss_mib

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
KEY = "bench-vector-store-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}


def _client(base: str):
    import httpx

    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    return httpx.AsyncClient(base_url=base, headers=HEADERS, timeout=3600, limits=limits)


async def ingest(base: str, corpus: bytes) -> tuple[float, str, int]:
    """Upload ``corpus`` (JSON Lines), attach it to a new store, wait until it is read: the seconds from the attach
    to the end, the store's id, and its chunks."""
    async with _client(base) as client:
        upload = await client.post(
            "/v1/files", data={"purpose": "assistants"}, files={"file": ("scifact.jsonl", corpus)}
        )
        upload.raise_for_status()
        store = (await client.post("/v1/vector_stores", json={"name": "scifact"})).json()
        start = time.perf_counter()
        attached = await client.post(f"/v1/vector_stores/{store['id']}/files", json={"file_id": upload.json()["id"]})
        attached.raise_for_status()
        while True:
            counts = (await client.get(f"/v1/vector_stores/{store['id']}")).json()["file_counts"]
            if not counts["in_progress"]:
                break
            await asyncio.sleep(0.1)
        seconds = time.perf_counter() - start
        if counts["completed"] != 1:
            raise SystemExit(f"the file was not read: {counts}")
        file_id = upload.json()["id"]
        chunks = (await client.get(f"/v1/vector_stores/{store['id']}/files/{file_id}/content")).json()["data"]
        return seconds, store["id"], len(chunks)


async def chunk_texts(base: str, store_id: str) -> list[str]:
    async with _client(base) as client:
        files = (await client.get(f"/v1/vector_stores/{store_id}/files")).json()["data"]
        content = await client.get(f"/v1/vector_stores/{store_id}/files/{files[0]['id']}/content")
        return [c["text"] for c in content.json()["data"]]


def embed_job(texts: list[str], folder: Path) -> float:
    """``python -m embedrank.embed`` on ``texts`` (a corpus of one document each): its seconds."""
    corpus = folder / "chunks.jsonl"
    corpus.write_text("".join(json.dumps({"_id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)))
    out = folder / f"out-{time.monotonic_ns()}"
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "embedrank.embed", str(corpus), "--output", str(out), "--model", MODEL],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


async def searches(
    base: str, store_id: str, queries: list[str], clients: int, requests: int, body: dict
) -> tuple[list[float], float, int]:
    """``requests`` searches from ``clients`` concurrent clients, each sent again after a 429's ``Retry-After`` as
    the openai SDK does: each one's latency (its retries included), the wall seconds, and the 429s answered."""
    latencies: list[float] = []
    refused = 0
    sent = iter(range(requests))

    async def worker(client) -> None:
        nonlocal refused
        for i in sent:
            start = time.perf_counter()
            while True:
                body_i = {**body, "query": queries[i % len(queries)]}
                resp = await client.post(f"/v1/vector_stores/{store_id}/search", json=body_i)
                if resp.status_code != 429:
                    break
                refused += 1
                await asyncio.sleep(float(resp.headers.get("retry-after", "1")))
            resp.raise_for_status()
            latencies.append(time.perf_counter() - start)

    async with _client(base) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        return latencies, time.perf_counter() - start, refused


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="A B rounds of the ingestion (default 2)")
    p.add_argument("--requests", type=int, default=300, help="searches per case without a ranker (default 300)")
    p.add_argument("--reranked-requests", type=int, default=64, help="searches per case with the reranker (default 64)")
    args = p.parse_args(argv)
    from embedrank.retrieval.data import default_data_dir, load_beir
    from embedrank.testing.launch import running_server
    from embedrank.testing.seeded import seeded_cross_encoder

    root = default_data_dir()
    if root is None or not (root / "scifact" / "corpus.jsonl").is_file():
        raise SystemExit("needs SciFact in $EMBEDRANK_DATA (python eval/get_data.py scifact)")
    ds = load_beir(root / "scifact")
    corpus = "".join(
        json.dumps({"_id": d, "title": doc.get("title", ""), "text": doc.get("text", "")}) + "\n"
        for d, doc in ds.corpus.items()
    ).encode()
    queries = list(ds.queries.values())
    env = {
        "EMBEDRANK_API_KEYS": KEY,
        "HF_HUB_OFFLINE": "1",
        "EMBEDRANK_MODELS": f"{MODEL},reranker={seeded_cross_encoder()}",
        "EMBEDRANK_EMBEDDING_CACHE_BYTES": "0",  # every round computes every chunk
    }
    print(f"corpus: SciFact, {len(ds.corpus):,} documents as one JSON Lines file; {len(queries)} queries; {MODEL}")
    with tempfile.TemporaryDirectory() as tmp, running_server(env) as base:
        folder = Path(tmp)
        store_s, job_s = [], []
        store_id, chunks, texts = "", 0, []
        for round_ in range(1, args.rounds + 1):
            seconds, store_id, chunks = asyncio.run(ingest(base, corpus))
            store_s.append(seconds)
            if not texts:
                texts = asyncio.run(chunk_texts(base, store_id))
            job_s.append(embed_job(texts, folder))
            print(
                f"round {round_}: store {seconds:.1f} s ({chunks / seconds:.1f} chunks/s), "
                f"embed job on the same {len(texts):,} chunks {job_s[-1]:.1f} s ({len(texts) / job_s[-1]:.1f} chunks/s)"
            )
        ratio = statistics.median(job_s) / statistics.median(store_s)
        print(
            f"ingestion: {chunks:,} chunks of {len(ds.corpus):,} documents; store {chunks / statistics.median(store_s):.1f} "
            f"chunks/s ({len(ds.corpus) / statistics.median(store_s):.1f} documents/s), embed job "
            f"{len(texts) / statistics.median(job_s):.1f} chunks/s: store / embed job {ratio:.2f}"
        )
        print(f"goal ingestion: store >= 80% of the embed job: {ratio:.0%} {'met' if ratio >= 0.8 else 'NOT met'}")
        before = rss_mib(base.pid)
        asyncio.run(searches(base, store_id, queries, 1, 1, {"ranking_options": {"ranker": "none"}}))
        after = rss_mib(base.pid)
        print(
            f"memory: the store's index read into memory: {after - before:.1f} MiB for {chunks:,} chunks, "
            f"{(after - before) * 2**20 / chunks:,.0f} bytes per chunk (vectors alone: {384 * 4} bytes)"
        )
        cases = {
            "dense, no ranker": {"ranking_options": {"ranker": "none"}, "max_num_results": 10},
            "dense, reranker on the top 50": {
                "ranking_options": {"ranker": "reranker"},
                "max_num_results": 10,
                "rerank_candidates": 50,
            },
        }
        asyncio.run(searches(base, store_id, queries, 4, 20, cases["dense, reranker on the top 50"]))  # warm-up
        for name, body in cases.items():
            requests = args.reranked_requests if "reranker" in name else args.requests
            for clients in (1, 16):
                latencies, wall, refused = asyncio.run(searches(base, store_id, queries, clients, requests, body))
                print(
                    f"search, {name}, {clients} client{'s' if clients > 1 else ''}: p50 "
                    f"{percentile(latencies, 50) * 1000:.1f} ms, p99 {percentile(latencies, 99) * 1000:.1f} ms, "
                    f"{len(latencies) / wall:.1f} searches/s ({requests} searches, {refused} answers 429 "
                    "retried after Retry-After)"
                )
    return 0


if __name__ == "__main__":
    sys.exit(run())
