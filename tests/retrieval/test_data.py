"""BEIR-layout collections: the judged sample and writing a collection back out."""

from __future__ import annotations

import numpy as np
import pytest

from embedrank import evaluate_per_query, load_beir
from embedrank.retrieval.data import BeirDataset, judged_sample, write_beir

pytestmark = pytest.mark.kernel_free


def _collection(tmp_path, n_docs: int = 300, n_queries: int = 20) -> BeirDataset:
    rng = np.random.default_rng(3)
    corpus = {f"d{i}": {"title": f"t{i}", "text": f"text {i}"} for i in range(n_docs)}
    queries = {f"q{i}": f"query {i}" for i in range(n_queries)}
    qrels = {q: {f"d{j}": int(rng.integers(0, 3)) for j in rng.choice(n_docs, 4, replace=False)} for q in queries}
    return load_beir(write_beir(tmp_path / "c", corpus, queries, {"test": qrels}))


def test_the_judged_sample_keeps_every_judged_document_and_is_seeded(tmp_path):
    ds = _collection(tmp_path)
    sample = judged_sample(ds, 100)
    judged = {d for rels in ds.qrels.values() for d in rels}
    assert len(sample.corpus) == 100 and judged <= set(sample.corpus)
    assert list(sample.corpus) == [d for d in ds.corpus if d in sample.corpus]  # corpus order
    assert sample.queries == ds.queries and sample.qrels == ds.qrels
    assert judged_sample(ds, 100).corpus == sample.corpus and judged_sample(ds, 100, seed=1).corpus != sample.corpus
    few = judged_sample(ds, 30, n_queries=5)
    assert list(few.queries) == list(ds.queries)[:5] and set(few.qrels) == set(few.queries)
    assert {d for rels in few.qrels.values() for d in rels} <= set(few.corpus) and len(few.corpus) == 30
    assert len(judged_sample(ds, 10_000).corpus) == len(ds.corpus)
    with pytest.raises(ValueError, match=r"20 queries judge \d+ documents, more than n_docs=10"):
        judged_sample(ds, 10)


def test_a_fixed_ranking_scores_at_least_as_well_on_the_sample(tmp_path):
    """Only unjudged documents leave, so with the same scores every query's nDCG@10 and recall@100 can only
    rise: the bound the suite's SciFact sample relies on."""
    ds = _collection(tmp_path)
    rng = np.random.default_rng(0)
    scores = {q: {d: float(rng.random()) for d in ds.corpus} for q in ds.queries}
    sample = judged_sample(ds, 120)
    full = evaluate_per_query(ds.qrels, scores, [10, 100])[["ndcg@10", "recall@100"]]
    kept = {q: {d: s for d, s in docs.items() if d in sample.corpus} for q, docs in scores.items()}
    part = evaluate_per_query(sample.qrels, kept, [10, 100])[["ndcg@10", "recall@100"]].loc[full.index]
    assert (part.to_numpy() >= full.to_numpy() - 1e-12).all()
    assert (part.to_numpy() > full.to_numpy()).any()


def test_a_written_sample_loads_back_equal(tmp_path):
    sample = judged_sample(_collection(tmp_path), 50, n_queries=4)
    back = load_beir(write_beir(tmp_path / "s", sample.corpus, sample.queries, {"test": sample.qrels}))
    assert (back.corpus, back.queries, back.qrels) == (sample.corpus, sample.queries, sample.qrels)
