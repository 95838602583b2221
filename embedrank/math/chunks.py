"""Per-document scores from per-window scores, for long documents scored window by window."""

from __future__ import annotations

import numpy as np

from embedrank.types import AGGREGATIONS, Aggregation


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

    Examples:
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


def mean_window_vectors(
    vectors: np.ndarray, owners: np.ndarray, n_documents: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """Each document's weighted mean of its windows' vectors (not renormalized).

    Args:
        vectors: ``(W, D)`` one vector per window.
        owners: ``(W,)`` int, the document of each window; every document owns at least one.
        n_documents: ``N``.
        weights: ``(W,)`` non-negative, e.g. each window's token count (vLLM's chunked embeddings weight
            windows by length); None weighs windows equally.

    Returns:
        ``(N, D)`` float32.

    >>> v = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    >>> mean_window_vectors(v, np.array([0, 0, 1]), 2, np.array([3, 1, 5])).tolist()
    [[0.75, 0.25], [2.0, 2.0]]
    """
    vectors = np.asarray(vectors, dtype=np.float64)
    owners = np.asarray(owners, dtype=np.int64)
    w = np.ones(len(owners)) if weights is None else np.asarray(weights, dtype=np.float64)
    if vectors.ndim != 2 or owners.shape != (vectors.shape[0],) or w.shape != owners.shape:
        raise ValueError(f"vectors {vectors.shape}, owners {owners.shape}, weights {w.shape} do not match")
    totals = np.bincount(owners, weights=w, minlength=n_documents)
    if len(totals) != n_documents or (np.bincount(owners, minlength=n_documents) == 0).any():
        raise ValueError("every document must own at least one window, and owners must be < n_documents")
    sums = np.zeros((n_documents, vectors.shape[1]))
    np.add.at(sums, owners, vectors * w[:, None])
    return (sums / np.where(totals > 0, totals, 1)[:, None]).astype(np.float32)


def best_window_rows(
    query_vectors: np.ndarray, window_vectors: np.ndarray, owners: np.ndarray, documents: np.ndarray
) -> np.ndarray:
    """For each row, the window of its document that scores highest (dot product) against the row's query.

    ``query_vectors``: ``(R, D)``, one per row; ``window_vectors``: ``(W, D)``; ``owners``: ``(W,)`` the
    document of each window, non-decreasing (windows in document order, as
    :func:`~embedrank.models.chunking.split_windows` gives them); ``documents``: ``(R,)`` each row's document,
    which must own a window. Returns ``(R,)`` window indices (the first of equal scores).

    >>> q = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    >>> w = np.array([[0.9, 0.1], [0.1, 0.9], [1.0, 0.0]])
    >>> best_window_rows(q, w, np.array([0, 0, 1]), np.array([0, 0, 1])).tolist()
    [0, 1, 2]
    """
    starts = np.searchsorted(owners, documents, side="left")
    ends = np.searchsorted(owners, documents, side="right")
    if np.any(ends <= starts):
        raise ValueError("every row's document must own at least one window")
    return np.array(
        [a + int(np.argmax(window_vectors[a:b] @ q)) for q, a, b in zip(query_vectors, starts, ends, strict=True)],
        dtype=np.int64,
    )
