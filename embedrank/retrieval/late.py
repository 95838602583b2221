"""Exact late-interaction retrieval: every document's token vectors in memory, each query scored against all of
them by MaxSim.

For a ColBERT model (:class:`~embedrank.models.colbert.ColBERTEncoder`, MaxSim summed over the query's vectors,
as PyLate) or bge-m3's multi-vectors (:class:`~embedrank.models.m3.M3Encoder`, averaged, as FlagEmbedding).
Exact and simple, for small corpora: memory is every document token's vector (SciFact's 5,183 abstracts at
ColBERT's 180-token window and 128 dimensions: about 0.5 GB in float32), and a query costs one matrix product
with all of them. Larger corpora want a PLAID index (the ``fast-plaid`` package, which PyLate uses).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from embedrank.math.late import maxsim_stacked
from embedrank.models.colbert import ColBERTEncoder
from embedrank.models.m3 import M3Encoder
from embedrank.retrieval.data import doc_text
from embedrank.types import Corpus, Queries, Run


class MultiVectorRetriever:
    """Exact MaxSim retrieval over a list of documents with string ids."""

    name = "multi-vector"

    def __init__(
        self, model: ColBERTEncoder | M3Encoder, ids: Sequence[str], texts: Sequence[str], *, batch_size: int = 32
    ) -> None:
        """Encode ``texts`` as documents and keep their token vectors stacked ``(M, D)``."""
        self.model = model
        self.ids = [str(i) for i in ids]
        if len(self.ids) != len(texts):
            raise ValueError(f"{len(texts)} texts for {len(self.ids)} ids")
        documents = self._encode(texts, query=False, batch_size=batch_size)
        self.starts = np.concatenate([[0], np.cumsum([len(d) for d in documents])]).astype(np.int64)  # (N + 1,)
        width = max((d.shape[1] for d in documents if d.ndim == 2 and len(d)), default=0)
        self.vectors = np.concatenate([d.reshape(-1, width) for d in documents]).astype(np.float32)  # (M, D)
        self.reduce = model.maxsim_reduce

    @classmethod
    def from_corpus(
        cls, model: ColBERTEncoder | M3Encoder, corpus: Corpus, *, batch_size: int = 32
    ) -> MultiVectorRetriever:
        """Over a BEIR corpus; a document's text is ``title + " " + text``."""
        ids = list(corpus)
        return cls(model, ids, [doc_text(corpus[d]) for d in ids], batch_size=batch_size)

    def _encode(self, texts: Sequence[str], *, query: bool, batch_size: int = 32) -> list[np.ndarray]:
        return self.model.multi_vectors(list(texts), query=query, batch_size=batch_size)

    def scores(self, query: str) -> np.ndarray:
        """MaxSim of ``query`` against every document, ``(N,)`` float32 in document order."""
        (vectors,) = self._encode([query], query=True)
        return maxsim_stacked(vectors, self.vectors, self.starts, reduce=self.reduce)  # type: ignore[arg-type]

    def retrieve(self, queries: Queries, k: int) -> Run:
        """Top ``k`` documents per query as a BEIR run, ties broken by document order."""
        run: Run = {}
        for qid, text in queries.items():
            scores = self.scores(text)
            top = np.argsort(-scores, kind="stable")[:k]
            run[qid] = {self.ids[i]: float(scores[i]) for i in top}
        return run
