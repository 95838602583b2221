"""Retrieve-then-rerank: a first stage (dense, BM25, hybrid or a precomputed run) and an optional reranker."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from embedrank.errors import IndexMismatchError, InvalidInputError
from embedrank.math.fusion import reciprocal_rank_fusion, score_fusion
from embedrank.math.ranking import ranked_ids, top_k
from embedrank.models.encoder import Encoder
from embedrank.models.scorers import BiEncoderScorer, Reranker
from embedrank.models.signature import EmbeddingSignature
from embedrank.models.tokens import PROGRESS_THRESHOLD
from embedrank.retrieval.cache import EmbeddingCache, corpus_key
from embedrank.retrieval.data import doc_text
from embedrank.retrieval.embed_job import read_embeddings, read_manifest
from embedrank.retrieval.index import AnyIndex, IndexConfig, build_index, load_index
from embedrank.types import Corpus, Queries, Run


@runtime_checkable
class FirstStage(Protocol):
    """Anything that returns a BEIR run for a batch of queries."""

    name: str

    def retrieve(self, queries: Queries, k: int) -> Run: ...


def encoder_cache_key(encoder: Encoder) -> str:
    """What makes two encoders' document vectors interchangeable on this machine
    (:meth:`EmbeddingSignature.cache_key <embedrank.models.signature.EmbeddingSignature.cache_key>`)."""
    return EmbeddingSignature.of(encoder).cache_key()


@dataclasses.dataclass(frozen=True)
class CorpusEmbeddings:
    """Corpus vectors ``(N, D)`` and where they came from: ``cache`` is ``"hit"`` (read from ``path``),
    ``"miss"`` (computed, then stored at ``path``), ``"off"``, ``"prebuilt"`` (a corpus embedding job's
    output at ``path``) or ``"index"`` (a saved index loaded from ``path``)."""

    vectors: np.ndarray | None  # None for a prebuilt index (its vectors stay inside it)
    cache: Literal["hit", "miss", "off", "prebuilt", "index"]
    path: str | None = None

    def describe(self) -> str:
        """One line for logs, e.g. ``embedding cache: hit (/root/.cache/embedrank/embeddings/ab12.npy)``."""
        return f"embedding cache: {self.cache}" + (f" ({self.path})" if self.path else "")


def embed_corpus(
    encoder: Encoder,
    ids: Sequence[str],
    texts: Sequence[str],
    *,
    batch_size: int = 64,
    cache: EmbeddingCache | None = None,
    show_progress: bool | None = None,
) -> CorpusEmbeddings:
    """Corpus embeddings ``(N, D)``, read from ``cache`` when it holds them, else computed (and stored)."""
    if cache is None:
        return CorpusEmbeddings(
            encoder.encode_document(texts, batch_size=batch_size, show_progress=show_progress), "off"
        )
    key = corpus_key(encoder_cache_key(encoder), ids, texts)
    hit = cache.load(key, len(ids))
    if hit is not None:
        return CorpusEmbeddings(hit, "hit", str(cache.path(key)))
    vectors = encoder.encode_document(texts, batch_size=batch_size, show_progress=show_progress)
    path = cache.store(key, vectors, {"model_id": encoder.model_id, "documents": len(ids)})
    return CorpusEmbeddings(vectors, "miss", str(path))


class DenseRetriever:
    """Encodes queries with ``encoder`` and searches ``index``."""

    name = "dense"

    def __init__(self, encoder: Encoder, index: AnyIndex, *, batch_size: int = 64) -> None:
        index.check_compatible(model_id=encoder.model_id, dimension=encoder.dimension)
        self.encoder, self.index, self.batch_size = encoder, index, batch_size
        self.corpus_embeddings: CorpusEmbeddings | None = None

    @classmethod
    def from_corpus(
        cls,
        encoder: Encoder,
        corpus: Corpus,
        *,
        index: IndexConfig | None = None,
        batch_size: int = 64,
        cache: EmbeddingCache | bool = True,
        show_progress: bool | None = None,
    ) -> DenseRetriever:
        """Embed ``corpus`` (title + text) and index it.

        The vectors go through the on-disk embedding cache (``$EMBEDRANK_CACHE``, else
        ``~/.cache/embedrank``) unless ``cache=False``: building the same corpus with the same model again
        reads them back instead of encoding. ``corpus_embeddings.cache`` says which happened.
        """
        ids = list(corpus)
        store = EmbeddingCache() if cache is True else (cache or None)
        embedded = embed_corpus(
            encoder,
            ids,
            [doc_text(corpus[d]) for d in ids],
            batch_size=batch_size,
            cache=store,
            show_progress=show_progress,
        )
        assert embedded.vectors is not None
        idx = build_index(encoder.dimension, index, model_id=encoder.model_id)
        idx.signature = EmbeddingSignature.of(encoder).to_dict()
        idx.add(ids, embedded.vectors)
        retriever = cls(encoder, idx, batch_size=batch_size)
        retriever.corpus_embeddings = embedded
        return retriever

    @classmethod
    def from_embeddings(
        cls,
        encoder: Encoder,
        directory: str | Path,
        *,
        corpus: Corpus | None = None,
        index: IndexConfig | None = None,
        batch_size: int = 64,
    ) -> DenseRetriever:
        """Index the vectors of a corpus embedding job (:mod:`embedrank.retrieval.embed_job`) instead of
        encoding the corpus; refused when they were made with another model or settings, or (given
        ``corpus``) do not cover exactly its documents."""
        signature = EmbeddingSignature.of(encoder)
        signature.check(read_manifest(directory).get("signature"), f"embeddings in {directory}")
        ids, vectors = read_embeddings(directory)
        _check_covers(ids, corpus, f"embeddings in {directory}")
        idx = build_index(encoder.dimension, index, model_id=encoder.model_id)
        idx.signature = signature.to_dict()
        idx.add(ids, vectors)
        retriever = cls(encoder, idx, batch_size=batch_size)
        retriever.corpus_embeddings = CorpusEmbeddings(vectors, "prebuilt", str(directory))
        return retriever

    @classmethod
    def from_index(
        cls, encoder: Encoder, directory: str | Path, *, corpus: Corpus | None = None, batch_size: int = 64
    ) -> DenseRetriever:
        """Search a saved index (``index.save(dir)``, or a sharded build merged in memory or on disk) with
        ``encoder``'s queries; refused when it was built for another model, dimension or embedding settings
        (:class:`~embedrank.models.signature.EmbeddingSignature`, when the index records them), or (given
        ``corpus``) does not hold exactly its documents."""
        idx = load_index(directory, model_id=encoder.model_id, dimension=encoder.dimension)
        if idx.signature is not None:  # an index built by hand records only its model and dimension
            EmbeddingSignature.of(encoder).check(idx.signature, f"vectors in the index in {directory}")
        _check_covers(idx.ids, corpus, f"index in {directory}")
        retriever = cls(encoder, idx, batch_size=batch_size)
        retriever.corpus_embeddings = CorpusEmbeddings(None, "index", str(directory))
        return retriever

    def retrieve(self, queries: Queries, k: int) -> Run:
        qids = list(queries)
        vectors = self.encoder.encode_query([queries[q] for q in qids], batch_size=self.batch_size)
        scores, ids = self.index.search(vectors, k)
        return {qid: dict(zip(ids[i], map(float, scores[i]), strict=True)) for i, qid in enumerate(qids)}


def _check_covers(ids: Sequence[str], corpus: Corpus | None, what: str) -> None:
    if corpus is not None and set(ids) != set(corpus):
        missing, extra = len(set(corpus) - set(ids)), len(set(ids) - set(corpus))
        raise IndexMismatchError(f"{what} does not match the corpus: {missing} documents missing, {extra} unknown")


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


def _stages(stage: FirstStage) -> Iterator[FirstStage]:
    """``stage`` and, for a hybrid, the stages it fuses."""
    yield stage
    if isinstance(stage, HybridRetriever):
        yield from _stages(stage.first)
        yield from _stages(stage.second)


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
            isinstance(self.reranker, BiEncoderScorer)
            and isinstance(first_stage, DenseRetriever)
            and encoder_cache_key(first_stage.encoder) == encoder_cache_key(self.reranker.encoder)
        ):
            warnings.warn(
                f"the bi-encoder reranker {reranker.model_id!r} is the dense first stage's own model: it scores "  # type: ignore[union-attr]
                f"with the same cosine that ranked the candidates, so the order cannot change. Rerank a BM25 or "
                f"hybrid first stage, or use a cross-encoder.",
                UserWarning,
                stacklevel=2,
            )

    def _find_vector_source(self) -> DenseRetriever | None:
        if not isinstance(self.reranker, BiEncoderScorer) or self.reranker.chunking is not None:
            return None  # a chunking scorer encodes windows, not the stored whole-document vectors
        key = encoder_cache_key(self.reranker.encoder)
        for stage in _stages(self.first_stage):
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
        assert self.reranker is not None
        if query_vector is not None and self._vector_source is not None:
            index = self._vector_source.index
            if all(d in index for d in doc_ids):  # a hybrid's BM25 side may bring documents the index lacks
                stored = index.reconstruct(doc_ids)
                if stored is not None:
                    return self.reranker.score_vectors(query_vector, stored)  # type: ignore[attr-defined]
        return self.reranker.score(query, [doc_text(self.corpus[d]) for d in doc_ids])

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
            if self._vector_source is not None:
                query_vectors = list(self._vector_source.encoder.encode_query([queries[q] for q in qids]))
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
