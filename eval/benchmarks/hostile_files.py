#!/usr/bin/env python
"""Files from one key made to stall a vector store server, and what another key sees meanwhile.

A real server process (``litestar run``, weightless fake models so that what is measured is the file reading,
SQLite in a temporary folder, ``--read-seconds`` as ``file_read_seconds``). Key A uploads ``--pdfs`` PDFs whose
2,000 pages share one content stream that inflates to 300 KB (about 300 KB each on disk, minutes of text
extraction each) and attaches them to a store in one file batch. While they are read, key B runs
``--clients`` loops of its own calls: list its stores, upload a file, list its files, list its batches, and
search a store of its own (made before the PDFs arrive). Printed: each call's p50 and p99 while A's files are
read, the server's resident memory with its file readers, the time A's files take to fail and why, how long
SIGTERM takes to stop the server, and whether a restart reads A's files again. Goal: B's p99 under 0.5 s.

    python -m eval bench hostile-files                 # 8 PDFs, 60 s per read, 4 clients
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import sys
import tempfile
import threading
import time

import httpx
import psutil

from embedrank.testing.hostile_files import pdf_sharing_one_stream
from embedrank.testing.launch import running_server
from eval.harness.stats import tree_rss_mib

HOSTILE, OTHER = "key-hostile", "key-other"


def client(base: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=f"{base}/v1", headers={"Authorization": f"Bearer {key}"}, timeout=60)


def upload(api: httpx.Client, name: str, content: bytes) -> str:
    made = api.post("/files", data={"purpose": "assistants"}, files={"file": (name, content)})
    made.raise_for_status()
    return str(made.json()["id"])


def counts(api: httpx.Client, store: str) -> dict:
    return dict(api.get(f"/vector_stores/{store}").raise_for_status().json()["file_counts"])


def calls(api: httpx.Client, store: str, n: int) -> dict[str, float]:
    """One round of the other key's calls: each one's seconds."""
    out = {}
    for name, call in (
        ("GET /v1/vector_stores", lambda: api.get("/vector_stores")),
        ("POST /v1/files", lambda: api.post("/files", data={"purpose": "assistants"}, files={"file": (f"n{n}.txt", b"a note")})),
        ("GET /v1/files", lambda: api.get("/files")),
        ("GET /v1/batches", lambda: api.get("/batches")),
        ("POST /v1/vector_stores/{id}/search", lambda: api.post(f"/vector_stores/{store}/search", json={"query": "tea"})),
    ):  # fmt: skip
        started = time.perf_counter()
        call().raise_for_status()
        out[name] = time.perf_counter() - started
    return out


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pdfs", type=int, default=8)
    p.add_argument("--read-seconds", type=float, default=60.0)
    p.add_argument("--clients", type=int, default=4)
    args = p.parse_args(argv)
    bomb = pdf_sharing_one_stream(pages=2000, stream_bytes=300_000)
    with tempfile.TemporaryDirectory(prefix="embedrank-bench-hostile-") as folder:
        env = {
            "EMBEDRANK_API_KEYS": f"{HOSTILE},{OTHER}",
            "EMBEDRANK_MODELS": "enc=fake:encoder",
            "EMBEDRANK_BATCH_DIR": folder,
            "EMBEDRANK_FILE_READ_SECONDS": str(args.read_seconds),
            "EMBEDRANK_TUNE_MALLOC": "false",
        }
        with running_server(env) as base:
            hostile, other = client(base, HOSTILE), client(base, OTHER)
            mine = other.post(
                "/vector_stores", json={"name": "mine", "file_ids": [upload(other, "tea.txt", b"green tea leaves")]}
            )
            store = mine.raise_for_status().json()["id"]
            idle = tree_rss_mib(base.pid)
            ids = [upload(hostile, f"bomb-{i}.pdf", bomb) for i in range(args.pdfs)]
            started = time.monotonic()
            bombs = (
                hostile.post("/vector_stores", json={"name": "bombs", "file_ids": ids}).raise_for_status().json()["id"]
            )
            timings: dict[str, list[float]] = {}
            peak, lock, stop = idle, threading.Lock(), threading.Event()

            def loop(number: int) -> None:
                api, n = client(base, OTHER), 0
                while not stop.is_set():
                    n += 1
                    for name, seconds in calls(api, store, number * 100_000 + n).items():
                        with lock:
                            timings.setdefault(name, []).append(seconds)

            threads = [threading.Thread(target=loop, args=(i,)) for i in range(args.clients)]
            for t in threads:
                t.start()
            while counts(hostile, bombs)["in_progress"]:
                peak = max(peak, tree_rss_mib(base.pid))
                time.sleep(0.5)
            took = time.monotonic() - started
            stop.set()
            for t in threads:
                t.join()
            errors = {
                f["last_error"]["message"].split(" (limit ")[-1].rstrip(")")
                for f in hostile.get(f"/vector_stores/{bombs}/files").json()["data"]
            }
            print(f"{args.pdfs} PDFs of {len(bomb) / 1000:.0f} KB (2,000 pages sharing one stream of 300 KB), "
                  f"{args.clients} clients of the other key, file_read_seconds={args.read_seconds:g}")  # fmt: skip
            print(
                f"the PDFs: {counts(hostile, bombs)['failed']} failed after {took:.0f} s, limits named: {sorted(errors)}"
            )
            print("| the other key's call | calls | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|")
            for name, values in timings.items():
                q = statistics.quantiles(values, n=100)
                print(
                    f"| {name} | {len(values)} | {q[49] * 1000:.0f} | {q[98] * 1000:.0f} | {max(values) * 1000:.0f} |"
                )
            print(f"server with its file readers: {idle:.0f} MB resident before, {peak:.0f} MB at most while reading")
            # a read in progress when the server is told to stop: the store of one more PDF
            again = (
                hostile.post("/vector_stores", json={"name": "again", "file_ids": ids[:1]})
                .raise_for_status()
                .json()["id"]
            )
            time.sleep(3)
            stopping = time.monotonic()
            base.process.send_signal(signal.SIGTERM)
            base.process.wait(timeout=120)
            print(
                f"SIGTERM during a read: exited with code {base.process.returncode} after {time.monotonic() - stopping:.1f} s"
            )
        with running_server(env) as base:
            hostile = client(base, HOSTILE)
            time.sleep(5)
            readers = [
                p
                for p in psutil.Process(base.pid).children(recursive=True)
                if "forkserver" not in " ".join(p.cmdline())
            ]
            print(f"after a restart: the failed PDFs stay {counts(hostile, bombs)}; the read cut by SIGTERM "
                  f"starts again ({counts(hostile, again)}), {len(readers)} reading process(es)")  # fmt: skip
            with contextlib.suppress(httpx.HTTPError):
                hostile.delete(f"/vector_stores/{again}")


if __name__ == "__main__":
    sys.exit(run())
