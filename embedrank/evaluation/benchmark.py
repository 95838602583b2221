"""BEIR-style benchmark runs: the logic behind ``eval/run.py`` and the evaluation notebook."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from embedrank.errors import InvalidInputError
from embedrank.evaluation.compare import SystemRun
from embedrank.evaluation.config import HEADLINE, BenchmarkConfig
from embedrank.evaluation.names import first_stage_name, system_name
from embedrank.evaluation.stages import bm25_stage, bm25_windows_stage, dense_stage, image_text_stage, splade_stage
from embedrank.math.metrics import DEFAULT_K, evaluate_per_query
from embedrank.models.scorers import load_reranker
from embedrank.retrieval.data import BeirDataset, load_beir
from embedrank.retrieval.pipeline import (
    DenseRetriever,
    FirstStage,
    HybridRetriever,
    RetrieveRerank,
    WindowedDenseRetriever,
)
from embedrank.retrieval.prf import DensePRFRetriever
from embedrank.retrieval.stages import FusedRetriever, MaxPRetriever
from embedrank.types import Run


@dataclasses.dataclass(frozen=True)
class BenchmarkResult:
    dataset: str
    config: BenchmarkConfig
    first_stage: str
    metrics: dict[str, float]
    per_query: pd.DataFrame
    first_stage_per_query: pd.DataFrame
    timings: dict[str, float]
    run: Run
    notes: list[str]
    index_bytes_per_vector: float | None = None
    first_stage_run: Run | None = None
    fusion_run: Run | None = None  # the first stage's top ``config.fusion_depth``, when asked, deeper and FUSABLE

    @property
    def system(self) -> str:
        """The system's name (:func:`system_name`)."""
        return system_name(self.config)

    @property
    def first_stage_system(self) -> str:
        """The first stage's name (:func:`first_stage_name`)."""
        return first_stage_name(self.config)

    def systems(self, metrics: Sequence[str] | None = None) -> list[SystemRun]:
        """The reranked system and, when there is a reranker, its first stage alone (``metrics``: columns kept)."""
        keep = list(metrics) if metrics else list(self.per_query.columns)
        out = [SystemRun(self.dataset, self.system, self.per_query[keep], self.run)]
        if self.config.reranker:
            first = self.first_stage_per_query[keep]
            out.insert(0, SystemRun(self.dataset, self.first_stage_system, first, self.first_stage_run))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "system": self.system,
            "retriever": self.config.retriever,
            "first_stage": self.first_stage,
            "model": self.config.model if self.config.retriever != "bm25" else None,
            "reranker": self.config.reranker,
            "rerank_max_seq_length": self.config.rerank_max_seq_length,
            "sparse_model": self.config.sparse_model if "splade" in self.config.retriever else None,
            "sparse_max_seq_length": self.config.sparse_max_seq_length,
            "sparse_windows": self.config.sparse_windows,
            "bm25_windows": self.config.bm25_windows,
            "chunking": dataclasses.asdict(self.config.chunking) if self.config.chunking else None,
            "k_retrieve": self.config.k_retrieve,
            "index": self.config.index if self.config.retriever != "bm25" else None,
            "rescore": f"{self.config.rescore} x{self.config.rescore_multiplier}"
            if self.config.index == "binary"
            else None,
            "queries": len(self.per_query),
            "metrics": {k: round(v, 6) for k, v in self.metrics.items()},
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "index_bytes_per_vector": self.index_bytes_per_vector,
            "notes": self.notes,
        }


@functools.lru_cache(maxsize=4)
def cached_reranker(
    model_id: str,
    max_seq_length: int | None = None,
    backend: str | None = None,
    precision: str | None = None,
    device: str = "cpu",
):
    return load_reranker(model_id, max_seq_length=max_seq_length, backend=backend, precision=precision, device=device)


FUSABLE = ("bm25", "dense", "splade")  # the first stages that hybrid:a+b(+c) and the -cv fusions fuse


def subset(ds: BeirDataset, max_queries: int | None, query_ids: Sequence[str] | None = None) -> BeirDataset:
    """The judged queries ``query_ids`` names (all when None; one it names that is not judged is refused), the
    first ``max_queries`` of them (file order), with their qrels."""
    if max_queries is None and query_ids is None:
        return ds
    keep = list(ds.queries)
    if query_ids is not None:
        listed = set(query_ids)
        unknown = sorted(listed - set(keep))
        if unknown:
            raise InvalidInputError(f"{len(unknown)} query ids are not judged queries of {ds.name}: {unknown[:5]}")
        keep = [q for q in keep if q in listed]
    keep = keep[:max_queries]
    return dataclasses.replace(ds, queries={q: ds.queries[q] for q in keep}, qrels={q: dict(ds.qrels[q]) for q in keep})


def relevance_level(dataset: str) -> int:
    """The lowest grade that counts as relevant for recall, MRR, MAP and P: 2 for TREC DL (graded
    judgments where 1 means "related"), else 1.

    >>> relevance_level("trec-dl19-passage-bm25top100"), relevance_level("scifact")
    (2, 1)
    """
    return 2 if dataset.startswith("trec-dl") else 1


def run_benchmark(
    dataset: str | Path | BeirDataset, config: BenchmarkConfig | None = None, *, data_dir: str | None = None
) -> BenchmarkResult:
    """Run one (dataset, retriever, reranker) configuration and score it with pytrec_eval."""
    cfg = config or BenchmarkConfig()
    notes: list[str] = []
    timings: dict[str, float] = {}
    sizes: list[float] = []  # bytes per vector of the dense index, when it can tell
    start = time.perf_counter()
    ds = dataset if isinstance(dataset, BeirDataset) else load_beir(dataset, split=cfg.split, data_dir=data_dir)
    if cfg.split != "test":  # another split's queries: never mistaken for the test figures, nor their BM25 run
        ds = dataclasses.replace(ds, name=f"{ds.name}:{cfg.split}")
        cfg = dataclasses.replace(cfg, fresh_bm25=True)
    ds = subset(ds, cfg.max_queries, cfg.query_ids)
    timings["load_s"] = time.perf_counter() - start
    level = relevance_level(ds.name)

    if cfg.dense_window is not None and not (cfg.dense_windows or cfg.bm25_windows):
        raise InvalidInputError("dense_window sets the windows of windowed stages: set dense_windows or bm25_windows")
    if cfg.bm25_windows and cfg.retriever not in ("bm25", "hybrid"):
        raise InvalidInputError(f"bm25_windows applies to the bm25 and hybrid retrievers, not {cfg.retriever}")
    if cfg.bm25_windows and cfg.retriever == "hybrid" and not cfg.dense_windows:
        raise InvalidInputError("a hybrid over BM25's windows fuses each window's scores: set dense_windows too")
    if cfg.dense_windows and (cfg.embeddings or cfg.retriever in ("dense-prf", "hybrid-prf")):
        what = "--embeddings (vectors of whole documents)" if cfg.embeddings else cfg.retriever
        raise InvalidInputError(f"windowed dense stages (MaxP) do not combine with {what}")

    def dense() -> DenseRetriever | WindowedDenseRetriever:
        return dense_stage(ds, cfg, notes, sizes, timings)

    def plain_dense() -> DenseRetriever:
        """The dense stage of the *-prf retrievers, which need whole-document vectors (refused above)."""
        retriever = dense()
        assert isinstance(retriever, DenseRetriever)
        return retriever

    first: FirstStage
    pictured = bool(ds.images or ds.query_images)
    if pictured and (cfg.retriever != "dense" or cfg.reranker or cfg.embeddings or cfg.dense_windows):
        raise InvalidInputError(
            f"{ds.name} has images: it is searched by an image-text model's dense stage alone (retriever dense, no "
            f"reranker, embeddings or windows), not {cfg.retriever}{' with a reranker' if cfg.reranker else ''}"
        )
    if pictured:
        first = image_text_stage(ds, cfg, notes, timings)
    elif cfg.retriever == "dense":
        first = dense()
    elif cfg.retriever == "bm25":
        first = bm25_stage(ds, cfg, notes)
    elif cfg.retriever in ("hybrid", "hybrid-prf"):
        dense_part: FirstStage = (
            DensePRFRetriever(plain_dense(), k=cfg.prf_k, beta=cfg.prf_beta)
            if cfg.retriever == "hybrid-prf"
            else dense()
        )
        fusion = functools.partial(
            HybridRetriever, method=cfg.hybrid_method, weight=cfg.hybrid_weight, normalization=cfg.hybrid_normalization
        )
        if cfg.bm25_windows:  # both stages over the same windows, fused per window, a document taking its best
            assert isinstance(dense_part, WindowedDenseRetriever)
            lexical, owners = bm25_windows_stage(ds, cfg, notes)
            if owners != dense_part.owners:
                raise AssertionError("the BM25 and dense stages split the corpus into different windows")
            first = MaxPRetriever(fusion(dense_part.windows, lexical), owners)
        else:
            first = fusion(dense_part, bm25_stage(ds, cfg, notes))
    elif cfg.retriever == "dense-prf":
        first = DensePRFRetriever(plain_dense(), k=cfg.prf_k, beta=cfg.prf_beta)
    elif cfg.retriever == "splade":
        first = splade_stage(ds, cfg, notes)
    elif cfg.retriever.startswith("hybrid:"):  # weighted (default: equal) normalized score fusion of the stages
        parts = {
            "bm25": lambda: bm25_stage(ds, cfg, notes),
            "dense": dense,
            "splade": lambda: splade_stage(ds, cfg, notes),
        }
        names, weights = cfg.retriever.split(":", 1)[1].split("+"), cfg.fusion_weights
        if weights is not None and len(weights) != len(names):
            raise InvalidInputError(f"{cfg.retriever} fuses {len(names)} stages; {len(weights)} fusion weights given")
        stages = [parts[name]() for name in names]
        first = FusedRetriever(stages, list(weights) if weights else None, normalization=cfg.fusion_normalization)
        notes.append(f"{cfg.retriever}: {cfg.fusion_normalization} normalized scores, weights {first.weights}")
    else:
        raise ValueError(f"unknown retriever {cfg.retriever!r}")
    reranker = (
        cached_reranker(cfg.reranker, cfg.rerank_max_seq_length, cfg.backend, cfg.precision, cfg.device)
        if cfg.reranker
        else None
    )
    if reranker is not None:
        reranker = reranker.with_chunking(cfg.chunking)
        window = f", max_seq_length {cfg.rerank_max_seq_length}" if cfg.rerank_max_seq_length else ""
        how = (
            f"chunked ({cfg.chunking.aggregate} over windows, overlap {cfg.chunking.overlap})"
            if cfg.chunking
            else "truncated"
        )
        notes.append(f"reranker: {cfg.reranker} as a {reranker.kind} scorer{window}; long documents {how}")
    pipeline = RetrieveRerank(first, ds.corpus, reranker=reranker, k_retrieve=cfg.k_retrieve)
    if pipeline.vectors_from_index:
        notes.append("reranker: candidates' vectors read from the dense index (same model), not re-encoded")
    result = pipeline.run(ds.queries, show_progress=cfg.show_progress)
    timings.update({k: v for k, v in result.timings.items() if k != "total_s"})
    k_values = sorted(set(DEFAULT_K) | {cfg.k_retrieve})
    # every judged query counts, a query the run lost scores 0 (trec_eval -c)
    per_query = evaluate_per_query(ds.qrels, result.run, k_values, relevance_level=level, queries="qrels")
    first_pq = evaluate_per_query(ds.qrels, result.first_stage_run, k_values, relevance_level=level, queries="qrels")
    timings["total_s"] = time.perf_counter() - start  # load, index, retrieval and reranking
    # only the stages that later fusions fuse (bm25, dense, splade) need their deeper run
    deep = cfg.fusion_depth is not None and cfg.fusion_depth > cfg.k_retrieve and cfg.retriever in FUSABLE
    fusion_run = first.retrieve(ds.queries, cfg.fusion_depth) if deep else None  # type: ignore[arg-type]
    if level > 1:
        notes.append(f"graded qrels: recall/MRR/MAP/P count relevance >= {level} (TREC DL); nDCG uses grades")
    return BenchmarkResult(
        dataset=ds.name,
        config=cfg,
        first_stage=first.name,
        metrics=per_query.mean().to_dict(),
        per_query=per_query,
        first_stage_per_query=first_pq,
        timings=timings,
        run=result.run,
        notes=notes,
        index_bytes_per_vector=sizes[0] if sizes else None,
        first_stage_run=result.first_stage_run,
        fusion_run=fusion_run,
    )


def results_table(results: list[BenchmarkResult], columns: tuple[str, ...] = HEADLINE) -> pd.DataFrame:
    """One row per run with the headline metrics and timings; for printing and notebooks."""
    rows = []
    for r in results:
        row = {
            "dataset": r.dataset,
            "retriever": r.first_stage,
            "reranker": r.config.reranker or "-",
            "queries": len(r.per_query),
        }
        row.update({c: round(r.metrics.get(c, float("nan")), 4) for c in columns})
        if r.index_bytes_per_vector is not None:
            row["bytes/vector"] = round(r.index_bytes_per_vector)
        row.update({k: round(v, 2) for k, v in r.timings.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def unique_systems(results: Sequence[BenchmarkResult], metrics: Sequence[str] | None = None) -> list[SystemRun]:
    """Every system of ``results`` once per collection, in order: a first stage that several reranked runs
    share (or that also ran alone) is kept the first time it appears."""
    seen: set[tuple[str, str]] = set()
    out = []
    for result in results:
        for system in result.systems(metrics):
            if (system.dataset, system.system) not in seen:
                seen.add((system.dataset, system.system))
                out.append(system)
    return out
