#!/usr/bin/env python
"""What compact vectors cost in retrieval quality: the embeddings /v1/embeddings returns for each
``embedding_types`` value, searched exactly (float query against the compact corpus vectors, as
sentence-transformers rescores), on a BEIR collection.

For int8 it compares the default range sample (the packaged sample of 800 English texts:
:mod:`embedrank.models.ranges`) with ranges fitted on a sample of the corpus itself, and reports
how many corpus components fall outside the default ranges (they are clipped). ``eval/run.py --index
sq8|binary`` measures the compact FAISS indexes.

    python -m eval bench quantization scifact
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", nargs="?", default="scifact", help="BEIR collection name or path (default: scifact)")
    p.add_argument(
        "--data-dir",
        help="directory holding BEIR collections (default: $EMBEDRANK_DATA, else ~/.local/share/embedrank)",
    )
    p.add_argument("--range-sample", type=int, default=1000, help="corpus documents the corpus ranges are fitted on")
    args = p.parse_args(argv)

    import numpy as np
    import pandas as pd

    from embedrank import Encoder
    from embedrank.math.metrics import evaluate_per_query
    from embedrank.math.quantization import dequantize, quantization_ranges, quantize, unpack_signs
    from embedrank.retrieval.cache import EmbeddingCache
    from embedrank.retrieval.data import doc_text, load_beir
    from embedrank.retrieval.index import build_index
    from embedrank.retrieval.pipeline import embed_corpus

    ds = load_beir(args.dataset, data_dir=args.data_dir)
    encoder = Encoder.from_pretrained()
    ids = list(ds.corpus)
    corpus = embed_corpus(encoder, ids, [doc_text(ds.corpus[d]) for d in ids], cache=EmbeddingCache()).vectors
    qids = list(ds.queries)
    queries = encoder.encode_query([ds.queries[q] for q in qids])
    default = encoder.quantization_ranges()
    sample = np.random.default_rng(0).choice(len(ids), size=min(args.range_sample, len(ids)), replace=False)
    own = quantization_ranges(corpus[sample])
    outside = float(((corpus < default[0]) | (corpus > default[1])).mean())
    d = encoder.dimension
    variants = {
        "float32": (corpus, 4 * d),
        "int8, default ranges": (dequantize(quantize(corpus, "int8", default), "int8", default), d),
        f"int8, ranges fitted on {len(sample)} corpus docs": (
            dequantize(quantize(corpus, "int8", own), "int8", own),
            d,
        ),
        "ubinary (float query vs sign bits)": (unpack_signs(quantize(corpus, "ubinary"), d), d // 8),
    }
    rows = []
    for name, (vectors, size) in variants.items():
        index = build_index(d, kind="numpy", metric="dot")
        index.add(ids, vectors)
        scores, found = index.search(queries, 100)
        run = {q: dict(zip(found[i], map(float, scores[i]), strict=True)) for i, q in enumerate(qids)}
        metrics = evaluate_per_query(ds.qrels, run, [10, 100], queries="qrels").mean()
        rows.append(
            {"vectors": name, "bytes/vector": size, "ndcg@10": metrics["ndcg@10"], "recall@100": metrics["recall@100"]}
        )
    print(f"{ds.name}: {len(ids)} documents, {len(qids)} queries, model {encoder.model_id}")
    print(f"corpus components outside the default int8 ranges (clipped): {outside:.2%}")
    print(pd.DataFrame(rows).round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
