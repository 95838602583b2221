#!/usr/bin/env python
"""A vector store's dense search, exact against HNSW, by the number of chunks: what ``auto`` (exact below
1,000,000 chunks, HNSW above) rests on.

For each size, a store's index (:class:`~embedrank.retrieval.store.StoreIndex`) over that many 384-dimension
unit vectors (MiniLM's size) drawn around 1,000 random centres (so that neighbours exist, as in a corpus;
seeded; the queries around the same centres) answers ``--queries`` single-query searches for the top 10 chunks, alternately exact and through HNSW
(M 32, efConstruction 200, efSearch 128: the library's defaults), A B A B. Printed per size: each one's p50 and
p99 latency in milliseconds, HNSW's build time (saved to a temporary folder, as the service saves it), the time
until the next version's HNSW is ready when 1% more chunks arrive (the saved index loaded and grown, as the
service does) and HNSW's recall@10 against the exact search; then, with the first quarter of the chunks
removed from that grown store (just under a quarter of its index, whose searches skip them), HNSW's p50 and
recall@10 against the exact search of the chunks left.

    python -m eval bench store-index                          # about 5 minutes on 2 cores
    python -m eval bench store-index --sizes 10000 100000 --queries 100
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from embedrank.retrieval.store import AUTO_ANN_CHUNKS, StoreIndex
from eval.harness.stats import percentile
from eval.harness.synthetic import clusters, store, vectors


def ready(index: StoreIndex) -> float:
    """Seconds until ``index``'s approximate index is built (and saved, with a folder)."""
    t0 = time.perf_counter()
    index.approximate()
    index.wait_built()
    return time.perf_counter() - t0


def side_by_side(exact: StoreIndex, ann: StoreIndex, queries: np.ndarray) -> tuple[dict[str, list[float]], float]:
    """Each query searched exactly and through HNSW, A B A B: the latencies in ms of each, and HNSW's mean
    recall@10 against the exact search."""
    times: dict[str, list[float]] = {"exact": [], "hnsw": []}
    recalls = []
    for q in queries:
        found = {}
        for name, index in (("exact", exact), ("hnsw", ann)):
            t = time.perf_counter()
            found[name] = index.dense(q[None, :], None, 10)["0"]
            times[name].append((time.perf_counter() - t) * 1000)
        recalls.append(len(set(found["exact"]) & set(found["hnsw"])) / 10)
    return times, statistics.mean(recalls)


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 100_000, 200_000], help="chunks per store")
    p.add_argument("--queries", type=int, default=200, help="searches per size and index (default 200)")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"dense search of a store, top 10, one query at a time; auto switches to HNSW at {AUTO_ANN_CHUNKS:,} chunks")
    print(
        "| chunks | exact p50 ms | exact p99 ms | HNSW p50 ms | HNSW p99 ms | HNSW build s | HNSW grown by 1% s "
        "| HNSW recall@10 | a quarter removed: HNSW p50 ms | recall@10 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        centres = clusters(rng)
        x = vectors(n, centres, rng)
        queries = vectors(args.queries, centres, rng)
        with tempfile.TemporaryDirectory() as folder:
            exact, ann = store(x, "flat"), store(x, "hnsw", Path(folder))
            build = ready(ann)
            more = np.concatenate([x, vectors(n // 100, centres, rng)])
            grown = store(more, "hnsw", Path(folder), version=2)
            grow = ready(grown)
            assert grown.reused == n, grown.reused
            quarter = n // 4  # the first quarter's chunks removed: just under a quarter of the grown index
            kept = store(more[quarter:], "hnsw", Path(folder), version=3, first=quarter)
            ready(kept)
            assert kept.reused == len(more) - quarter, kept.reused  # grown from the save, the removed skipped
        del grown
        times, recall = side_by_side(exact, ann, queries)
        cells = [
            f"{f(times[k]):.2f}" for k in ("exact", "hnsw") for f in (statistics.median, lambda v: percentile(v, 99))
        ]
        del exact, ann
        kept_times, kept_recall = side_by_side(store(more[quarter:], "flat"), kept, queries)
        removed = f"{statistics.median(kept_times['hnsw']):.2f} | {kept_recall:.3f}"
        print(f"| {n:,} | {' | '.join(cells)} | {build:.1f} | {grow:.1f} | {recall:.3f} | {removed} |")
    return 0


if __name__ == "__main__":
    sys.exit(run())
