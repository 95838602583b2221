"""Per-document scores from per-window scores, for long documents scored window by window."""

from __future__ import annotations

from typing import Literal

import numpy as np

Aggregation = Literal["max", "mean", "first"]
AGGREGATIONS: tuple[str, ...] = ("max", "mean", "first")


def aggregate_window_scores(
    scores: np.ndarray, owners: np.ndarray, n_documents: int, how: Aggregation = "max"
) -> np.ndarray:
    """Combine the scores of each document's windows into one score per document.

    Args:
        scores: ``(W,)`` one score per window.
        owners: ``(W,)`` int, the document each window belongs to (``0 <= owner < n_documents``); a
            document's windows appear in text order.
        n_documents: ``N``; every document must own at least one window.
        how: ``max`` (the best window: where the relevant passage is), ``mean``, or ``first`` (the
            opening window only: what truncation would score).

    Returns:
        ``(N,)`` float32.

    >>> s, o = np.array([0.1, 0.9, 0.3, 0.5]), np.array([0, 0, 1, 2])
    >>> [aggregate_window_scores(s, o, 3, how).astype(float).round(3).tolist() for how in ("max", "mean", "first")]
    [[0.9, 0.3, 0.5], [0.5, 0.3, 0.5], [0.1, 0.3, 0.5]]
    """
    scores = np.asarray(scores, dtype=np.float64)
    owners = np.asarray(owners, dtype=np.int64)
    if scores.shape != owners.shape or scores.ndim != 1:
        raise ValueError(f"scores {scores.shape} and owners {owners.shape} must be the same 1-d shape")
    counts = np.bincount(owners, minlength=n_documents)
    if len(counts) != n_documents or (counts == 0).any():
        raise ValueError("every document must own at least one window, and owners must be < n_documents")
    if how == "max":
        out = np.full(n_documents, -np.inf)
        np.maximum.at(out, owners, scores)
    elif how == "mean":
        out = np.bincount(owners, weights=scores, minlength=n_documents) / counts
    elif how == "first":
        first = np.unique(owners, return_index=True)[1]  # index of each document's first window
        out = scores[first]
    else:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {how!r}")
    return out.astype(np.float32)
