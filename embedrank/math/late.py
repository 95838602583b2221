"""Late interaction and bge-m3's scores: MaxSim over token vectors, lexical matching over token weights, and
the weighted combination bge-m3's authors use.

A multi-vector text is ``(T, D)``: one (normalized) vector per token. MaxSim scores a query against a
document as the mean, over the query's tokens, of each query token's best dot product with any document
token (ColBERT; bge-m3 divides by the query's token count the same way).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import scipy.sparse as sp


def maxsim(query: np.ndarray, document: np.ndarray, *, reduce: Literal["mean", "sum"] = "mean") -> float:
    """MaxSim of one query and one document.

    Args:
        query: ``(Tq, D)`` token vectors of the query.
        document: ``(Td, D)`` token vectors of the document.
        reduce: over the query's tokens, ``"mean"`` (bge-m3) or ``"sum"`` (ColBERT, PyLate).

    Returns:
        ``mean`` (or sum) ``over i of max over j of query[i] . document[j]``; 0.0 for an empty query or document.

    >>> maxsim(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[1.0, 0.0], [0.6, 0.8]]))
    0.9
    >>> maxsim(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[1.0, 0.0], [0.6, 0.8]]), reduce="sum")
    1.8
    """
    if len(query) == 0 or len(document) == 0:
        return 0.0
    best = np.max(np.asarray(query, np.float64) @ np.asarray(document, np.float64).T, axis=1)  # (Tq,)
    return float(best.sum() if reduce == "sum" else best.mean())


def maxsim_scores(
    query: np.ndarray, documents: Sequence[np.ndarray], *, reduce: Literal["mean", "sum"] = "mean"
) -> np.ndarray:
    """:func:`maxsim` of one query ``(Tq, D)`` against each document ``(Td_i, D)``: ``(N,)`` float32."""
    return np.array([maxsim(query, d, reduce=reduce) for d in documents], dtype=np.float32)


def maxsim_stacked(
    query: np.ndarray, vectors: np.ndarray, starts: np.ndarray, *, reduce: Literal["mean", "sum"] = "mean"
) -> np.ndarray:
    """:func:`maxsim` of one query against many documents whose token vectors are stacked in one matrix.

    Args:
        query: ``(Tq, D)`` token vectors of the query.
        vectors: ``(M, D)`` every document's token vectors, one document after another.
        starts: ``(N + 1,)`` int, document ``i``'s rows are ``vectors[starts[i]:starts[i + 1]]``.
        reduce: as :func:`maxsim`.

    Returns:
        ``(N,)`` float32; 0.0 for a document without vectors.

    >>> docs = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    >>> maxsim_stacked(np.array([[1.0, 0.0], [0.0, 1.0]]), docs, np.array([0, 2, 2, 3]), reduce="sum")
    array([1.8, 0. , 1. ], dtype=float32)
    """
    starts = np.asarray(starts, np.int64)
    out = np.zeros(len(starts) - 1, np.float64)
    filled = np.flatnonzero(np.diff(starts) > 0)  # documents with at least one vector
    if len(query) == 0 or len(filled) == 0:
        return out.astype(np.float32)
    sims = np.asarray(query, np.float64) @ np.asarray(vectors, np.float64).T  # (Tq, M)
    best = np.maximum.reduceat(sims, starts[filled], axis=1)  # (Tq, filled): reduceat runs to the next start
    out[filled] = best.sum(axis=0) if reduce == "sum" else best.mean(axis=0)
    return out.astype(np.float32)


def token_max_weights(
    weights: np.ndarray, input_ids: np.ndarray, mask: np.ndarray, vocab_size: int, drop: Sequence[int] = ()
) -> sp.csr_matrix:
    """Each text's largest weight per token id (bge-m3's lexical weights), as a sparse ``(B, V)`` matrix.

    Args:
        weights: ``(B, T)`` one weight per token (bge-m3: ReLU of a linear head on the token states).
        input_ids: ``(B, T)`` token ids.
        mask: ``(B, T)``, 1 for real tokens, 0 for padding.
        vocab_size: ``V``, the width of the result.
        drop: token ids left out (bge-m3 drops CLS, EOS, PAD and UNK).

    Returns:
        ``(B, V)`` float32 CSR; only weights above zero are stored.

    >>> token_max_weights(np.array([[0.5, 0.2, 0.9, 0.3]]), np.array([[0, 5, 5, 2]]), np.array([[1, 1, 1, 0]]), 6, drop=[0]).toarray()
    array([[0. , 0. , 0. , 0. , 0. , 0.9]], dtype=float32)
    """
    weights, input_ids = np.asarray(weights, np.float32), np.asarray(input_ids, np.int64)
    keep = (np.asarray(mask) > 0) & (weights > 0) & ~np.isin(input_ids, np.asarray(list(drop), np.int64))
    rows = np.broadcast_to(np.arange(weights.shape[0])[:, None], weights.shape)[keep]
    cols, vals = input_ids[keep], weights[keep]
    dense = np.zeros((weights.shape[0], vocab_size), np.float32)
    np.maximum.at(dense, (rows, cols), vals)
    return sp.csr_matrix(dense)


def lexical_scores(query: sp.csr_matrix, documents: sp.csr_matrix) -> np.ndarray:
    """bge-m3's lexical matching score of one query row ``(1, V)`` against each document row ``(N, V)``:
    ``sum over shared tokens of w_q * w_d``, ``(N,)`` float32."""
    return np.asarray((documents @ query.T).toarray()).ravel().astype(np.float32)


def weighted_sum(scores: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """``sum_k weights[k] * scores[k] / sum(weights)``: bge-m3's combined score (dense, sparse, multi-vector
    weights; FlagEmbedding's default ``[1, 1, 1]``, its paper's ``[0.4, 0.2, 0.4]``).

    >>> weighted_sum([np.array([1.0]), np.array([0.5]), np.array([0.0])], [0.4, 0.2, 0.4])
    array([0.5])
    """
    if len(scores) != len(weights) or sum(weights) <= 0:
        raise ValueError(f"need one weight per score and a positive sum, got {list(weights)}")
    total = np.zeros(np.shape(scores[0]), np.float64)
    for score, weight in zip(scores, weights, strict=True):
        total += weight * np.asarray(score, np.float64)
    return total / float(sum(weights))
