"""Dense pseudo-relevance feedback (Rocchio) against a hand computation."""

from __future__ import annotations

import numpy as np
import pytest

from embedrank.errors import InvalidInputError
from embedrank.math.similarity import l2_normalize, rocchio
from embedrank.retrieval.index import build_index
from embedrank.retrieval.pipeline import DenseRetriever
from embedrank.retrieval.prf import DensePRFRetriever


class _Table:
    """An 'encoder' that looks texts up in a table of vectors."""

    model_id, dimension = "table", 4

    def __init__(self, vectors):
        self.vectors = vectors

    def encode_query(self, texts, **_):
        return np.stack([self.vectors[t] for t in texts])


def test_rocchio_equals_the_formula_and_ignores_padding():
    rng = np.random.default_rng(0)
    q, f = rng.normal(size=(3, 4)), rng.normal(size=(3, 2, 4))
    counts = np.array([2, 1, 0])
    got = rocchio(q, f, counts, alpha=0.8, beta=0.4)
    expected = [0.8 * q[0] + 0.4 * f[0].mean(0), 0.8 * q[1] + 0.4 * f[1, 0], 0.8 * q[2]]
    np.testing.assert_allclose(got, l2_normalize(np.array(expected, dtype=np.float32)), atol=1e-6)


def test_prf_searches_again_with_the_refined_query():
    docs = l2_normalize(np.array([[1, 0, 0, 0], [0.9, 0.4, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], dtype=np.float32))
    query = l2_normalize(np.array([[1, 0.05, 0, 0]], dtype=np.float32))
    index = build_index(4, kind="flat")
    index.add(["a", "b", "c", "d"], docs)
    dense = DenseRetriever(_Table({"q": query[0]}), index)  # type: ignore[arg-type]
    prf = DensePRFRetriever(dense, k=2, beta=2.0)
    run = prf.retrieve({"q": "q"}, 4)
    refined = rocchio(query, docs[None, :2], np.array([2]), alpha=1.0, beta=2.0)
    expected = docs @ refined[0]
    np.testing.assert_allclose(list(run["q"].values()), sorted(expected.tolist(), reverse=True), atol=1e-5)
    assert list(run["q"])[:2] == ["a", "b"] and run["q"]["c"] > float(docs[2] @ query[0])  # moved toward b's side
    with pytest.raises(InvalidInputError, match="keeps its vectors"):
        pq = build_index(4, kind="binary")
        pq.add(["a", "b", "c", "d"], docs)
        DensePRFRetriever(DenseRetriever(_Table({}), pq))  # type: ignore[arg-type]
