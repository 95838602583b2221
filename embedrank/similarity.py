"""Normalization and similarity as pure functions on torch tensors or numpy arrays.

Shapes: ``N`` and ``M`` numbers of vectors, ``D`` dimension.
"""

from __future__ import annotations

import numpy as np
import torch

from embedrank.errors import InvalidInputError


def l2_normalize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Scale each row to unit L2 norm, as ``torch.nn.functional.normalize`` does.

    Args:
        x: ``(N, D)``.

    Returns:
        ``(N, D)``; an all-zero row stays zero.

    >>> l2_normalize(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))
    tensor([[0.6000, 0.8000],
            [0.0000, 0.0000]])
    """
    return torch.nn.functional.normalize(x, p=2.0, dim=-1, eps=eps)


def truncate_dims(x: torch.Tensor, dimensions: int | None, *, renormalize: bool = True) -> torch.Tensor:
    """Keep the first ``dimensions`` components (Matryoshka-style), then L2-renormalize.

    Args:
        x: ``(N, D)``.
        dimensions: target size ``d`` with ``1 <= d <= D``, or None to keep ``D``.
        renormalize: re-apply L2 normalization after truncating.

    Returns:
        ``(N, d)``.

    >>> truncate_dims(torch.tensor([[3.0, 4.0, 12.0]]), 2)
    tensor([[0.6000, 0.8000]])
    """
    if dimensions is None:
        return x
    full = x.shape[-1]
    if not 1 <= dimensions <= full:
        raise InvalidInputError(f"dimensions must be between 1 and {full}, got {dimensions}")
    out = x[..., :dimensions]
    return l2_normalize(out) if renormalize else out


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
        a2 = a2 / np.maximum(np.linalg.norm(a2, axis=1, keepdims=True), 1e-12)
        b2 = b2 / np.maximum(np.linalg.norm(b2, axis=1, keepdims=True), 1e-12)
    elif metric != "dot":
        raise InvalidInputError(f"unknown metric {metric!r}; use 'cosine' or 'dot'")
    return (a2 @ b2.T).astype(np.float32)
