"""Retrieve-then-rerank: a first stage (dense, BM25, hybrid or a precomputed run) and an optional reranker."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from embedrank.bm25 import BM25Retriever
from embedrank.cache import EmbeddingCache, corpus_key
from embedrank.data import doc_text
from embedrank.encoder import Encoder
from embedrank.errors import InvalidInputError
from embedrank.fusion import ranked_ids, reciprocal_rank_fusion, score_fusion, top_k
from embedrank.index import FaissIndex, IndexConfig, NumpyIndex, build_index
from embedrank.scorers import Reranker
from embedrank.types import Corpus, Queries, Run


@runtime_checkable
class FirstStage(Protocol):
    """Anything that returns a BEIR run for a batch of queries."""

    name: str

    def retrieve(self, queries: Queries, k: int) -> Run: ...


def encoder_cache_key(encoder: Encoder) -> str:
    """What makes two encoders' corpus embeddings interchangeable."""
    return (
        f"{encoder.model_id}|{encoder.spec.path}|{encoder.pooling.value}|{encoder.normalize}|{encoder.max_seq_length}"
    )


def embed_corpus(
    encoder: Encoder,
    ids: Sequence[str],
    texts: Sequence[str],
    *,
    batch_size: int = 64,
    cache: EmbeddingCache | None = None,
    show_progress: bool | None = None,
) -> tuple[np.ndarray, str | None]:
    """Corpus embeddings ``(N, D)``, read from ``cache`` when present; returns the cache path used (or None)."""
    if cache is None:
        return encoder.encode(texts, batch_size=batch_size, show_progress=show_progress), None
    key = corpus_key(encoder_cache_key(encoder), ids, texts)
    hit = cache.load(key, len(ids))
    if hit is not None:
        return hit, str(cache.path(key))
    vectors = encoder.encode(texts, batch_size=batch_size, show_progress=show_progress)
    path = cache.store(key, vectors, {"model_id": encoder.model_id, "documents": len(ids)})
    return vectors, str(path)


class DenseRetriever:
    """Encodes queries with ``encoder`` and searches ``index``."""

    name = "dense"

    def __init__(self, encoder: Encoder, index: NumpyIndex | FaissIndex, *, batch_size: int = 64) -> None:
        index.check_compatible(model_id=encoder.model_id, dimension=encoder.dimension)
        self.encoder, self.index, self.batch_size = encoder, index, batch_size
        self.cache_path: str | None = None

    @classmethod
    def from_corpus(
        cls,
        encoder: Encoder,
        corpus: Corpus,
        *,
        index: IndexConfig | None = None,
        batch_size: int = 64,
        cache: EmbeddingCache | None = None,
        show_progress: bool | None = None,
    ) -> DenseRetriever:
        ids = list(corpus)
        vectors, cache_path = embed_corpus(
            encoder,
            ids,
            [doc_text(corpus[d]) for d in ids],
            batch_size=batch_size,
            cache=cache,
            show_progress=show_progress,
        )
        idx = build_index(encoder.dimension, index, model_id=encoder.model_id)
        idx.add(ids, vectors)
        retriever = cls(encoder, idx, batch_size=batch_size)
        retriever.cache_path = cache_path
        return retriever

    def retrieve(self, queries: Queries, k: int) -> Run:
        qids = list(queries)
        vectors = self.encoder.encode([queries[q] for q in qids], batch_size=self.batch_size)
        scores, ids = self.index.search(vectors, k)
        return {qid: dict(zip(ids[i], map(float, scores[i]), strict=True)) for i, qid in enumerate(qids)}


class BM25FirstStage:
    """BM25 over a BEIR corpus (document text = title + text)."""

    name = "bm25"

    def __init__(self, corpus: Corpus, **params: float) -> None:
        ids = list(corpus)
        self.bm25 = BM25Retriever(ids, [doc_text(corpus[d]) for d in ids], **params)

    def retrieve(self, queries: Queries, k: int) -> Run:
        return self.bm25.retrieve(queries, k)


class PrecomputedRun:
    """A first stage that replays a given run (e.g. a collection's published ``bm25_top100.run``)."""

    def __init__(self, run: Run, name: str = "precomputed") -> None:
        self._run, self.name = run, name

    def retrieve(self, queries: Queries, k: int) -> Run:
        return top_k({q: dict(self._run.get(q, {})) for q in queries}, k)


class HybridRetriever:
    """Fuses two first stages with normalized score fusion or reciprocal rank fusion."""

    def __init__(
        self,
        first: FirstStage,
        second: FirstStage,
        *,
        method: Literal["score", "rrf"] = "score",
        weight: float = 0.5,
        normalization: Literal["minmax", "zscore"] = "minmax",
        rrf_k: int = 60,
        depth: int = 1000,
    ) -> None:
        self.first, self.second = first, second
        self.method, self.weight, self.normalization, self.rrf_k, self.depth = (
            method,
            weight,
            normalization,
            rrf_k,
            depth,
        )
        self.name = f"hybrid({first.name}+{second.name},{method})"

    def retrieve(self, queries: Queries, k: int) -> Run:
        depth = max(k, self.depth)
        a, b = self.first.retrieve(queries, depth), self.second.retrieve(queries, depth)
        if self.method == "rrf":
            fused = reciprocal_rank_fusion([a, b], k=self.rrf_k)
        else:
            fused = score_fusion(a, b, weight=self.weight, normalization=self.normalization)
        return top_k(fused, k)


@dataclasses.dataclass(frozen=True)
class PipelineResult:
    """Final run, the first-stage run it came from, and seconds per stage."""

    run: Run
    first_stage_run: Run
    timings: dict[str, float]

    def to_frame(
        self, queries: Queries | None = None, corpus: Corpus | None = None, k: int | None = None
    ) -> pd.DataFrame:
        """One row per (query, document): rank, score, first-stage rank, and texts when given."""
        rows = []
        for qid, docs in self.run.items():
            first_rank = {d: r for r, d in enumerate(ranked_ids(self.first_stage_run.get(qid, {})), start=1)}
            for rank, doc_id in enumerate(ranked_ids(docs)[:k], start=1):
                row = {
                    "query_id": qid,
                    "rank": rank,
                    "doc_id": doc_id,
                    "score": docs[doc_id],
                    "first_stage_rank": first_rank.get(doc_id),
                }
                if queries is not None:
                    row["query"] = queries.get(qid)
                if corpus is not None:
                    row["text"] = doc_text(corpus[doc_id]) if doc_id in corpus else None
                rows.append(row)
        return pd.DataFrame(rows)


class RetrieveRerank:
    """First stage for ``k_retrieve`` candidates, then an optional reranker; keeps ``top_k`` per query."""

    def __init__(
        self,
        first_stage: FirstStage,
        corpus: Corpus,
        *,
        reranker: Reranker | None = None,
        k_retrieve: int = 100,
        top_k: int | None = None,
    ) -> None:
        if k_retrieve < 1:
            raise InvalidInputError(f"k_retrieve must be >= 1, got {k_retrieve}")
        if top_k is not None and top_k < 1:
            raise InvalidInputError(f"top_k must be >= 1, got {top_k}")
        self.first_stage, self.corpus, self.reranker = first_stage, corpus, reranker
        self.k_retrieve, self.top_k = k_retrieve, top_k

    def run(self, queries: Queries, *, show_progress: bool = False) -> PipelineResult:
        from tqdm.auto import tqdm

        timings: dict[str, float] = {}
        start = time.perf_counter()
        first = self.first_stage.retrieve(queries, self.k_retrieve)
        timings["first_stage_s"] = time.perf_counter() - start
        final: Run = first
        if self.reranker is not None:
            start = time.perf_counter()
            final = {}
            for qid in tqdm(list(first), desc="Reranking", unit="query", disable=not show_progress):
                doc_ids = ranked_ids(first[qid])
                if not doc_ids:
                    final[qid] = {}
                    continue
                scores = self.reranker.score(queries[qid], [doc_text(self.corpus[d]) for d in doc_ids])
                final[qid] = {d: float(s) for d, s in zip(doc_ids, scores, strict=True)}
            timings["rerank_s"] = time.perf_counter() - start
        if self.top_k is not None:
            final = top_k(final, self.top_k)
        timings["total_s"] = sum(timings.values())
        return PipelineResult(run=final, first_stage_run=first, timings=timings)
