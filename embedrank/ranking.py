"""Sorting scores into rankings with deterministic tie-breaking."""

from __future__ import annotations

import dataclasses

import numpy as np

from embedrank.errors import InvalidInputError


@dataclasses.dataclass(frozen=True)
class RankedResult:
    index: int
    score: float


def rank_scores(scores: np.ndarray, top_k: int | None = None) -> list[RankedResult]:
    """Indices of ``scores`` ``(N,)`` sorted by score descending, ties by index ascending.

    >>> [r.index for r in rank_scores(np.array([0.5, 0.9, 0.5, 0.1]), top_k=3)]
    [1, 0, 2]
    """
    if top_k is not None and top_k < 1:
        raise InvalidInputError(f"top_k must be >= 1, got {top_k}")
    values = np.asarray(scores, dtype=np.float64)
    order = np.lexsort((np.arange(len(values)), -values))  # primary: -score, secondary: index
    if top_k is not None:
        order = order[:top_k]
    return [RankedResult(index=int(i), score=float(values[i])) for i in order]
