"""Metrics on hand-computed cases (graded relevance, no relevant documents, ties, subsets) and against ranx,
an implementation independent of trec_eval/pytrec_eval (numba, its own code)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytrec_eval

from embedrank.errors import InvalidInputError
from embedrank.math.metrics import evaluate, evaluate_per_query

pytestmark = pytest.mark.kernel_free


def test_binary_hand_computed():
    qrels = {"q1": {"d1": 1, "d2": 1}}
    run = {"q1": {"d3": 0.9, "d1": 0.8, "d4": 0.7, "d2": 0.6}}
    m = evaluate(qrels, run, k_values=[2, 4, 10])
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
    m = evaluate(qrels, run, k_values=[10])
    dcg = 1 / math.log2(2) + 3 / math.log2(3)
    idcg = 3 / math.log2(2) + 1 / math.log2(3)
    assert m["ndcg@10"] == pytest.approx(dcg / idcg)
    # With relevance_level=2 only "a" counts for MRR and recall.
    strict = evaluate(qrels, run, k_values=[10], relevance_level=2)
    assert strict["mrr@10"] == pytest.approx(0.5)
    assert strict["recall@10"] == pytest.approx(1.0)
    assert strict["ndcg@10"] == pytest.approx(m["ndcg@10"])


def test_query_without_relevant_docs_and_missing_queries():
    qrels = {"q1": {"d1": 1}, "q2": {"d9": 0}, "q3": {"d5": 1}}
    run = {"q1": {"d1": 1.0}, "q2": {"d1": 1.0}, "unjudged": {"d1": 1.0}}  # q3 missing from the run
    per_query = evaluate_per_query(qrels, run, [10])
    assert list(per_query.index) == ["q1", "q2"]  # the judged queries of the run
    assert per_query.loc["q1", "ndcg@10"] == 1.0
    assert per_query.loc["q2"].eq(0).all()
    assert evaluate(qrels, run, ["ndcg@10"]) == {"ndcg@10": pytest.approx(1 / 2)}
    every = evaluate_per_query(qrels, run, [10], queries="qrels")  # trec_eval -c: missing ones score 0
    assert list(every.index) == ["q1", "q2", "q3"] and every.loc["q3"].eq(0).all()
    assert evaluate(qrels, run, ["ndcg@10"], queries="qrels") == {"ndcg@10": pytest.approx(1 / 3)}
    with pytest.raises(InvalidInputError, match="no query of the run"):
        evaluate(qrels, {"other": {"d1": 1.0}})


def test_subset_of_queries_scores_that_subset():
    """The defect: a run over 2 of 3 judged queries was averaged over all 3."""
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}}
    run = {"q1": {"a": 1.0}, "q2": {"b": 1.0}}
    assert evaluate(qrels, run, ["ndcg@10", "recall@100", "mrr@10"]) == {
        "ndcg@10": 1.0,
        "recall@100": 1.0,
        "mrr@10": 1.0,
    }


def test_measures_pick_the_keys():
    qrels, run = {"q": {"a": 1}}, {"q": {"a": 1.0}}
    assert list(evaluate(qrels, run, ["mrr@10", "ndcg@3"])) == ["mrr@10", "ndcg@3"]
    assert len(evaluate(qrels, run)) == 25  # 5 measures x 5 default cut-offs
    with pytest.raises(InvalidInputError, match="unknown measure"):
        evaluate(qrels, run, ["bleu@4"])


def test_own_id_is_never_a_hit():
    qrels = {"q1": {"q1": 1, "d1": 1}}
    run = {"q1": {"q1": 10.0, "d1": 5.0}}
    m = evaluate(qrels, run, k_values=[1])
    assert m["mrr@1"] == 1.0  # d1 is first once the query itself is dropped
    assert m["recall@1"] == pytest.approx(0.5)


def test_ties_break_like_trec_eval():
    qrels = {"q": {"a": 1}}
    run = {"q": {"a": 1.0, "b": 1.0}}
    m = evaluate(qrels, run, k_values=[1, 10])
    # trec_eval orders equal scores by doc id descending: b before a.
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)["q"]["recip_rank"]
    assert m["mrr@10"] == pytest.approx(ref) == pytest.approx(0.5)
    assert m["mrr@1"] == 0.0
    assert evaluate(qrels, run) == evaluate(
        qrels, dict(reversed(run["q"].items())) and {"q": dict(reversed(run["q"].items()))}
    )


@pytest.mark.slow  # ranx compiles its metrics with numba on first use (~40 s)
@pytest.mark.filterwarnings(
    "ignore:.*unsafe cast"
)  # numba, inside ranx (its message may start with terminal colour codes)
def test_matches_ranx_on_random_runs():
    """ranx computes the same measures with its own code; continuous scores, so no tie-break is involved."""
    from ranx import Qrels as RanxQrels
    from ranx import Run as RanxRun
    from ranx import evaluate as ranx_evaluate

    rng = np.random.default_rng(7)
    docs = [f"d{i}" for i in range(80)]
    qrels = {f"q{i}": {d: int(rng.integers(0, 4)) for d in rng.choice(docs, 10, replace=False)} for i in range(25)}
    qrels["q0"] = {d: 0 for d in qrels["q0"]}  # a query with no relevant document
    run = {q: {d: float(rng.random()) for d in rng.choice(docs, 50, replace=False)} for q in qrels}
    ours = evaluate_per_query(qrels, run, [1, 5, 10, 100])
    names = {"ndcg": "ndcg", "recall": "recall", "mrr": "mrr", "map": "map", "p": "precision"}
    for k in (1, 5, 10, 100):
        for ours_name, ranx_name in names.items():
            metric = f"{ranx_name}@{k}"
            ranx_qrels = RanxQrels(
                {q: {d: r for d, r in rels.items() if r > 0} or {"__none__": 0} for q, rels in qrels.items()}
            )
            ref = ranx_evaluate(ranx_qrels, RanxRun(run), metric, return_mean=False)
            np.testing.assert_allclose(ours[f"{ours_name}@{k}"].to_numpy(), ref, atol=1e-9, err_msg=metric)


def test_inputs_are_not_mutated():
    qrels = {"q1": {"d1": 1}}
    run = {"q1": {"q1": 2.0, "d1": 1.0}, "extra": {"d1": 1.0}}
    before = (repr(qrels), repr(run))
    evaluate(qrels, run, k_values=[10])
    assert (repr(qrels), repr(run)) == before
