"""Dense pseudo-relevance feedback: Rocchio on the vectors of the top-ranked documents.

A training-free way to adapt a query to the collection: search, move the query vector toward the mean
of its top ``k`` documents' vectors (:func:`~embedrank.math.similarity.rocchio`), and search again
(as in Li et al., "Pseudo Relevance Feedback with Deep Language Models and Dense Retrievers", 2021).
"""

from __future__ import annotations

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.math.similarity import rocchio
from embedrank.retrieval.pipeline import DenseRetriever
from embedrank.types import Queries, Run


class DensePRFRetriever:
    """A :class:`DenseRetriever` whose queries are refined once by Rocchio feedback from their top ``k``."""

    def __init__(self, dense: DenseRetriever, *, k: int = 3, alpha: float = 1.0, beta: float = 0.5) -> None:
        if not dense.index.can_reconstruct:
            raise InvalidInputError("dense PRF needs an index that keeps its vectors (numpy, flat, hnsw or ivf)")
        if k < 1:
            raise InvalidInputError(f"k must be >= 1, got {k}")
        self.dense, self.k, self.alpha, self.beta = dense, k, alpha, beta
        self.name = f"dense-prf(k={k},beta={beta:g})"

    def retrieve(self, queries: Queries, k: int) -> Run:
        qids = list(queries)
        vectors = self.dense.encoder.encode_query([queries[q] for q in qids], batch_size=self.dense.batch_size)
        _, first = self.dense.index.search(vectors, self.k)
        feedback = np.zeros((len(qids), self.k, vectors.shape[1]), dtype=np.float32)  # (Q, k, D)
        counts = np.zeros(len(qids), dtype=np.int64)
        for i, ids in enumerate(first):
            if ids:
                feedback[i, : len(ids)] = self.dense.index.reconstruct(ids)
                counts[i] = len(ids)
        refined = rocchio(vectors, feedback, counts, alpha=self.alpha, beta=self.beta)
        scores, found = self.dense.index.search(refined, k)
        return {qid: dict(zip(found[i], map(float, scores[i]), strict=True)) for i, qid in enumerate(qids)}
