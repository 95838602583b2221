"""Is a difference between two systems real? Paired tests over per-query scores, and Holm's correction.

Two systems evaluated on the same queries give paired scores ``a[i]``, ``b[i]``. The tests ask whether
the mean of ``d = b - a`` could be zero:

- :func:`paired_t_test`: Student's paired t-test (scipy's ``ttest_rel``), two-sided;
- :func:`randomization_test`: Fisher's paired randomization test, two-sided: under the null hypothesis
  each ``d[i]`` is as likely to have the other sign, so flip signs at random and count how often the
  mean is at least as far from zero as observed. Exact (all ``2**n`` sign patterns) when that is no more
  than ``permutations``; else seeded Monte Carlo with the ``(count + 1) / (permutations + 1)`` estimate,
  which never returns 0 (Smucker, Allan & Carterette 2007 recommend it for IR);
- :func:`holm`: Holm-Bonferroni step-down adjustment of the p-values of a family of comparisons (one
  table), controlling the family-wise error rate without assuming independence.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy import stats


def _differences(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(
            f"paired scores must be two 1-d arrays of the same non-zero length, got {a.shape} and {b.shape}"
        )
    return b - a


def paired_t_test(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of the paired t-test on ``(n,)`` scores; 1.0 when every difference is zero
    (scipy gives nan there: no evidence of a difference).

    >>> round(paired_t_test(np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.2, 0.4, 0.3, 0.6])), 4)
    0.0796
    """
    d = _differences(a, b)
    if not d.any() or len(d) < 2:
        return 1.0
    p = float(stats.ttest_rel(b, a).pvalue)
    return 1.0 if np.isnan(p) else p  # all differences equal and non-zero: infinite t -> scipy gives 0, kept


def randomization_test(a: np.ndarray, b: np.ndarray, *, permutations: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value of the paired randomization (sign-flip) test on ``(n,)`` scores.

    Exact over all ``2**n`` sign patterns when ``2**n <= permutations``; otherwise ``permutations`` seeded
    random patterns and ``(extreme + 1) / (permutations + 1)``.

    >>> randomization_test(np.array([0.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0]))  # 2 of 8 patterns as extreme
    0.25
    """
    d = _differences(a, b)
    if permutations < 1:
        raise ValueError(f"permutations must be >= 1, got {permutations}")
    observed = abs(d.mean())
    tolerance = 1e-12 * max(1.0, observed)  # float noise must not make the observed pattern "less extreme"
    n = len(d)
    if n <= 20 and 2**n <= permutations:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))  # (2**n, n)
        means = np.abs(signs @ d) / n
        return float((means >= observed - tolerance).mean())
    rng = np.random.default_rng(seed)
    extreme = 0
    for start in range(0, permutations, 1000):  # (1000, n) sign patterns at a time: bounded memory
        signs = rng.choice((-1.0, 1.0), size=(min(1000, permutations - start), n))
        extreme += int((np.abs(signs @ d) / n >= observed - tolerance).sum())
    return (extreme + 1) / (permutations + 1)


def holm(pvalues: np.ndarray) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values ``(m,)``, in the input order: the ``i``-th smallest p is multiplied
    by ``m - i`` (``i`` from 0), made non-decreasing along that order, and capped at 1.

    >>> holm(np.array([0.01, 0.04, 0.03, 0.005])).round(3).tolist()
    [0.03, 0.06, 0.06, 0.02]
    """
    p = np.asarray(pvalues, dtype=np.float64)
    m = len(p)
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(p[order] * (m - np.arange(m)))
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted


def win_tie_loss(a: np.ndarray, b: np.ndarray, *, tolerance: float = 1e-9) -> tuple[int, int, int]:
    """Queries where ``b`` beats, ties, loses to ``a`` (``|b - a| <= tolerance`` is a tie).

    >>> win_tie_loss(np.array([0.1, 0.5, 0.3]), np.array([0.2, 0.5, 0.0]))
    (1, 1, 1)
    """
    d = _differences(a, b)
    return int((d > tolerance).sum()), int((np.abs(d) <= tolerance).sum()), int((d < -tolerance).sum())
