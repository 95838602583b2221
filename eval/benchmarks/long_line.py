"""One text file of a single line attached to a vector store: what it costs the server in memory, and what another
key's calls see meanwhile.

A real server process (``litestar run``, the packaged MiniLM, SQLite in a temporary folder). Key A uploads a
``.txt`` file of ``--megabytes`` MB on one line (words of the packaged sample's vocabulary, seeded, separated by
single spaces: about a quarter as many tokens as characters) and attaches it to a store. While the server reads
it, cuts it into chunks (windows of 254 tokens overlapping by 127) and starts embedding them, key B calls
``/health`` and searches a store of its own in ``--clients`` loops. Printed: the server's resident memory (with
its file readers) before the upload, after it and at most while the file is read, chunked and embedded, for
``--seconds`` after the attach; B's p50/p99 per call; then the same file in a store whose chunk limit (``max_vector_store_chunks``) it
passes: how soon it fails, and the memory it took. Goal: B's p99 under 0.5 s.

    python -m eval bench long-line                     # a 100 MB line, about 5 minutes on 2 cores
    python -m eval bench long-line --megabytes 20 --seconds 60
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time

import httpx

from embedrank.testing.launch import running_server
from embedrank.texts import packaged_sample
from eval.harness.stats import tree_rss_mib

WRITER, OTHER = "key-writer", "key-other"


def line_of_words(megabytes: float, seed: int = 0) -> bytes:
    """One line of ``megabytes`` MB: words of the packaged sample drawn at random (seeded), single spaces."""
    vocabulary = sorted({w for text in packaged_sample() for w in text.split() if w.isalpha()})
    rng = random.Random(seed)
    words, size, target = [], 0, int(megabytes * 1_000_000)
    while size < target:
        word = rng.choice(vocabulary)
        words.append(word)
        size += len(word) + 1
    return " ".join(words).encode()[:target]


def client(base: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=f"{base}/v1", headers={"Authorization": f"Bearer {key}"}, timeout=120)


def upload(api: httpx.Client, name: str, content: bytes) -> str:
    return str(api.post("/files", data={"purpose": "assistants"}, files={"file": (name, content)}).json()["id"])


def status(api: httpx.Client, store: str) -> dict:
    return dict(api.get(f"/vector_stores/{store}").raise_for_status().json()["file_counts"])


def attach_and_watch(base, writer: httpx.Client, file_id: str, seconds: float, until_done: bool) -> tuple[float, float]:
    """Attach ``file_id`` to a new store and follow the server's memory for ``seconds`` (or until the file is done,
    with ``until_done``): the peak MB resident and the seconds it ran; the store is deleted after."""
    store = writer.post("/vector_stores", json={"name": "line", "file_ids": [file_id]}).raise_for_status().json()["id"]
    started, peak = time.monotonic(), 0.0
    while time.monotonic() - started < seconds and not (until_done and not status(writer, store)["in_progress"]):
        peak = max(peak, tree_rss_mib(base.pid))
        time.sleep(0.25)
    took = time.monotonic() - started
    if until_done:
        files = writer.get(f"/vector_stores/{store}/files").json()["data"]
        print(f"the file: {files[0]['status']} after {took:.1f} s: {(files[0]['last_error'] or {}).get('message')}")
    writer.delete(f"/vector_stores/{store}")
    return peak, took


def other_key_calls(base, own: str, clients: int, stop: threading.Event) -> tuple[list[threading.Thread], dict]:
    """``clients`` threads of the other key calling ``/health`` and searching its store ``own`` until ``stop``
    (started); each call's seconds by name."""
    timings: dict[str, list[float]] = {"GET /health": [], "POST search": []}
    lock = threading.Lock()

    def timed(name: str, call) -> None:
        t = time.perf_counter()
        call().raise_for_status()
        with lock:
            timings[name].append(time.perf_counter() - t)

    def loop() -> None:
        api, health, n = client(base, OTHER), httpx.Client(timeout=120), 0
        while not stop.is_set():
            n += 1
            timed("GET /health", lambda: health.get(f"{base}/health"))
            query = {"query": f"tea {n}"}
            timed("POST search", lambda query=query: api.post(f"/vector_stores/{own}/search", json=query))
            time.sleep(0.05)

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for t in threads:
        t.start()
    return threads, timings


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--megabytes", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=180.0, help="how long the file is followed (default 180)")
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--chunk-limit", type=int, default=10_000, help="the second store's max_vector_store_chunks")
    args = p.parse_args(argv)
    content = line_of_words(args.megabytes)
    print(f"one line of {len(content) / 1e6:.0f} MB ({content.count(b' ') + 1:,} words), the packaged MiniLM")
    for limit in (None, args.chunk_limit):
        with tempfile.TemporaryDirectory(prefix="embedrank-bench-line-") as folder:
            env = {
                "EMBEDRANK_API_KEYS": f"{WRITER},{OTHER}",
                "EMBEDRANK_BATCH_DIR": folder,
                "HF_HUB_OFFLINE": "1",
                "EMBEDRANK_MAX_FILE_BYTES": str(max(len(content) + 1, 100_000_000)),
                **({"EMBEDRANK_MAX_VECTOR_STORE_CHUNKS": str(limit)} if limit else {}),
            }
            with running_server(env, timeout=600) as base:
                writer, other = client(base, WRITER), client(base, OTHER)
                mine = other.post("/vector_stores", json={"name": "mine", "file_ids": [upload(other, "t.txt", b"tea")]})
                own = mine.raise_for_status().json()["id"]
                while status(other, own)["in_progress"]:
                    time.sleep(0.2)
                time.sleep(2)
                started = tree_rss_mib(base.pid)
                file_id = upload(writer, "line.txt", content)
                time.sleep(2)
                idle = tree_rss_mib(base.pid)
                stop = threading.Event()
                threads, timings = other_key_calls(base, own, args.clients, stop)
                peak, took = attach_and_watch(base, writer, file_id, args.seconds, until_done=limit is not None)
                stop.set()
                for t in threads:
                    t.join()
            what = f"max_vector_store_chunks={limit}" if limit else f"the default limits, followed for {took:.0f} s"
            memory = (
                f"{started:.0f} MB resident before the upload, {idle:.0f} MB after it, {peak:.0f} MB at most "
                f"({peak - idle:+.0f} MB; {peak - started:+.0f} MB over the server before the upload)"
            )
            print(f"\n{what}: server with its file readers {memory}")
            print("| the other key's call | calls | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|")
            for name, values in timings.items():
                q = statistics.quantiles(values, n=100) if len(values) > 1 else values * 99
                print(
                    f"| {name} | {len(values)} | {q[49] * 1000:.0f} | {q[98] * 1000:.0f} | {max(values) * 1000:.0f} |"
                )
            worst = max(statistics.quantiles(v, n=100)[98] for v in timings.values() if len(v) > 1)
            print(f"goal the other key's p99 < 0.5 s: {worst:.3f} s {'met' if worst < 0.5 else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(run())
