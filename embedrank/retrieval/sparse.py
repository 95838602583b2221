"""SPLADE first stage: documents and queries as sparse vectors over the vocabulary, scored by dot product.

The default scorer is exact (:func:`~embedrank.math.sparse.sparse_scores`, one sparse matrix product per
batch of queries); on BEIR-size corpora (up to a few hundred thousand documents) it takes milliseconds per
query. ``index="seismic"`` searches an inverted index instead (:class:`~embedrank.retrieval.sparse_index.SparseIndex`,
exact scores of its candidates; with its default settings the exact top-k), for larger corpora. The
documents' vectors are computed once, when the retriever is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import scipy.sparse as sp

from embedrank.errors import InvalidInputError
from embedrank.math.sparse import sparse_scores
from embedrank.models.chunking import Chunking
from embedrank.models.sparse import SparseEncoder
from embedrank.retrieval.data import doc_text
from embedrank.retrieval.sparse_index import SparseIndex
from embedrank.types import Corpus, Queries, Run

QUERY_BATCH = 256  # queries scored per matrix product: bounds the dense (queries x documents) scores held


class SparseRetriever:
    """Exact SPLADE retrieval over a list of documents with string ids."""

    name = "splade"

    def __init__(
        self,
        encoder: SparseEncoder,
        ids: Sequence[str],
        texts: Sequence[str],
        *,
        batch_size: int = 16,
        vectors: sp.csr_matrix | None = None,
        index: Literal["exact", "seismic"] = "exact",
        chunking: Chunking | None = None,
    ) -> None:
        """Encode ``texts`` (or take their ``vectors`` ``(N, V)`` when given); ``index``: how queries are
        scored (see the module doc); ``chunking``: read a long document window by window, each term weighing
        its largest weight over the windows (:meth:`SparseEncoder.encode_with_stats
        <embedrank.models.sparse.SparseEncoder.encode_with_stats>`), instead of its first ``max_seq_length``
        tokens."""
        self.encoder = encoder
        self.ids = [str(i) for i in ids]
        if vectors is None:
            vectors = encoder.encode_document(texts, batch_size=batch_size, chunking=chunking)
        self.vectors = vectors
        if self.vectors.shape[0] != len(self.ids):
            raise ValueError(f"{self.vectors.shape[0]} vectors for {len(self.ids)} documents")
        if index not in ("exact", "seismic"):
            raise InvalidInputError(f"index must be 'exact' or 'seismic', got {index!r}", param="index")
        self.index = (
            SparseIndex.build(self.ids, self.vectors, model_id=encoder.model_id) if index == "seismic" else None
        )

    @classmethod
    def from_corpus(
        cls,
        encoder: SparseEncoder,
        corpus: Corpus,
        *,
        batch_size: int = 16,
        index: Literal["exact", "seismic"] = "exact",
        chunking: Chunking | None = None,
    ) -> SparseRetriever:
        """SPLADE over a BEIR corpus; a document's text is ``title + " " + text`` (``chunking`` as in the
        constructor)."""
        ids = list(corpus)
        texts = [doc_text(corpus[d]) for d in ids]
        return cls(encoder, ids, texts, batch_size=batch_size, index=index, chunking=chunking)

    def retrieve(self, queries: Queries, k: int) -> Run:
        """Top ``k`` documents per query (score > 0) as a BEIR run, ties broken by document order."""
        qids = list(queries)
        run: Run = {}
        k = min(k, len(self.ids))
        for start in range(0, len(qids), QUERY_BATCH):
            batch = qids[start : start + QUERY_BATCH]
            vectors = self.encoder.encode_query([queries[q] for q in batch])
            if self.index is not None:
                run.update({qid: dict(found) for qid, found in zip(batch, self.index.search(vectors, k), strict=True)})
                continue
            scores = sparse_scores(vectors, self.vectors)  # (Q, D)
            for row, qid in enumerate(batch):
                top = np.argsort(-scores[row], kind="stable")[:k]
                run[qid] = {self.ids[d]: float(scores[row, d]) for d in top if scores[row, d] > 0}
        return run
