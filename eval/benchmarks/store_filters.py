#!/usr/bin/env python
"""A vector store's search with an attribute filter against the same search without one, for every first stage.

A store's index (:class:`~embedrank.retrieval.store.StoreIndex`, what a served store searches) over ``--chunks``
chunks: 384-dimension unit vectors (MiniLM's size) drawn around 1,000 seeded centres, texts of 40 words drawn
from the vocabulary of embedrank's packaged sample (Zipf-like, seeded), and attributes ``year`` (2000-2024) and
``lang`` (one of five). The filter, ``year >= 2015 and lang in [en, de]``, allows about 16% of the chunks. Each of
``--queries`` queries (four words, and a vector around the same centres) is searched for the top 10 chunks by
dense, BM25 and hybrid (dense and BM25 fused, each 1,000 deep), each with and without the filter, the six in a
rotating order (A B A B). Printed: p50 and p99 latency in milliseconds per stage and the filtered search's p50 as
a multiple of the unfiltered one's (a filter evaluated over the chunks' attribute columns, BM25 scoring only the
allowed chunks).

    python -m eval bench store-filters                         # 100,000 chunks, about 3 minutes on 2 cores
    python -m eval bench store-filters --chunks 20000 --queries 50
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time

import numpy as np

from embedrank.retrieval.filters import parse_filter
from embedrank.retrieval.store import Chunks, StoreIndex
from embedrank.texts import packaged_sample
from eval.harness.stats import percentile

DIMENSION = 384
FILTER = {
    "type": "and",
    "filters": [
        {"type": "gte", "key": "year", "value": 2015},
        {"type": "in", "key": "lang", "value": ["en", "de"]},
    ],
}
STAGES = ("dense", "bm25", "hybrid")


def words(rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
    """The packaged sample's distinct words and a Zipf-like probability of each (the commoner words first)."""
    counts: dict[str, int] = {}
    for text in packaged_sample():
        for word in re.findall(r"[a-z]{3,}", text.lower()):
            counts[word] = counts.get(word, 0) + 1
    vocabulary = sorted(counts, key=lambda w: -counts[w])
    weights = 1.0 / np.arange(1, len(vocabulary) + 1)
    return vocabulary, weights / weights.sum()


def store(n: int, rng: np.random.Generator) -> tuple[StoreIndex, np.ndarray, list[str], np.ndarray]:
    """A store of ``n`` chunks, the centres of its vectors, and the vocabulary its texts are drawn from."""
    centres = rng.standard_normal((1000, DIMENSION)).astype(np.float32)
    vectors = centres[rng.integers(0, 1000, n)] + 0.6 * rng.standard_normal((n, DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    vocabulary, p = words(rng)
    drawn = rng.choice(len(vocabulary), size=(n, 40), p=p)
    texts = [" ".join(vocabulary[i] for i in row) for row in drawn]
    langs = np.array(["en", "de", "fr", "es", "it"])[rng.integers(0, 5, n)]
    years = rng.integers(2000, 2025, n)
    attributes = [{"year": int(y), "lang": str(lang)} for y, lang in zip(years, langs, strict=True)]
    data = Chunks(
        version=1,
        file_ids=["f"] * n,
        filenames=["f"] * n,
        texts=texts,
        attributes=attributes,
        vectors=vectors.astype(np.float32),
    )
    return StoreIndex(data), centres, vocabulary, p


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=100_000, help="chunks in the store (default 100,000)")
    parser.add_argument("--queries", type=int, default=200, help="queries, each searched six ways (default 200)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    index, centres, vocabulary, p = store(args.chunks, rng)
    where = parse_filter(FILTER)
    allowed = index.allowed(where)
    assert allowed is not None
    index.search("bm25", ["warm"], None, None, 10)  # BM25's index is built on the first search that needs it
    built = time.perf_counter() - t0
    queries = [" ".join(vocabulary[i] for i in rng.choice(len(vocabulary), size=4, p=p)) for _ in range(args.queries)]
    vectors = centres[rng.integers(0, 1000, args.queries)] + 0.6 * rng.standard_normal((args.queries, DIMENSION))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    runs = [(stage, filtered) for stage in STAGES for filtered in (False, True)]
    times: dict[tuple[str, bool], list[float]] = {run: [] for run in runs}
    for q, (text, vector) in enumerate(zip(queries, vectors, strict=True)):
        for stage, filtered in runs[q % len(runs) :] + runs[: q % len(runs)]:  # each first in turn
            t = time.perf_counter()
            found = index.search(stage, [text], vector[None, :], where if filtered else None, 10)  # type: ignore[arg-type]
            times[stage, filtered].append((time.perf_counter() - t) * 1000)
            assert not filtered or all(allowed[row] for row, _ in found)
    print(
        f"{args.chunks:,} chunks ({int(allowed.sum()):,} pass the filter, {allowed.mean():.0%}), {args.queries} "
        f"queries, top 10; store and BM25 index built in {built:.0f} s"
    )
    print("| stage | p50 ms | p99 ms | filtered p50 ms | filtered p99 ms | filtered / unfiltered (p50) |")
    print("|---|---|---|---|---|---|")
    for stage in STAGES:
        plain, kept = times[stage, False], times[stage, True]
        ratio = statistics.median(kept) / statistics.median(plain)
        cells = [f"{statistics.median(v):.2f} | {percentile(v, 99):.2f}" for v in (plain, kept)]
        print(f"| {stage} | {' | '.join(cells)} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(run())
