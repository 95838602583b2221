"""Hybrid fusion with its weight (or RRF's ``k``) chosen by k-fold cross-validation over queries.

Picking the fusion weight that scores best on the test queries reports a figure no one could have had in
advance. Here the queries are split into ``folds`` (seeded shuffle); each fold is fused with the grid value
that scores best on the *other* folds, so every query's score comes from a weight chosen without it. The
result keeps, for comparison, the fixed-weight figure on the same candidates and the best weight in
hindsight (which is not a fair figure, and is labelled so).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd

from embedrank.errors import InvalidInputError
from embedrank.math.fusion import reciprocal_rank_fusion, score_fusion, weighted_fusion
from embedrank.math.metrics import evaluate_per_query, parse_measures
from embedrank.math.ranking import top_k
from embedrank.types import Qrels, Run

WEIGHTS = tuple(round(0.1 * i, 1) for i in range(11))  # score fusion: weight of the first run
RRF_KS = (1, 5, 10, 20, 40, 60, 100, 200)


def fuse(
    run_a: Run,
    run_b: Run,
    *,
    method: Literal["score", "rrf"],
    param: float,
    normalization: Literal["minmax", "zscore"] = "minmax",
) -> Run:
    """``score_fusion`` with ``weight=param``, or ``reciprocal_rank_fusion`` with ``k=param``."""
    if method == "rrf":
        return reciprocal_rank_fusion([run_a, run_b], k=int(param))
    return score_fusion(run_a, run_b, weight=float(param), normalization=normalization)


def fold_of(query_ids: Sequence[str], folds: int, seed: int) -> dict[str, int]:
    """Each query's fold: a seeded shuffle of the sorted ids cut into ``folds`` near-equal parts.

    >>> sorted(fold_of(["a", "b", "c", "d", "e"], 2, 0).values())
    [0, 0, 0, 1, 1]
    """
    if not 2 <= folds <= len(query_ids):
        raise InvalidInputError(f"folds must be between 2 and the number of queries ({len(query_ids)}), got {folds}")
    ids = sorted(query_ids)  # the folds depend on the ids and the seed, not on the order they came in
    order = np.random.default_rng(seed).permutation(len(ids))
    return {ids[i]: int(f) for f, part in enumerate(np.array_split(order, folds)) for i in part}


@dataclasses.dataclass(frozen=True)
class FusionCV:
    """Cross-validated fusion of two runs on one collection.

    ``per_query``: the metric of each query, fused with its fold's choice; ``chosen``: the grid value each
    fold used; ``grid``: the mean metric of every grid value over all queries (hindsight); ``fixed``: the
    per-query metric at the fixed value; ``run``: the cross-validated fused run.
    """

    method: str
    normalization: str
    metric: str
    per_query: pd.Series
    chosen: list[Any]  # a float, or (score fusion of several runs) a tuple of weights
    grid: dict[Any, float]
    fixed_param: Any
    fixed: pd.Series
    run: Run

    @property
    def mean(self) -> float:
        return float(self.per_query.mean())

    def summary(self) -> str:
        best = max(self.grid, key=lambda p: self.grid[p])
        name = {"score": "weight", "rrf": "k"}.get(self.method, "weights")
        return (
            f"{self.method} fusion ({self.normalization}), {len(self.chosen)}-fold cross-validated {self.metric}: "
            f"{self.mean:.4f} ({name} per fold: {', '.join(map(_show, self.chosen))}); fixed {name} "
            f"{_show(self.fixed_param)} on the same candidates: {float(self.fixed.mean()):.4f}; best {name} in "
            f"hindsight ({_show(best)}, not a fair figure): {self.grid[best]:.4f}"
        )


def _show(param: Any) -> str:
    """A grid value as the summary prints it: ``0.3``, ``(0.2/0.3/0.5)`` for a weight vector, ``zscore
    (0.2/0.8)`` for a normalization and weights chosen together."""
    if isinstance(param, tuple) and param and isinstance(param[0], str):
        return f"{param[0]} {_show(param[1])}"
    return "(" + "/".join(f"{w:g}" for w in param) + ")" if isinstance(param, tuple) else f"{param:g}"


def _kept(run: Run, keep: int | None) -> Run:
    """``run`` cut to each query's top ``keep`` documents (:func:`~embedrank.math.ranking.top_k`); all of it
    when ``keep`` is None."""
    return run if keep is None else top_k(run, keep)


def cross_validate_fusion(
    run_a: Run,
    run_b: Run,
    qrels: Qrels,
    *,
    method: Literal["score", "rrf"] = "score",
    normalization: Literal["minmax", "zscore"] = "minmax",
    grid: Sequence[float] | None = None,
    fixed: float | None = None,
    folds: int = 5,
    seed: int = 0,
    metric: str = "ndcg@10",
    relevance_level: int = 1,
    keep: int | None = None,
) -> FusionCV:
    """Fuse ``run_a`` and ``run_b`` with the grid value chosen on the other folds (module docstring);
    every judged query counts (a query no run has scores 0). ``fixed`` defaults to 0.5 (score) or 60 (RRF).
    ``keep``: each fused run's top ``keep`` documents per query are kept (default: all)."""
    values = list(grid or (WEIGHTS if method == "score" else RRF_KS))
    fixed = fixed if fixed is not None else (0.5 if method == "score" else 60)
    runs = {
        p: _kept(fuse(run_a, run_b, method=method, param=p, normalization=normalization), keep)
        for p in {*values, fixed}
    }
    return _choose_by_folds(runs, values, fixed, qrels, method, normalization, folds, seed, metric, relevance_level)


def simplex(parts: int, step: float = 0.1) -> list[tuple[float, ...]]:
    """Every weight vector of ``parts`` non-negative multiples of ``step`` that sum to 1, in lexicographic order.

    >>> simplex(2, 0.5)
    [(0.0, 1.0), (0.5, 0.5), (1.0, 0.0)]
    """
    n = round(1 / step)
    return [
        tuple(round(c * step, 10) for c in combo)
        for combo in itertools.product(range(n + 1), repeat=parts)
        if sum(combo) == n
    ]


def cross_validate_weights(
    runs: Sequence[Run],
    qrels: Qrels,
    *,
    normalization: str | Sequence[str] = "minmax",
    step: float = 0.1,
    folds: int = 5,
    seed: int = 0,
    metric: str = "ndcg@10",
    relevance_level: int = 1,
    keep: int | None = None,
) -> FusionCV:
    """Score fusion of any number of ``runs`` (:func:`~embedrank.math.fusion.weighted_fusion`) with the weight
    vector chosen on the other folds among every vector of multiples of ``step`` summing to 1 (:func:`simplex`;
    3 runs at 0.1: 66 vectors); the fixed comparison is equal weights. With several normalizations
    (``("minmax", "zscore")``) each fold chooses the normalization and the weights together, the grid
    values being ``(normalization, weights)``; the fixed comparison uses the first normalization. ``keep``:
    each fused run's top ``keep`` documents per query are kept (default: all; fusing deep runs, keeping them
    all would hold every grid value's union of the runs)."""
    weights = simplex(len(runs), step)
    equal = tuple([1.0 / len(runs)] * len(runs))

    def fused_run(w: tuple[float, ...], norm: Any) -> Run:
        return _kept(weighted_fusion(runs, w, normalization=norm), keep)

    if isinstance(normalization, str):
        norm: Any = normalization  # "minmax" or "zscore" (weighted_fusion refuses others)
        by_weights: dict[Any, Run] = {p: fused_run(p, norm) for p in {*weights, equal}}
        return _choose_by_folds(
            by_weights, weights, equal, qrels, "weighted", normalization, folds, seed, metric, relevance_level
        )
    norms = list(dict.fromkeys(normalization))
    values = [(n, w) for n in norms for w in weights]
    fixed = (norms[0], equal)
    fused: dict[Any, Run] = {(n, w): fused_run(w, n) for n, w in {*values, fixed}}
    label = " or ".join(norms) + ", chosen per fold"
    return _choose_by_folds(fused, values, fixed, qrels, "weighted", label, folds, seed, metric, relevance_level)


def _choose_by_folds(
    runs: dict[Any, Run],
    values: list[Any],
    fixed: Any,
    qrels: Qrels,
    method: str,
    normalization: str,
    folds: int,
    seed: int,
    metric: str,
    relevance_level: int,
) -> FusionCV:
    """Each fold fused with the first of ``values`` (keys of ``runs``) best on the other folds."""
    (name,), ks = parse_measures([metric])
    scores = {
        p: evaluate_per_query(qrels, run, ks, relevance_level=relevance_level, queries="qrels")[name]
        for p, run in runs.items()
    }
    qids = list(scores[values[0]].index)
    assignment = pd.Series(fold_of(qids, folds, seed)).reindex(qids)
    table = pd.DataFrame({i: scores[p] for i, p in enumerate(values)})  # (queries, grid)
    per_query = pd.Series(0.0, index=table.index, name=name)
    chosen: list[Any] = []
    run: Run = {}
    for fold in range(folds):
        inside = (assignment == fold).to_numpy()
        means = table[~inside].mean().to_numpy()
        best = int(np.flatnonzero(means >= means.max() - 1e-12)[0])  # first best in grid order (ties: float noise)
        chosen.append(values[best])
        per_query[inside] = table.loc[inside, best]
        run.update({q: runs[values[best]].get(q, {}) for q in table.index[inside]})
    return FusionCV(
        method=method,
        normalization=normalization,
        metric=name,
        per_query=per_query,
        chosen=chosen,
        grid={p: float(table[i].mean()) for i, p in enumerate(values)},
        fixed_param=fixed,
        fixed=scores[fixed],
        run=run,
    )
