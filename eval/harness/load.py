"""Load generators the benchmarks share: a closed-loop HTTP load on ``/v1/embeddings`` from a child process
(a lean HTTP/1.1 client, so that it costs the machine little), the server's own forward-pass counters from
``/metrics``, and the same load on a runtime behind embedrank's batching engine in this process (no HTTP)."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time

from eval.harness.clients import KEY, MODEL
from eval.harness.stats import cpu_seconds, percentile, tree_cpu_seconds, tree_rss_bytes

WORDS = (
    "retrieval dense sparse ranking passage query vector embedding model transformer index search "
    "relevance document corpus neural encoder training evaluation benchmark latency throughput"
).split()


def make_texts(n: int, words: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) + f" {i}" for i in range(n)]


def through_engine(
    runtime, texts: list[str], clients: int, seconds: float, *, per_request: int = 1, config=None
) -> tuple[float, float]:
    """``runtime`` behind embedrank's batching engine in this process (``config``, default the engine's own
    defaults, as the server gives a model on the CPU), ``clients`` concurrent callers sending ``per_request``
    texts each and waiting for their vectors: the service's path without HTTP and the web app (tokenizing in
    worker threads, batching, the forward threads). Returns texts/s and the mean batch size; each caller sends
    at least one request, after a warm-up of up to 0.5 s."""
    from embedrank.serving.runners import AsyncEncoder

    sizes: list[int] = []
    chunks = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]

    async def run() -> float:
        encoder = AsyncEncoder(runtime, config, on_batch=lambda report: sizes.append(report.items))
        encoder.engine.start()
        counter = itertools.count()  # which chunk each request sends

        async def caller(deadline: float) -> int:
            answered = 0
            while answered == 0 or time.perf_counter() < deadline:
                answered += len((await encoder.embed(chunks[next(counter) % len(chunks)])).values)
            return answered

        await asyncio.gather(*(caller(time.perf_counter() + min(seconds, 0.5)) for _ in range(clients)))  # warm up
        sizes.clear()
        t0 = time.perf_counter()
        done = sum(await asyncio.gather(*(caller(t0 + seconds) for _ in range(clients))))
        elapsed = time.perf_counter() - t0  # until the last answer, which the count includes
        await encoder.engine.drain()
        return done / elapsed

    try:
        import uvloop
    except ImportError:  # a GPU machine with only the service's wheels may lack it
        rate = asyncio.run(run())
    else:
        rate = uvloop.run(run())
    return rate, statistics.mean(sizes) if sizes else 0.0


async def drive(
    base: str,
    texts: list[str],
    per_request: int,
    clients: int,
    requests: int,
    pid: int | None = None,
    model: str = MODEL,
) -> dict:
    """Closed-loop load: ``clients`` keep-alive connections, each sending its next request on reply.

    A lean HTTP/1.1 client (pre-encoded requests, msgspec for the reply) keeps the load generator's
    own CPU use small, since it shares the machine's two cores with the server.
    """
    import msgspec

    host, port = base.removeprefix("http://").split(":")
    bodies = []
    for i in range(requests):
        batch = [texts[(i * per_request + j) % len(texts)] for j in range(per_request)]
        payload = msgspec.json.encode({"model": model, "input": batch})
        head = (
            f"POST /v1/embeddings HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        bodies.append(head + payload)
    usage = msgspec.json.Decoder(dict)
    latencies: list[float] = []
    tokens = 0
    next_request = 0
    refused = 0  # 429 answers (the server's queue is full), each retried after its Retry-After

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> int:
        nonlocal refused
        while True:
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
            fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
            body = await reader.readexactly(int(fields[b"content-length"]))
            if status == 429:  # as the OpenAI SDK does: wait as told, send again
                refused += 1
                await asyncio.sleep(float(fields.get(b"retry-after", b"1")))
                continue
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
            return int(usage.decode(body)["usage"]["total_tokens"])

    async def client() -> None:
        nonlocal tokens, next_request
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            await one(reader, writer, bodies[0])  # warm-up, not counted
        finally:
            writer.close()  # the server drops connections idle for 5 s, and the slowest warm-up can take longer
            warm.release()  # also on an error: the clock must not wait for a client that failed
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
    refused = 0  # the warm-up's are not counted
    engine_start = engine_totals(base)
    server_start, client_start, tree_start = cpu_seconds(pid), time.process_time(), tree_cpu_seconds(pid)
    t0 = time.perf_counter()
    ready.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    server_end, client_end, tree_end = cpu_seconds(pid), time.process_time(), tree_cpu_seconds(pid)
    engine_end = engine_totals(base)
    # cores each kind of the server's processes used (server_cpu's process, its children), by role
    processes = {role: (tree_end[role] - tree_start.get(role, 0.0)) / elapsed for role in tree_end}
    batches = max(1.0, engine_end["batches"] - engine_start["batches"])
    return {
        "busy": (engine_end["seconds"] - engine_start["seconds"]) / elapsed,
        "server_cpu": (server_end[0] - server_start[0]) / elapsed,
        "loop_cpu": (server_end[1] - server_start[1]) / elapsed,
        "client_cpu": (client_end - client_start) / elapsed,
        "processes": processes,
        "cores": sum(processes.values()),  # every process of the server together
        "rss": tree_rss_bytes(pid),  # bytes each kind of the server's processes holds at the end, by role
        "mean_batch": (engine_end["items"] - engine_start["items"]) / batches,
        "refused": refused,
        "inputs_s": requests * per_request / elapsed,
        "tokens_s": tokens / elapsed,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p95_ms": 1000 * percentile(latencies, 95),
        "p99_ms": 1000 * percentile(latencies, 99),
    }


def engine_totals(base: str) -> dict[str, float]:
    """Sums over all models from the server's /metrics: forward seconds, batches and items (zeros for a
    server without embedrank's metrics, such as Infinity)."""
    import urllib.error
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    totals = {"seconds": 0.0, "batches": 0.0, "items": 0.0}
    req = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read().decode()
    except urllib.error.URLError:
        return totals
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "embedrank_batch_seconds_sum":
                totals["seconds"] += sample.value
            elif sample.name == "embedrank_batch_size_count":
                totals["batches"] += sample.value
            elif sample.name == "embedrank_batch_size_sum":
                totals["items"] += sample.value
    return totals


def run_client(base: str, texts: list[str], per_request: int, clients: int, requests: int, model: str = MODEL) -> dict:
    """Runs the load generator in a child process so it does not share the benchmark's interpreter (``base``
    from :func:`start_server` carries the server's process id, for its CPU use)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        pid = getattr(base, "pid", None)
        return pool.apply(_client_entry, (str(base), texts, per_request, clients, requests, pid, model))


def _client_entry(base, texts, per_request, clients, requests, pid, model=MODEL):
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(drive(base, texts, per_request, clients, requests, pid, model))
