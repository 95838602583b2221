"""Rerankers: anything that scores (query, document) pairs.

Three kinds: :class:`CrossEncoderScorer` (true joint scoring), :class:`BiEncoderScorer` (cosine of an
embedding model, the offline default) and :class:`LateInteractionScorer` (ColBERT's MaxSim, bge-m3's combined
score).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.math.similarity import cosine_scores
from embedrank.models.checks import check_texts
from embedrank.models.chunking import Chunking, score_chunked
from embedrank.models.colbert import ColBERTEncoder
from embedrank.models.cross_encoder import CrossEncoder
from embedrank.models.encoder import Encoder
from embedrank.models.m3 import M3Encoder
from embedrank.registry import resolve

ScorerKind = Literal["cross-encoder", "bi-encoder", "late-interaction"]


@runtime_checkable
class Reranker(Protocol):
    """Scores documents against a query; a higher score means more relevant."""

    model_id: str
    kind: ScorerKind

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """``(N,)`` float32 scores in input order."""
        ...


class CrossEncoderScorer:
    """Adapter that gives a :class:`CrossEncoder` the :class:`Reranker` shape."""

    kind: ScorerKind = "cross-encoder"

    def __init__(self, cross_encoder: CrossEncoder, *, batch_size: int = 32, chunking: Chunking | None = None) -> None:
        self.cross_encoder = cross_encoder
        self.model_id = cross_encoder.model_id
        self.batch_size = batch_size
        self.chunking = chunking  # None: long documents are truncated

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        return self.cross_encoder.score(query, documents, batch_size=self.batch_size, chunking=self.chunking)

    def with_chunking(self, chunking: Chunking | None) -> CrossEncoderScorer:
        """The same model, scoring with ``chunking`` (None: truncation)."""
        return CrossEncoderScorer(self.cross_encoder, batch_size=self.batch_size, chunking=chunking)


class BiEncoderScorer:
    """Reranks by cosine similarity between the query embedding and each document embedding.

    When the documents' vectors are already at hand (an index built with the same encoder holds them),
    :meth:`score_vectors` scores them without encoding the documents again. Otherwise the vectors of the
    last ``cache_size`` distinct documents (or windows) it encoded are kept (about 1.5 KiB each for a 384-d
    model; 0 keeps none): a document that is a candidate of several queries of a run is encoded once.
    """

    kind: ScorerKind = "bi-encoder"

    def __init__(
        self, encoder: Encoder, *, batch_size: int = 32, chunking: Chunking | None = None, cache_size: int = 10_000
    ) -> None:
        self.encoder = encoder
        self.model_id = encoder.model_id
        self.batch_size = batch_size
        self.chunking = chunking  # None: long documents are truncated; else windows, aggregated
        self.cache_size = cache_size
        self._vectors: OrderedDict[bytes, np.ndarray] = OrderedDict()  # text digest -> (D,), least recent first
        self._lock = threading.Lock()

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a string, got {type(query).__name__}", param="query")
        docs = check_texts(documents, "documents")
        if self.chunking is None:
            return self._cosines(query, docs)
        scores, _ = score_chunked(
            docs,
            lambda windows: self._cosines(query, windows),
            offsets=self.encoder.token_offsets,
            window=self.encoder.chunk_window(),
            chunking=self.chunking,
        )
        return scores

    def with_chunking(self, chunking: Chunking | None) -> BiEncoderScorer:
        """The same model, scoring with ``chunking`` (None: truncation)."""
        return BiEncoderScorer(self.encoder, batch_size=self.batch_size, chunking=chunking, cache_size=self.cache_size)

    def _cosines(self, query: str, docs: Sequence[str]) -> np.ndarray:
        """One pass for the query and the documents not in the cache, each with its own prompt (none for
        most models)."""
        keys = [hashlib.blake2b(d.encode("utf-8", "surrogatepass"), digest_size=16).digest() for d in docs]
        with self._lock:  # the cache is shared by the threads that score with this scorer
            known = {k: self._vectors[k] for k in keys if k in self._vectors}
        missing = {k: d for k, d in zip(keys, docs, strict=True) if k not in known}  # first text of each key
        texts = [self.encoder.query_prompt + query, *(self.encoder.document_prompt + d for d in missing.values())]
        vectors = self.encoder.encode(texts, batch_size=self.batch_size, show_progress=False, prompt="")  # (1 + M, D)
        known.update(zip(missing, [row.copy() for row in vectors[1:]], strict=True))  # not views of the batch
        doc_vectors = np.stack([known[k] for k in keys]) if keys else vectors[1:]  # (N, D)
        with self._lock:
            for k in keys:
                self._vectors[k] = known[k]
                self._vectors.move_to_end(k)
            while len(self._vectors) > self.cache_size:
                self._vectors.popitem(last=False)
        return cosine_scores(vectors[0], doc_vectors)

    def score_vectors(self, query_vector: np.ndarray, document_vectors: np.ndarray) -> np.ndarray:
        """Cosine of a query vector ``(D,)`` with stored document vectors ``(N, D)`` from the same encoder."""
        return cosine_scores(query_vector, document_vectors)


class LateInteractionScorer:
    """Reranks by late interaction: a ColBERT model's MaxSim (:class:`~embedrank.models.colbert.ColBERTEncoder`)
    or bge-m3's combined dense, lexical and MaxSim score (:class:`~embedrank.models.m3.M3Encoder`)."""

    kind: ScorerKind = "late-interaction"

    def __init__(
        self, model: ColBERTEncoder | M3Encoder, *, batch_size: int = 32, chunking: Chunking | None = None
    ) -> None:
        self.model = model
        self.model_id = model.spec.model_id
        self.batch_size = batch_size
        self.chunking = chunking  # None: long documents are cut at the model's window

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a string, got {type(query).__name__}", param="query")
        return self.model.rerank_scores(query, documents, batch_size=self.batch_size, chunking=self.chunking)

    def with_chunking(self, chunking: Chunking | None) -> LateInteractionScorer:
        """The same model, scoring with ``chunking`` (None: truncation)."""
        return LateInteractionScorer(self.model, batch_size=self.batch_size, chunking=chunking)


def load_reranker(
    model_id: str,
    *,
    batch_size: int = 32,
    device: str = "cpu",
    chunking: Chunking | None = None,
    max_seq_length: int | None = None,
    backend: str | None = None,
    precision: str | None = None,
) -> CrossEncoderScorer | BiEncoderScorer | LateInteractionScorer:
    """Load a reranker; the kind (cross-encoder, late interaction for ColBERT and bge-m3 models, else a
    bi-encoder scorer) comes from the model's own files.
    With ``chunking``, long documents are scored window by window (:mod:`embedrank.models.chunking`);
    ``max_seq_length`` overrides the model's own window; ``backend`` and ``precision`` choose what runs it
    (:mod:`embedrank.runtime.backends`).

    A bi-encoder scorer cannot change the order of a dense first stage built on the same model (both rank
    by the same cosine); :class:`~embedrank.retrieval.pipeline.RetrieveRerank` warns when it sees that.
    """
    spec = resolve(model_id)
    kind = spec.kind
    if kind in ("multi-vector", "m3"):  # ColBERT's MaxSim; bge-m3's combined score
        loader = ColBERTEncoder if kind == "multi-vector" else M3Encoder
        late = loader.from_spec(
            spec, device=device, max_seq_length=max_seq_length, backend=backend, precision=precision
        )
        return LateInteractionScorer(late, batch_size=batch_size, chunking=chunking)
    if kind == "cross-encoder":
        model = CrossEncoder.from_spec(
            spec, device=device, max_seq_length=max_seq_length, backend=backend, precision=precision
        )
        return CrossEncoderScorer(model, batch_size=batch_size, chunking=chunking)
    encoder = Encoder.from_spec(
        spec, device=device, max_seq_length=max_seq_length, backend=backend, precision=precision
    )
    return BiEncoderScorer(encoder, batch_size=batch_size, chunking=chunking)
