"""Metrics on hand-computed cases (graded relevance, no relevant documents, ties) and against pytrec_eval."""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytrec_eval

from embedrank.math.metrics import evaluate, evaluate_per_query


def test_binary_hand_computed():
    qrels = {"q1": {"d1": 1, "d2": 1}}
    run = {"q1": {"d3": 0.9, "d1": 0.8, "d4": 0.7, "d2": 0.6}}
    m = evaluate(qrels, run, [2, 4, 10])
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    idcg = 1 + 1 / math.log2(3)
    assert m["ndcg@4"] == pytest.approx(dcg / idcg)
    assert m["ndcg@2"] == pytest.approx((1 / math.log2(3)) / idcg)
    assert m["recall@2"] == pytest.approx(0.5)
    assert m["recall@4"] == pytest.approx(1.0)
    assert m["mrr@10"] == pytest.approx(0.5)
    assert m["p@2"] == pytest.approx(0.5)
    assert m["map@4"] == pytest.approx((1 / 2 + 2 / 4) / 2)


def test_graded_relevance_uses_linear_gain_like_trec_eval():
    qrels = {"q": {"a": 3, "b": 1, "c": 0}}
    run = {"q": {"b": 3.0, "a": 2.0, "c": 1.0}}
    m = evaluate(qrels, run, [10])
    dcg = 1 / math.log2(2) + 3 / math.log2(3)
    idcg = 3 / math.log2(2) + 1 / math.log2(3)
    assert m["ndcg@10"] == pytest.approx(dcg / idcg)
    # With relevance_level=2 only "a" counts for MRR and recall.
    strict = evaluate(qrels, run, [10], relevance_level=2)
    assert strict["mrr@10"] == pytest.approx(0.5)
    assert strict["recall@10"] == pytest.approx(1.0)
    assert strict["ndcg@10"] == pytest.approx(m["ndcg@10"])


def test_query_without_relevant_docs_and_missing_queries_count_as_zero():
    qrels = {"q1": {"d1": 1}, "q2": {"d9": 0}, "q3": {"d5": 1}}
    run = {"q1": {"d1": 1.0}, "q2": {"d1": 1.0}}  # q3 missing from the run
    per_query = evaluate_per_query(qrels, run, [10])
    assert list(per_query.index) == ["q1", "q2", "q3"]
    assert per_query.loc["q1", "ndcg@10"] == 1.0
    assert per_query.loc["q2"].eq(0).all()
    assert per_query.loc["q3"].eq(0).all()
    assert evaluate(qrels, run, [10])["ndcg@10"] == pytest.approx(1 / 3)


def test_own_id_is_never_a_hit():
    qrels = {"q1": {"q1": 1, "d1": 1}}
    run = {"q1": {"q1": 10.0, "d1": 5.0}}
    m = evaluate(qrels, run, [1])
    assert m["mrr@1"] == 1.0  # d1 is first once the query itself is dropped
    assert m["recall@1"] == pytest.approx(0.5)


def test_ties_break_like_trec_eval():
    qrels = {"q": {"a": 1}}
    run = {"q": {"a": 1.0, "b": 1.0}}
    m = evaluate(qrels, run, [1, 10])
    # trec_eval orders equal scores by doc id descending: b before a.
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)["q"]["recip_rank"]
    assert m["mrr@10"] == pytest.approx(ref) == pytest.approx(0.5)
    assert m["mrr@1"] == 0.0
    assert evaluate(qrels, run, [10]) == evaluate(qrels, dict(run), [10])  # deterministic


def test_matches_pytrec_eval_on_random_runs():
    rng = np.random.default_rng(7)
    docs = [f"d{i}" for i in range(60)]
    qrels = {f"q{i}": {d: int(rng.integers(0, 4)) for d in rng.choice(docs, 8, replace=False)} for i in range(20)}
    run = {q: {d: float(rng.random()) for d in rng.choice(docs, 40, replace=False)} for q in qrels}
    ours = evaluate_per_query(qrels, run, [5, 10, 100])
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100", "recip_rank", "P.5"}).evaluate(run)
    for q in qrels:
        assert ours.loc[q, "ndcg@10"] == pytest.approx(ref[q]["ndcg_cut_10"])
        assert ours.loc[q, "recall@100"] == pytest.approx(ref[q]["recall_100"])
        assert ours.loc[q, "mrr@100"] == pytest.approx(ref[q]["recip_rank"])  # cut >= run length
        assert ours.loc[q, "p@5"] == pytest.approx(ref[q]["P_5"])


def test_inputs_are_not_mutated():
    qrels = {"q1": {"d1": 1}}
    run = {"q1": {"q1": 2.0, "d1": 1.0}, "extra": {"d1": 1.0}}
    before = (repr(qrels), repr(run))
    evaluate(qrels, run, [10])
    assert (repr(qrels), repr(run)) == before
