"""Dense first stage: corpus embedding through the cache, and a retriever over an index of the vectors,
built from a corpus, from an embedding job's vectors, or from a saved index; each checks that the vectors
were made as the encoder makes them (:class:`~embedrank.models.signature.EmbeddingSignature`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from embedrank.errors import IndexMismatchError
from embedrank.math.ranking import top_k
from embedrank.models.chunking import Chunking, ChunkPlan, require_fits, require_max
from embedrank.models.encoder import Encoder
from embedrank.models.signature import EmbeddingSignature
from embedrank.retrieval.cache import EmbeddingCache, corpus_key
from embedrank.retrieval.data import doc_text
from embedrank.retrieval.embed_job import read_embeddings, read_manifest
from embedrank.retrieval.index import AnyIndex, IndexConfig, build_index, load_index
from embedrank.retrieval.stages import best_windows
from embedrank.types import Corpus, Queries, Run


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
        self._last_queries: tuple[list[str], np.ndarray] | None = None  # texts, vectors of the last retrieve

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

    def query_vectors(self, queries: Queries) -> np.ndarray:
        """The query vectors ``(Q, D)`` in ``queries`` order; those of the last :meth:`retrieve` are reused
        when it was given the same queries (so retrieve-then-rerank encodes each query once)."""
        texts = [queries[q] for q in queries]
        last = self._last_queries
        if last is not None and last[0] == texts:
            return last[1]
        vectors = self.encoder.encode_query(texts, batch_size=self.batch_size)
        self._last_queries = (texts, vectors)
        return vectors

    def retrieve(self, queries: Queries, k: int) -> Run:
        qids = list(queries)
        scores, ids = self.index.search(self.query_vectors(queries), k)
        return {qid: dict(zip(ids[i], map(float, scores[i]), strict=True)) for i, qid in enumerate(qids)}


def corpus_windows(encoder: Encoder, corpus: Corpus, chunking: Chunking | None = None) -> tuple[Corpus, list[str]]:
    """``corpus``'s documents (title + text) split into windows of ``encoder``'s tokens (``chunking.window``
    tokens, at most the model's length, or the model's length; ``chunking.overlap`` shared): the windows as a
    corpus (ids ``"0"``, ``"1"``, ..., text only) and each window's document id, in window order."""
    chunking = chunking or Chunking()
    fits = encoder.chunk_window()
    require_fits(chunking.window, fits)
    ids = list(corpus)
    plan = ChunkPlan.make([doc_text(corpus[d]) for d in ids], encoder.token_offsets, window=fits, chunking=chunking)
    windows: Corpus = {str(i): {"text": text} for i, text in enumerate(plan.texts)}
    return windows, [ids[i] for i in plan.windows.owners.tolist()]


class WindowedDenseRetriever:
    """Dense retrieval over long documents' windows, a document scoring as its best window (MaxP).

    Each document longer than one forward pass is split into windows of the model's length (overlapping
    by ``chunking.overlap``, 32 tokens by default, :mod:`embedrank.models.chunking`); every window is
    embedded (through the embedding cache) and indexed, so no text past the model's length is left out. A
    query's score for a document is the highest of its windows' (``chunking.aggregate`` must be ``max``:
    a mean or the first window would need every window scored). :meth:`retrieve` searches as many of the
    top windows as it takes to find ``k`` documents, which then hold the best window of each of the top
    ``k`` documents: on an exact index the result is exact.
    """

    name = "dense"

    def __init__(self, windows: DenseRetriever, owners: Sequence[str]) -> None:
        """``windows``: a retriever over the window vectors; ``owners``: the document id of each window id,
        in window order (window ``i`` has id ``str(i)``)."""
        self.windows, self.owners = windows, list(owners)
        self.encoder, self.corpus_embeddings = windows.encoder, windows.corpus_embeddings

    @classmethod
    def from_corpus(
        cls,
        encoder: Encoder,
        corpus: Corpus,
        *,
        chunking: Chunking | None = None,
        index: IndexConfig | None = None,
        batch_size: int = 64,
        cache: EmbeddingCache | bool = True,
        show_progress: bool | None = None,
    ) -> WindowedDenseRetriever:
        """Split ``corpus`` (title + text) into windows (of ``chunking.window`` tokens, at most the model's length,
        or the model's length), embed and index them."""
        chunking = chunking or Chunking()
        require_max(chunking, "a windowed first stage scores a document by its best window")
        windows, owners = corpus_windows(encoder, corpus, chunking)
        inner = DenseRetriever.from_corpus(
            encoder, windows, index=index, batch_size=batch_size, cache=cache, show_progress=show_progress
        )
        return cls(inner, owners)

    def retrieve(self, queries: Queries, k: int) -> Run:
        """Each query's top ``k`` documents by their best window's score (:func:`~embedrank.retrieval.stages.best_windows`:
        exact on an exact index)."""
        qids = list(queries)
        vectors = self.windows.query_vectors(queries)

        def search(rows: list[int], depth: int) -> list[list[tuple[str, float]]]:
            scores, ids = self.windows.index.search(vectors[rows], depth)
            return [
                list(zip(hit_ids, map(float, hit_scores), strict=True))
                for hit_ids, hit_scores in zip(ids, scores, strict=True)
            ]

        found = best_windows(search, len(qids), self.owners, k, len(self.owners))
        return top_k(dict(zip(qids, found, strict=True)), k)


def _check_covers(ids: Sequence[str], corpus: Corpus | None, what: str) -> None:
    if corpus is not None and set(ids) != set(corpus):
        missing, extra = len(set(corpus) - set(ids)), len(set(ids) - set(corpus))
        raise IndexMismatchError(f"{what} does not match the corpus: {missing} documents missing, {extra} unknown")
