"""The sparse inverted index (Seismic) returns the exact scorer's top-k with its exact scores, saves and
loads with the model guard."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from embedrank.errors import IndexMismatchError
from embedrank.math.sparse import sparse_scores
from embedrank.retrieval.sparse_index import SparseIndex

pytest.importorskip("seismic")


def _oracle(queries: sp.csr_matrix, docs: sp.csr_matrix, ids: list[str], k: int) -> list[list[tuple[str, float]]]:
    scores = sparse_scores(queries, docs)
    out = []
    for row in scores:
        top = np.argsort(-row, kind="stable")[:k]
        out.append([(ids[d], float(row[d])) for d in top if row[d] > 0])
    return out


@pytest.fixture(scope="module")
def collection():
    docs = sp.random(2000, 4000, density=0.01, random_state=1, format="lil", dtype=np.float32)
    docs[5, :] = 0  # a document without weights
    queries = sp.random(40, 4000, density=0.004, random_state=2, format="csr", dtype=np.float32)
    return [f"doc-{i}" for i in range(docs.shape[0])], docs.tocsr(), queries


def test_the_index_returns_the_exact_top_k_and_scores(collection, tmp_path):
    ids, docs, queries = collection
    index = SparseIndex.build(ids, docs, model_id="splade")
    for k in (1, 10, 50):
        got, want = index.search(queries, k), _oracle(queries, docs, ids, k)
        for g, w in zip(got, want, strict=True):
            assert [d for d, _ in g] == [d for d, _ in w]
            assert np.allclose([s for _, s in g], [s for _, s in w], atol=1e-6)
    loaded = SparseIndex.load(index.save(tmp_path / "idx"), model_id="splade")
    assert loaded.search(queries, 10) == index.search(queries, 10)
    with pytest.raises(IndexMismatchError, match="built with 'splade'; queries come from 'other'"):
        SparseIndex.load(tmp_path / "idx", model_id="other")
    with pytest.raises(IndexMismatchError, match="not an embedrank sparse index"):
        SparseIndex.load(tmp_path, model_id="splade")


def test_pruned_settings_still_score_exactly(collection):
    ids, docs, queries = collection
    index = SparseIndex.build(ids, docs, model_id="splade", n_postings=5)
    exact = sparse_scores(queries, docs)
    lookup = {d: i for i, d in enumerate(ids)}
    for q, results in enumerate(index.search(queries, 10, query_cut=3, heap_factor=0.7)):
        for doc, score in results:  # whatever it finds carries the exact score
            assert score == pytest.approx(float(exact[q, lookup[doc]]), abs=1e-6)
