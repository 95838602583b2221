"""The statistics against scipy and hand-computed values, and the comparison tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from embedrank.evaluation.compare import SystemRun, biggest_differences, compare_systems, metric_table
from embedrank.math.significance import holm, paired_t_test, randomization_test, win_tie_loss

pytestmark = pytest.mark.kernel_free


def test_t_test_equals_scipy_and_a_hand_computed_case():
    rng = np.random.default_rng(0)
    for n in (5, 40, 300):
        a, b = rng.random(n), rng.random(n)
        assert paired_t_test(a, b) == pytest.approx(stats.ttest_rel(b, a).pvalue, rel=1e-12)
    # d = [0.1, 0.2, 0, 0.2]: mean 0.125, sd sqrt(0.0275 / 3), t = 2.6112 on 3 df, two-sided p = 0.0796
    assert paired_t_test(np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.2, 0.4, 0.3, 0.6])) == pytest.approx(
        0.07962, abs=5e-5
    )
    assert paired_t_test(np.ones(5), np.ones(5)) == 1.0  # no difference at all: scipy says nan


def test_exact_randomization_equals_scipy_permutation_test():
    rng = np.random.default_rng(1)
    for n in (6, 10, 13):
        a, b = rng.random(n), rng.random(n) + 0.1
        ref = stats.permutation_test(
            (b, a), lambda x, y: np.mean(x - y), permutation_type="samples", n_resamples=np.inf, vectorized=False
        ).pvalue
        assert randomization_test(a, b, permutations=2**n) == pytest.approx(ref, abs=1e-12)


def test_monte_carlo_randomization_is_seeded_and_close_to_exact():
    rng = np.random.default_rng(2)
    a, b = rng.random(18), rng.random(18) + 0.08
    exact = randomization_test(a, b, permutations=2**18)
    sampled = randomization_test(a, b, permutations=5000, seed=7)
    assert sampled == randomization_test(a, b, permutations=5000, seed=7)
    assert sampled != randomization_test(a, b, permutations=5000, seed=8)
    assert abs(sampled - exact) < 0.02
    # hand-computed: 3 queries, all +1: only the all-plus and all-minus patterns are as extreme -> 2/8
    assert randomization_test(np.zeros(3), np.ones(3)) == 0.25
    assert randomization_test(np.zeros(300), np.full(300, 0.1), permutations=999) == 1 / 1000  # never 0


def test_holm_hand_computed_and_against_a_loop():
    # sorted p: 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> max-accumulated 0.06
    assert holm(np.array([0.01, 0.04, 0.03, 0.005])).tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    rng = np.random.default_rng(3)
    p = rng.random(12) ** 3
    order = np.argsort(p)
    expected = np.empty(12)
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (12 - i) * p[j]))
        expected[j] = running
    np.testing.assert_allclose(holm(p), expected)
    assert holm(np.array([])).shape == (0,)


def test_win_tie_loss_and_bad_input():
    assert win_tie_loss(np.array([0.1, 0.5, 0.3, 0.2]), np.array([0.2, 0.5, 0.0, 0.2])) == (1, 2, 1)
    with pytest.raises(ValueError, match="same non-zero length"):
        paired_t_test(np.ones(3), np.ones(4))


def _runs():
    rng = np.random.default_rng(4)
    qids = [f"q{i}" for i in range(60)]
    base = rng.random(60)
    frames = {
        "bm25": base,
        "dense": np.clip(base + 0.25 + 0.05 * rng.normal(size=60), 0, 1),  # clearly better
        "noise": np.clip(base + 0.01 * rng.normal(size=60), 0, 1),  # no real difference
    }
    runs = []
    for dataset in ("d1", "d2"):
        for system, values in frames.items():
            pq = pd.DataFrame({"ndcg@10": values, "recall@100": values}, index=pd.Index(qids, name="query_id"))
            runs.append(SystemRun(dataset, system, pq, {q: {f"doc-{system}": 1.0} for q in qids}))
    return runs


def test_compare_systems_marks_the_real_difference_only():
    runs = _runs()
    comparisons = compare_systems(runs, metrics=["ndcg@10", "recall@100"], permutations=2000)
    assert len(comparisons) == 8  # 2 systems x 2 datasets x 2 metrics, baseline = the first system
    by = {(c.dataset, c.system, c.metric): c for c in comparisons}
    assert by[("d1", "dense", "ndcg@10")].significant and not by[("d1", "noise", "ndcg@10")].significant
    c = by[("d2", "dense", "ndcg@10")]
    assert c.baseline == "bm25" and c.wins > 50 and c.delta > 0.2 and c.p_holm >= c.randomization_p
    assert set(c.to_json()) >= {"t_test_p", "randomization_p", "p_holm", "significant", "system", "baseline"}
    table = metric_table(runs, "ndcg@10", comparisons)
    assert list(table.columns) == ["d1", "d2", "mean"] and list(table.index) == ["bm25", "dense", "noise"]
    assert table.loc["dense", "d1"].endswith("†") and not table.loc["noise", "d1"].endswith("†")
    assert not table.loc["dense", "mean"].endswith("†")
    with pytest.raises(Exception, match="baseline"):
        compare_systems(runs, baseline="nope")


def test_systems_named_in_advance_form_the_whole_family():
    runs = _runs()
    every = compare_systems(runs, metrics=["ndcg@10"], permutations=2000)
    planned = compare_systems(runs, metrics=["ndcg@10"], permutations=2000, tested=["noise"])
    assert {(c.dataset, c.system) for c in planned} == {("d1", "noise"), ("d2", "noise")}
    raw = sorted(c.randomization_p for c in planned)
    assert sorted(c.p_holm for c in planned) == pytest.approx([min(1.0, 2 * raw[0]), min(1.0, max(2 * raw[0], raw[1]))])
    by = {(c.dataset, c.system): c for c in every}
    for c in planned:  # the same test, corrected over 2 comparisons instead of 4
        assert c.randomization_p == by[(c.dataset, c.system)].randomization_p
        assert c.p_holm <= by[(c.dataset, c.system)].p_holm
    assert "noise" in metric_table(runs, "ndcg@10", planned).index  # untested systems are still reported
    with pytest.raises(Exception, match="nope"):
        compare_systems(runs, tested=["nope"])


def test_biggest_differences_lists_queries_with_texts():
    from embedrank.retrieval.data import BeirDataset

    runs = _runs()
    qids = list(runs[0].per_query.index)
    corpus = {f"doc-{s}": {"title": "", "text": f"text of {s}"} for s in ("bm25", "dense", "noise")}
    ds = BeirDataset(name="d1", path=None, corpus=corpus, queries={q: f"query {q}" for q in qids}, qrels={})  # type: ignore[arg-type]
    frame = biggest_differences(runs[0], runs[1], ds, n=5)
    assert len(frame) == 5 and frame["delta"].abs().is_monotonic_decreasing
    assert frame["query"].iloc[0].startswith("query q") and "text of dense" in frame["top doc (dense)"].iloc[0]
