"""Fusion weights chosen by cross-validation over queries, never on the query scored."""

from __future__ import annotations

import numpy as np
import pytest

from embedrank.errors import InvalidInputError
from embedrank.evaluation.fusion_cv import cross_validate_fusion, cross_validate_weights, fold_of, fuse, simplex
from embedrank.math.fusion import weighted_fusion
from embedrank.math.metrics import evaluate_per_query

pytestmark = pytest.mark.kernel_free


def _collection(n_queries=40, n_docs=30, seed=0):
    rng = np.random.default_rng(seed)
    qrels, good, noisy = {}, {}, {}
    for i in range(n_queries):
        q = f"q{i}"
        relevant = {f"d{j}" for j in rng.choice(n_docs, 3, replace=False)}
        qrels[q] = dict.fromkeys(relevant, 1)
        # "good" ranks the relevant documents high on most queries; "noisy" is random
        good[q] = {f"d{j}": float(rng.random() + (1.5 if f"d{j}" in relevant and i % 4 else 0)) for j in range(n_docs)}
        noisy[q] = {f"d{j}": float(rng.random()) for j in range(n_docs)}
    return qrels, good, noisy


def test_each_fold_uses_the_value_best_on_the_other_folds():
    qrels, good, noisy = _collection()
    cv = cross_validate_fusion(good, noisy, qrels, folds=4, seed=3)
    folds = fold_of(list(qrels), 4, 3)
    grid = [round(0.1 * i, 1) for i in range(11)]
    per = {
        w: evaluate_per_query(qrels, fuse(good, noisy, method="score", param=w), [10], queries="qrels")["ndcg@10"]
        for w in grid
    }
    for fold in range(4):
        train = [q for q in qrels if folds[q] != fold]
        means = np.array([per[w][train].mean() for w in grid])
        best = grid[int(np.flatnonzero(means >= means.max() - 1e-12)[0])]
        assert cv.chosen[fold] == best
        for q in (q for q in qrels if folds[q] == fold):
            assert cv.per_query[q] == per[best][q]
            assert cv.run[q] == fuse(good, noisy, method="score", param=best)[q]
    assert min(cv.chosen) >= 0.7  # the good run gets the weight
    assert cv.mean > float(cv.fixed.mean())  # better than 0.5 here
    assert "cross-validated ndcg@10" in cv.summary() and "hindsight" in cv.summary()


def test_rrf_grid_and_bad_folds():
    qrels, good, noisy = _collection(seed=1)
    cv = cross_validate_fusion(good, noisy, qrels, method="rrf", folds=5)
    assert set(cv.chosen) <= {1, 5, 10, 20, 40, 60, 100, 200} and cv.fixed_param == 60
    assert len(cv.per_query) == len(qrels)
    with pytest.raises(InvalidInputError, match="folds"):
        cross_validate_fusion(good, noisy, qrels, folds=1)


def test_weights_of_two_runs_choose_what_the_two_run_grid_chooses():
    qrels, good, noisy = _collection()
    two = cross_validate_fusion(good, noisy, qrels, folds=4, seed=3)
    many = cross_validate_weights([good, noisy], qrels, folds=4, seed=3)
    assert [w for w, _ in many.chosen] == two.chosen
    assert np.allclose(many.per_query, two.per_query)


def test_weights_of_three_runs_are_chosen_on_the_other_folds():
    qrels, good, noisy = _collection()
    _, _, other = _collection(seed=1)
    runs = [good, noisy, other]
    cv = cross_validate_weights(runs, qrels, folds=3, seed=0)
    assert len(simplex(3)) == 66 and all(abs(sum(w) - 1) < 1e-9 for w in cv.chosen)
    assert all(w[0] >= 0.5 for w in cv.chosen)  # the informative run dominates
    folds = fold_of(list(qrels), 3, 0)
    for fold, weights in enumerate(cv.chosen):
        fused = weighted_fusion(runs, weights)
        per = evaluate_per_query(qrels, fused, [10], queries="qrels")["ndcg@10"]
        inside = [q for q in qrels if folds[q] == fold]
        assert np.allclose(cv.per_query[inside], per[inside])
    assert "(0.333333/0.333333/0.333333)" in cv.summary()


def test_normalization_and_weights_are_chosen_together_on_the_other_folds():
    qrels, good, noisy = _collection()
    _, _, other = _collection(seed=1)
    runs = [good, noisy, other]
    cv = cross_validate_weights(runs, qrels, normalization=("minmax", "zscore"), folds=3, seed=0)
    folds = fold_of(list(qrels), 3, 0)
    grid = [(n, w) for n in ("minmax", "zscore") for w in simplex(3)]
    per = {p: evaluate_per_query(qrels, weighted_fusion(runs, p[1], normalization=p[0]), [10], queries="qrels")["ndcg@10"] for p in grid}  # fmt: skip
    for fold, chosen in enumerate(cv.chosen):
        train = [q for q in qrels if folds[q] != fold]
        means = np.array([per[p][train].mean() for p in grid])
        assert chosen == grid[int(np.flatnonzero(means >= means.max() - 1e-12)[0])]
        inside = [q for q in qrels if folds[q] == fold]
        assert np.allclose(cv.per_query[inside], per[chosen][inside])
    assert set(cv.grid) == set(grid)  # both normalizations were candidates
    assert cv.fixed_param == ("minmax", (1 / 3, 1 / 3, 1 / 3))
    assert "minmax or zscore, chosen per fold" in cv.summary() and "zscore (" in cv.summary()
    only = cross_validate_weights(runs, qrels, normalization="minmax", folds=3, seed=0)
    assert only.grid == {w: m for (n, w), m in cv.grid.items() if n == "minmax"}  # the same fusions


def test_keeping_the_top_of_each_fused_run_changes_no_metric_within_it():
    qrels, good, noisy = _collection()
    _, _, other = _collection(seed=1)
    runs = [good, noisy, other]
    full = cross_validate_weights(runs, qrels, normalization=("minmax", "zscore"), folds=3, seed=0)
    kept = cross_validate_weights(runs, qrels, normalization=("minmax", "zscore"), folds=3, seed=0, keep=10)
    assert kept.chosen == full.chosen and kept.grid == full.grid  # nDCG@10 sees only the top 10
    assert max(len(docs) for docs in kept.run.values()) == 10 < max(len(docs) for docs in full.run.values())
    for q, docs in kept.run.items():
        assert set(docs) == set(sorted(full.run[q], key=full.run[q].get, reverse=True)[:10])


def test_keeping_the_top_of_a_two_run_fusion_changes_no_metric_within_it():
    qrels, good, noisy = _collection()
    full = cross_validate_fusion(good, noisy, qrels, folds=3, seed=0)
    kept = cross_validate_fusion(good, noisy, qrels, folds=3, seed=0, keep=10)
    assert kept.chosen == full.chosen and kept.grid == full.grid
    assert max(len(docs) for docs in kept.run.values()) == 10 < max(len(docs) for docs in full.run.values())
