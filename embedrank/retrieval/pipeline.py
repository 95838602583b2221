"""Retrieve-then-rerank: a first stage (dense, BM25, hybrid or a precomputed run) and an optional reranker.

The first stages live in :mod:`embedrank.retrieval.dense` and :mod:`embedrank.retrieval.stages`; their
names are importable from here too.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from embedrank.errors import InvalidInputError
from embedrank.math.ranking import ranked_ids, top_k
from embedrank.models.batching import PROGRESS_THRESHOLD
from embedrank.models.scorers import BiEncoderScorer, Reranker
from embedrank.retrieval.data import doc_text
from embedrank.retrieval.dense import (
    CorpusEmbeddings,
    DenseRetriever,
    WindowedDenseRetriever,
    corpus_windows,
    embed_corpus,
    encoder_cache_key,
)
from embedrank.retrieval.stages import FirstStage, HybridRetriever, MaxPRetriever, PrecomputedRun, stages_of
from embedrank.types import Corpus, Queries, Run

__all__ = [
    "CorpusEmbeddings",
    "DenseRetriever",
    "FirstStage",
    "HybridRetriever",
    "MaxPRetriever",
    "PipelineResult",
    "PrecomputedRun",
    "RetrieveRerank",
    "WindowedDenseRetriever",
    "corpus_windows",
    "embed_corpus",
    "encoder_cache_key",
]


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
    """First stage for ``k_retrieve`` candidates, then an optional reranker; keeps ``top_k`` per query.

    A bi-encoder reranker whose encoder matches a dense first stage's (same model and settings) takes the
    candidates' vectors from that stage's index instead of encoding the documents again
    (``vectors_from_index`` says whether it does). When the first stage is *only* that dense retriever, the
    reranker scores with the very cosine that ranked the candidates, so it cannot change the order; that
    case warns.
    """

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
            raise InvalidInputError(f"k_retrieve must be >= 1, got {k_retrieve}", param="k_retrieve")
        if top_k is not None and top_k < 1:
            raise InvalidInputError(f"top_k must be >= 1, got {top_k}", param="top_k")
        self.first_stage, self.corpus, self.reranker = first_stage, corpus, reranker
        self.k_retrieve, self.top_k = k_retrieve, top_k
        self._vector_source = self._find_vector_source()
        if (
            isinstance(reranker, BiEncoderScorer)
            and isinstance(first_stage, DenseRetriever)
            and encoder_cache_key(first_stage.encoder) == encoder_cache_key(reranker.encoder)
        ):
            warnings.warn(
                f"the bi-encoder reranker {reranker.model_id!r} is the dense first stage's own model: it scores "
                f"with the same cosine that ranked the candidates, so the order cannot change. Rerank a BM25 or "
                f"hybrid first stage, or use a cross-encoder.",
                UserWarning,
                stacklevel=2,
            )

    def _find_vector_source(self) -> DenseRetriever | None:
        if not isinstance(self.reranker, BiEncoderScorer) or self.reranker.chunking is not None:
            return None  # a chunking scorer encodes windows, not the stored whole-document vectors
        key = encoder_cache_key(self.reranker.encoder)
        for stage in stages_of(self.first_stage):
            if (
                isinstance(stage, DenseRetriever)
                and encoder_cache_key(stage.encoder) == key
                and stage.index.can_reconstruct
            ):
                return stage
        return None

    @property
    def vectors_from_index(self) -> bool:
        """Whether the reranker reads the candidates' vectors from a dense first stage's index."""
        return self._vector_source is not None

    def _rerank_one(self, query: str, query_vector: np.ndarray | None, doc_ids: list[str]) -> np.ndarray:
        reranker = self.reranker
        assert reranker is not None
        if query_vector is not None and self._vector_source is not None and isinstance(reranker, BiEncoderScorer):
            index = self._vector_source.index
            if all(d in index for d in doc_ids):  # a hybrid's BM25 side may bring documents the index lacks
                stored = index.reconstruct(doc_ids)
                if stored is not None:
                    return reranker.score_vectors(query_vector, stored)
        return reranker.score(query, [doc_text(self.corpus[d]) for d in doc_ids])

    def run(self, queries: Queries, *, show_progress: bool | None = None) -> PipelineResult:
        """Retrieve and rerank; a progress bar shows while reranking more than
        :data:`~embedrank.models.tokens.PROGRESS_THRESHOLD` candidates unless ``show_progress=False``."""
        timings: dict[str, float] = {}
        started = time.perf_counter()
        first = self.first_stage.retrieve(queries, self.k_retrieve)
        timings["first_stage_s"] = time.perf_counter() - started
        final: Run = first
        if self.reranker is not None:
            start = time.perf_counter()
            qids = list(first)
            query_vectors: Sequence[np.ndarray | None] = [None] * len(qids)
            if self._vector_source is not None:  # the first stage's own query vectors: each query encoded once
                by_qid = dict(zip(queries, self._vector_source.query_vectors(queries), strict=True))
                query_vectors = [by_qid[q] for q in qids]
            candidates = sum(len(first[q]) for q in qids)
            show = candidates > PROGRESS_THRESHOLD if show_progress is None else show_progress
            final = {}
            for qid, vector in tqdm(
                zip(qids, query_vectors, strict=True), total=len(qids), desc="Reranking", unit="query", disable=not show
            ):
                doc_ids = ranked_ids(first[qid])
                scores = self._rerank_one(queries[qid], vector, doc_ids) if doc_ids else np.zeros(0)
                final[qid] = {d: float(s) for d, s in zip(doc_ids, scores, strict=True)}
            timings["rerank_s"] = time.perf_counter() - start
        if self.top_k is not None:
            final = top_k(final, self.top_k)
        timings["total_s"] = time.perf_counter() - started
        return PipelineResult(run=final, first_stage_run=first, timings=timings)
