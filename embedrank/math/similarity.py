"""Normalization, Matryoshka truncation and similarity as pure numpy functions.

Shapes: ``N`` and ``M`` numbers of vectors, ``D`` dimension. Every other module (encoder, scorers,
serving runners, indexes) calls these; none computes a norm or a cosine of its own.
"""

from __future__ import annotations

import numpy as np

from embedrank.errors import InvalidInputError

EPS = 1e-12  # as torch.nn.functional.normalize and sentence-transformers' Normalize


def l2_normalize(x: np.ndarray, eps: float = EPS) -> np.ndarray:
    """Scale each row to unit L2 norm, as ``torch.nn.functional.normalize`` does (``x / max(|x|, eps)``).

    Args:
        x: ``(N, D)`` or ``(D,)``.

    Returns:
        float32 of the same shape; an all-zero row stays zero.

    >>> l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))
    array([[0.6, 0.8],
           [0. , 0. ]], dtype=float32)
    """
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)  # (N, 1)
    return x / np.maximum(norms, eps)


def check_dimensions(dimensions: int | None, full: int, param: str = "dimensions") -> int | None:
    """Validate a Matryoshka target size against the model's dimension ``full``; None keeps ``full``.

    Raises:
        InvalidInputError: ``dimensions`` is not an integer in ``[1, full]`` (named ``param``).

    >>> check_dimensions(64, 384)
    64
    >>> check_dimensions(385, 384)
    Traceback (most recent call last):
    ...
    embedrank.errors.InvalidInputError: dimensions must be between 1 and 384, got 385
    """
    if dimensions is None:
        return None
    if isinstance(dimensions, bool) or not isinstance(dimensions, int | np.integer) or not 1 <= dimensions <= full:
        raise InvalidInputError(f"{param} must be between 1 and {full}, got {dimensions}", param=param)
    return int(dimensions)


def truncate_dims(x: np.ndarray, dimensions: int | None, *, renormalize: bool = True) -> np.ndarray:
    """Keep the first ``dimensions`` components (Matryoshka-style), then L2-renormalize.

    Args:
        x: ``(N, D)``.
        dimensions: target size ``d`` with ``1 <= d <= D``, or None to keep ``D``.
        renormalize: re-apply L2 normalization after truncating.

    Returns:
        ``(N, d)`` float32.

    >>> truncate_dims(np.array([[3.0, 4.0, 12.0]]), 2)
    array([[0.6, 0.8]], dtype=float32)
    """
    x = np.asarray(x, dtype=np.float32)
    d = check_dimensions(dimensions, x.shape[-1])
    if d is None or d == x.shape[-1]:
        return x
    out = x[..., :d]
    return l2_normalize(out) if renormalize else np.ascontiguousarray(out)


def finish_vectors(pooled: np.ndarray, *, normalize: bool, dimensions: int | None = None) -> np.ndarray:
    """Pooled vectors made final: L2-normalized when ``normalize``, then cut to ``dimensions`` (renormalized
    when normalizing).

    Args:
        pooled: ``(N, D)``.
        normalize: whether the model's vectors are L2-normalized.
        dimensions: target size ``d`` with ``1 <= d <= D``, or None to keep ``D``.

    Returns:
        ``(N, d)`` float32, C-contiguous.

    >>> finish_vectors(np.array([[3.0, 4.0, 12.0]]), normalize=True, dimensions=2).round(6)
    array([[0.6, 0.8]], dtype=float32)
    """
    vectors = l2_normalize(pooled) if normalize else pooled
    return np.ascontiguousarray(truncate_dims(vectors, dimensions, renormalize=normalize), dtype=np.float32)


def similarity(a: np.ndarray, b: np.ndarray, metric: str = "cosine") -> np.ndarray:
    """Pairwise similarity matrix between two sets of vectors.

    Args:
        a: ``(N, D)`` or ``(D,)``.
        b: ``(M, D)`` or ``(D,)``.
        metric: ``"cosine"`` or ``"dot"``.

    Returns:
        ``(N, M)`` float32.

    >>> similarity(np.array([[1.0, 0.0]]), np.array([[2.0, 0.0], [0.0, 1.0]]))
    array([[1., 0.]], dtype=float32)
    >>> similarity(np.array([1.0, 1.0]), np.array([2.0, 3.0]), metric="dot")
    array([[5.]], dtype=float32)
    """
    a2 = np.atleast_2d(np.asarray(a, dtype=np.float32))
    b2 = np.atleast_2d(np.asarray(b, dtype=np.float32))
    if a2.shape[1] != b2.shape[1]:
        raise InvalidInputError(f"dimension mismatch: {a2.shape[1]} vs {b2.shape[1]}")
    if metric == "cosine":
        a2, b2 = l2_normalize(a2), l2_normalize(b2)
    elif metric != "dot":
        raise InvalidInputError(f"unknown metric {metric!r}; use 'cosine' or 'dot'")
    return (a2 @ b2.T).astype(np.float32)


def cosine_scores(query: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """Cosine between one query vector ``(D,)`` and each document vector ``(N, D)``; ``(N,)`` float32.

    >>> cosine_scores(np.array([1.0, 0.0]), np.array([[3.0, 0.0], [1.0, 1.0]])).round(4)
    array([1.    , 0.7071], dtype=float32)
    """
    return similarity(query, documents)[0]


def rocchio(
    queries: np.ndarray, feedback: np.ndarray, counts: np.ndarray, *, alpha: float = 1.0, beta: float = 0.5
) -> np.ndarray:
    """Rocchio's update without negatives: ``alpha * q + beta * mean(feedback)``, L2-normalized.

    Args:
        queries: ``(Q, D)`` query vectors.
        feedback: ``(Q, k, D)`` vectors of each query's top documents; only the first ``counts[i]`` of
            row ``i`` count (a query with 0 keeps its own vector).
        counts: ``(Q,)`` int.

    Returns:
        ``(Q, D)`` float32.

    >>> rocchio(np.array([[1.0, 0.0]]), np.array([[[0.0, 1.0], [9.0, 9.0]]]), np.array([1]), beta=1.0).round(4)
    array([[0.7071, 0.7071]], dtype=float32)
    """
    q = np.asarray(queries, dtype=np.float32)
    f = np.asarray(feedback, dtype=np.float32)
    n = np.asarray(counts, dtype=np.int64)
    mask = (np.arange(f.shape[1])[None, :] < n[:, None]).astype(np.float32)  # (Q, k)
    mean = (f * mask[..., None]).sum(axis=1) / np.maximum(n, 1)[:, None]  # (Q, D)
    return l2_normalize(alpha * q + beta * mean)
