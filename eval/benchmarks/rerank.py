#!/usr/bin/env python
"""Cross-encoder scoring of each backend against ``sentence_transformers.CrossEncoder.predict`` (torch fp32).

Workload: ``--queries`` (10) SciFact test queries, each against ``--passages`` (100) SciFact documents
(the query's BM25 top 100 would need an index; the first documents of the corpus are as long). The model is
``--model`` (a cross-encoder path or hub id), by default a local cross-encoder built from the packaged
MiniLM with a seeded head (:mod:`embedrank.testing.seeded`): no cross-encoder weights exist offline, and
speed does not depend on what the head learned. Systems alternate per round (A B A B); each ratio is
sentence-transformers' time over the system's in the same round, median over ``--rounds``. Quality: the
largest score difference and the mean Kendall tau of each query's ranking against sentence-transformers'.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="cross-encoder path or hub id (default: the seeded local MiniLM cross-encoder)")
    p.add_argument("--systems", nargs="+", default=["torch:fp32", "openvino:fp32", "openvino:bf16", "openvino:int8"])
    p.add_argument("--queries", type=int, default=10)
    p.add_argument("--passages", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    import numpy as np
    import pandas as pd
    from scipy.stats import kendalltau
    from sentence_transformers import CrossEncoder as STCrossEncoder

    from embedrank import CrossEncoder
    from embedrank.retrieval.data import default_data_dir, doc_text, load_beir
    from embedrank.testing.seeded import seeded_cross_encoder

    root = default_data_dir()
    if root is None or not (root / "scifact" / "corpus.jsonl").is_file():
        raise SystemExit("needs SciFact in the data directory ($EMBEDRANK_DATA, else ~/.local/share/embedrank)")
    ds = load_beir(root / "scifact")
    queries = list(ds.queries.values())[: args.queries]
    passages = [doc_text(d) for d in list(ds.corpus.values())[: args.passages]]
    model = args.model or seeded_cross_encoder()  # built once into the cache, so its exports are reused
    systems: dict[str, object] = {"sentence-transformers": STCrossEncoder(model, device="cpu")}
    for entry in args.systems:
        backend, _, precision = entry.partition(":")
        systems[entry] = CrossEncoder.from_pretrained(model, backend=backend, precision=precision or "fp32")

    def score(system: object, query: str) -> np.ndarray:
        if isinstance(system, STCrossEncoder):
            pairs = [(query, d) for d in passages]
            return np.asarray(system.predict(pairs, batch_size=args.batch_size, show_progress_bar=False))
        return system.score(query, passages, batch_size=args.batch_size)  # type: ignore[attr-defined]

    for system in systems.values():
        score(system, queries[0])
    seconds: dict[str, list[float]] = {}
    scores: dict[str, list[np.ndarray]] = {}
    for r in range(args.rounds):
        for name, system in systems.items():
            t0 = time.perf_counter()
            scores[name] = [score(system, q) for q in queries]
            seconds.setdefault(name, []).append(time.perf_counter() - t0)
            print(f"round {r + 1}: {name} done", flush=True)
    ref_s, ref = seconds["sentence-transformers"], scores["sentence-transformers"]
    pairs = len(queries) * len(passages)
    rows = []
    for name in systems:
        ratio = statistics.median(b / a for a, b in zip(seconds[name], ref_s, strict=True))
        taus = [kendalltau(a, b).statistic for a, b in zip(scores[name], ref, strict=True)]
        rows.append(
            {
                "system": name,
                "pairs/s": round(pairs / statistics.median(seconds[name]), 1),
                "ratio": round(ratio, 2),
                "max |diff|": f"{max(float(np.abs(a - b).max()) for a, b in zip(scores[name], ref, strict=True)):.1e}",
                "kendall tau": round(float(np.mean(taus)), 4),
            }
        )
    print(
        f"{len(queries)} SciFact queries x {len(passages)} passages; batch_size={args.batch_size}; rounds={args.rounds}; "
        f"ratio = median over rounds of sentence-transformers' time / the system's time in the same round"
    )
    print(pd.DataFrame(rows).set_index("system").to_string())


if __name__ == "__main__":
    raise SystemExit(run())
