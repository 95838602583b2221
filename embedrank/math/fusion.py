"""Fusion of two or more runs: reciprocal rank fusion and normalized score fusion. Inputs are never mutated."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.math.ranking import ranked_ids
from embedrank.types import Run


def reciprocal_rank_fusion(runs: Sequence[Run], k: int = 60) -> Run:
    """RRF (Cormack et al., 2009): ``score(d) = sum_r 1 / (k + rank_r(d))`` with ranks from 1 in
    trec_eval order (:func:`~embedrank.math.ranking.ranked_ids`).

    >>> reciprocal_rank_fusion([{"q": {"a": 3.0, "b": 1.0}}, {"q": {"b": 9.0}}], k=1)
    {'q': {'a': 0.5, 'b': 0.8333333333333333}}
    """
    if not runs:
        raise InvalidInputError("reciprocal_rank_fusion needs at least one run")
    fused: Run = {}
    for run in runs:
        for qid, docs in run.items():
            target = fused.setdefault(qid, {})
            for rank, doc_id in enumerate(ranked_ids(docs), start=1):
                target[doc_id] = target.get(doc_id, 0.0) + 1.0 / (k + rank)
    return fused


def normalize_scores(docs: dict[str, float], method: Literal["minmax", "zscore"] = "minmax") -> dict[str, float]:
    """Scale one query's scores: ``minmax`` to [0, 1] (all-equal scores become 1), or ``zscore``.

    >>> normalize_scores({"a": 2.0, "b": 4.0, "c": 3.0})
    {'a': 0.0, 'b': 1.0, 'c': 0.5}
    """
    if not docs:
        return {}
    values = np.fromiter(docs.values(), dtype=np.float64)
    if method == "minmax":
        lo, span = values.min(), values.max() - values.min()
        scaled = (values - lo) / span if span > 0 else np.ones_like(values)
    elif method == "zscore":
        std = values.std()
        scaled = (values - values.mean()) / std if std > 0 else np.zeros_like(values)
    else:
        raise InvalidInputError(f"unknown normalization {method!r}; use 'minmax' or 'zscore'")
    return {d: float(s) for d, s in zip(docs, scaled, strict=True)}


def score_fusion(
    run_a: Run, run_b: Run, *, weight: float = 0.5, normalization: Literal["minmax", "zscore"] = "minmax"
) -> Run:
    """``weight * norm(a) + (1 - weight) * norm(b)``, per query.

    A document missing from one run gets that run's lowest normalized score for the query.

    >>> score_fusion({"q": {"x": 1.0, "y": 0.0}}, {"q": {"y": 5.0, "z": 1.0}}, weight=0.5)
    {'q': {'x': 0.5, 'y': 0.5, 'z': 0.0}}
    """
    if not 0.0 <= weight <= 1.0:
        raise InvalidInputError(f"weight must be in [0, 1], got {weight}")
    return weighted_fusion([run_a, run_b], [weight, 1.0 - weight], normalization=normalization)


def weighted_fusion(
    runs: Sequence[Run], weights: Sequence[float], *, normalization: Literal["minmax", "zscore"] = "minmax"
) -> Run:
    """``sum_r weights[r] * norm(run_r)``, per query, over any number of runs (:func:`score_fusion` is two).

    A document missing from a run gets that run's lowest normalized score for the query.

    >>> weighted_fusion([{"q": {"x": 1.0, "y": 0.0}}, {"q": {"y": 2.0}}, {"q": {"x": 3.0, "z": 1.0}}], [0.5, 0.25, 0.25])
    {'q': {'x': 1.0, 'y': 0.25, 'z': 0.25}}
    """
    if len(runs) != len(weights) or not runs:
        raise InvalidInputError(f"{len(runs)} runs and {len(weights)} weights; give one weight per run")
    if any(w < 0 for w in weights):
        raise InvalidInputError(f"weights must be >= 0, got {list(weights)}")
    fused: Run = {}
    for qid in sorted(set().union(*runs)):
        normed = [normalize_scores(run.get(qid, {}), normalization) for run in runs]
        floors = [min(n.values(), default=0.0) for n in normed]
        docs = sorted(set().union(*normed))
        fused[qid] = {d: sum(w * n.get(d, f) for w, n, f in zip(weights, normed, floors, strict=True)) for d in docs}
    return fused
