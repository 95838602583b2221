#!/usr/bin/env python
"""BEIR-style retrieval evaluation: nDCG@10, Recall@100, MRR@10 and per-stage timings.

With no dataset argument it writes a tiny demo collection to a temporary directory and evaluates it in
seconds, then prints how to run the real benchmarks.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

EPILOG = """examples:
  python eval/run.py                                   # demo collection, seconds
  python eval/run.py scifact                           # dense MiniLM on SciFact (needs the data)
  python eval/run.py scifact --retriever hybrid
  python eval/run.py scifact --index binary --rescore int8   # compact index: 48 + 384 bytes per vector
  python eval/run.py trec-dl19-passage-bm25top100 --retriever bm25 --reranker sentence-transformers/all-MiniLM-L6-v2
  python eval/run.py scifact nfcorpus-preprocessed-partial --max-queries 50 --json-out runs/quick.json

datasets are resolved in --data-dir, else $EMBEDRANK_DATA, else ../shared/data; a path to a BEIR
directory (corpus.jsonl, queries.jsonl, qrels/test.tsv) works too.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval/run.py", description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("datasets", nargs="*", help="dataset names (in --data-dir) or paths; none = demo collection")
    p.add_argument("--data-dir", help="directory holding BEIR collections (default: $EMBEDRANK_DATA or ../shared/data)")
    p.add_argument(
        "--retriever", choices=["dense", "bm25", "hybrid"], default="dense", help="first stage (default: dense)"
    )
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2", help="embedding model id or path")
    p.add_argument(
        "--reranker",
        metavar="ID",
        help="cross-encoder id/path, or an embedding model (bi-encoder scorer); kind is detected",
    )
    p.add_argument(
        "--k-retrieve", type=int, default=100, help="first-stage depth passed to the reranker (default: 100)"
    )
    p.add_argument("--rerank-max-seq-length", type=int, help="the reranker's window in tokens (default: the model's)")
    p.add_argument(
        "--chunk", action="store_true", help="rerank long documents window by window instead of truncating them"
    )
    p.add_argument("--chunk-overlap", type=int, default=32, help="tokens shared by consecutive windows (default: 32)")
    p.add_argument(
        "--chunk-aggregation", choices=["max", "mean", "first"], default="max", help="document score from its windows"
    )
    p.add_argument(
        "--index",
        choices=["flat", "ivf", "hnsw", "pq", "sq8", "binary"],
        default="flat",
        help="FAISS index (default: flat, exact float32; sq8: 8-bit scalar; binary: sign bits, rescored)",
    )
    p.add_argument(
        "--rescore",
        choices=["int8", "bits", "none"],
        default="int8",
        help="--index binary: rescore the Hamming candidates with int8 codes (default), the bits, or not at all",
    )
    p.add_argument("--rescore-multiplier", type=int, default=4, help="--index binary: candidates per result (4)")
    p.add_argument("--batch-size", type=int, default=64, help="encoding batch size (default: 64)")
    p.add_argument("--max-queries", type=int, help="evaluate only the first N judged queries (quick runs)")
    p.add_argument("--fresh-bm25", action="store_true", help="compute BM25 even when the collection ships a BM25 run")
    p.add_argument("--hybrid-method", choices=["score", "rrf"], default="score", help="fusion for --retriever hybrid")
    p.add_argument("--hybrid-weight", type=float, default=0.5, help="dense weight in score fusion (default: 0.5)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the corpus embedding cache")
    p.add_argument("--cache-dir", help="embedding cache directory (default: $EMBEDRANK_CACHE or ~/.cache/embedrank)")
    p.add_argument("--json-out", metavar="FILE", help="write results as JSON")
    p.add_argument("--run-dir", metavar="DIR", default="runs", help="where TREC run files go (default: runs/)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import pandas as pd

    from embedrank.errors import EmbedrankError
    from embedrank.evaluation.benchmark import BenchmarkConfig, results_table, run_benchmark
    from embedrank.models.chunking import Chunking
    from embedrank.retrieval.data import write_demo_collection, write_trec_run

    cfg = BenchmarkConfig(
        retriever=args.retriever,
        model=args.model,
        reranker=args.reranker,
        rerank_max_seq_length=args.rerank_max_seq_length,
        chunking=Chunking(overlap=args.chunk_overlap, aggregate=args.chunk_aggregation) if args.chunk else None,
        k_retrieve=args.k_retrieve,
        index=args.index,
        rescore=args.rescore,
        rescore_multiplier=args.rescore_multiplier,
        batch_size=args.batch_size,
        max_queries=args.max_queries,
        use_cache=not args.no_cache,
        cache_dir=args.cache_dir,
        fresh_bm25=args.fresh_bm25,
        hybrid_weight=args.hybrid_weight,
        hybrid_method=args.hybrid_method,
        show_progress=None,
    )
    demo = not args.datasets
    tmp = tempfile.TemporaryDirectory() if demo else None
    datasets = [str(write_demo_collection(tmp.name))] if tmp else args.datasets
    results = []
    try:
        for name in datasets:
            result = run_benchmark(name, cfg, data_dir=args.data_dir)
            results.append(result)
            for note in result.notes:
                print(f"[{result.dataset}] {note}")
            run_dir = Path(args.run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            tag = f"{result.dataset}.{args.retriever}{'.rerank' if args.reranker else ''}{'.chunked' if args.chunk else ''}"
            write_trec_run(result.run, run_dir / f"{tag}.trec")
            print(f"[{result.dataset}] TREC run written to {run_dir / (tag + '.trec')}")
    except EmbedrankError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if tmp:
            tmp.cleanup()
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(results_table(results).to_string(index=False))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps({"runs": [r.to_json() for r in results]}, indent=2))
        print(f"JSON written to {args.json_out}")
    if demo:
        print(
            "\nThat was the built-in demo collection. Real benchmarks (BEIR layout, see README):\n"
            "  python eval/run.py scifact --data-dir ../shared/data\n"
            "  python eval/run.py trec-dl19-passage-bm25top100 --retriever bm25 --reranker sentence-transformers/all-MiniLM-L6-v2\n"
            "  python eval/run.py --help"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
