"""Learned sparse vectors (SPLADE) as pure functions: pooling masked-LM logits into one weight per vocabulary
entry, pruning to the top weights, and scoring by sparse dot products.

Shapes: ``B`` texts, ``T`` tokens, ``V`` the vocabulary size; ``Q`` queries, ``D`` documents. Sparse
matrices are ``scipy.sparse.csr_matrix`` of float32, one row per text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
import torch

from embedrank.errors import InvalidInputError


def splade_max(logits: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """SPLADE's pooling: ``max over tokens of log(1 + ReLU(logits))``, padding left out, as
    sentence-transformers' ``SpladePooling("max")``.

    Args:
        logits: ``(B, T, V)`` masked-LM logits.
        attention_mask: ``(B, T)``, 1 for real tokens.

    Returns:
        ``(B, V)``, every weight >= 0.

    >>> splade_max(torch.tensor([[[1.0, -2.0], [0.0, 3.0], [9.0, 9.0]]]), torch.tensor([[1, 1, 0]])).round(decimals=4)
    tensor([[0.6931, 1.3863]])
    """
    # log(1 + ReLU(x)) never decreases, so the max over tokens can come first: one pass over (B, T, V) instead
    # of four, the same numbers (padding is left out of the max; ReLU gives 0 where every token is negative)
    padding = ~attention_mask.bool().unsqueeze(-1)  # (B, T, 1)
    return torch.log1p(torch.relu(logits.masked_fill(padding, float("-inf")).amax(dim=1)))


def to_csr(weights: np.ndarray, top_k: int | None = None) -> sp.csr_matrix:
    """Dense weights ``(B, V)`` as a sparse matrix of their non-zero entries; with ``top_k``, only each row's
    ``top_k`` largest (ties broken by the lower index).

    >>> to_csr(np.array([[0.0, 0.5, 0.2, 0.9]]), top_k=2).toarray()
    array([[0. , 0.5, 0. , 0.9]], dtype=float32)
    """
    weights = np.asarray(weights, dtype=np.float32)
    if top_k is not None:
        if top_k < 1:
            raise InvalidInputError(f"top_k must be >= 1, got {top_k}", param="top_k")
        if top_k < weights.shape[1]:
            order = np.argsort(-weights, axis=1, kind="stable")[:, top_k:]  # what falls outside the top k
            weights = weights.copy()
            np.put_along_axis(weights, order, 0.0, axis=1)
    return sp.csr_matrix(weights)


def sparse_scores(queries: sp.csr_matrix, documents: sp.csr_matrix) -> np.ndarray:
    """Dot products ``(Q, D)`` of sparse query and document vectors, float32: the exact scorer (the oracle
    any sparse index is checked against).

    >>> q = sp.csr_matrix(np.array([[1.0, 0.0, 2.0]])); d = sp.csr_matrix(np.array([[0.5, 1.0, 1.0], [0.0, 3.0, 0.0]]))
    >>> sparse_scores(q, d)
    array([[2.5, 0. ]], dtype=float32)
    """
    if queries.shape[1] != documents.shape[1]:
        raise InvalidInputError(
            f"queries have {queries.shape[1]} dimensions and documents {documents.shape[1]}", param="documents"
        )
    return np.asarray((queries @ documents.T).toarray(), dtype=np.float32)


def row_pairs(matrix: sp.csr_matrix, row: int) -> tuple[list[int], list[float]]:
    """Row ``row`` as ``(indices, values)``, indices ascending (the sparse shape the service returns).

    >>> row_pairs(sp.csr_matrix(np.array([[0.0, 0.5, 0.0, 0.25]])), 0)
    ([1, 3], [0.5, 0.25])
    """
    start, end = matrix.indptr[row], matrix.indptr[row + 1]
    order = np.argsort(matrix.indices[start:end], kind="stable")
    return matrix.indices[start:end][order].tolist(), matrix.data[start:end][order].astype(float).tolist()


def row_arrays(matrix: sp.csr_matrix) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every row of ``matrix`` ``(N, V)`` as ``(indices, values)`` arrays (int32, float32), indices ascending.

    >>> indices, values = row_arrays(sp.csr_matrix(np.array([[0.0, 0.5, 0.0, 0.25]])))[0]
    >>> indices.tolist(), values.tolist()
    ([1, 3], [0.5, 0.25])
    """
    matrix = matrix.tocsr(copy=True)
    matrix.sort_indices()
    indices, values = matrix.indices.astype(np.int32), matrix.data.astype(np.float32)
    bounds = matrix.indptr
    return [(indices[bounds[i] : bounds[i + 1]], values[bounds[i] : bounds[i + 1]]) for i in range(matrix.shape[0])]


def max_rows(rows: sp.csr_matrix, owners: np.ndarray, n: int) -> sp.csr_matrix:
    """Per owner, the largest value of each column over its rows: the SPLADE vector of a text read window by
    window (the max over tokens that SPLADE pools with, taken over every window's tokens).

    Args:
        rows: ``(W, V)`` non-negative sparse rows (one per window).
        owners: ``(W,)`` the text (``0 <= owner < n``) of each row.
        n: ``N``, the number of texts.

    Returns:
        ``(N, V)`` float32; a text with no row is empty.

    >>> rows = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [3.0, 0.0, 1.0], [0.0, 5.0, 0.0]]))
    >>> max_rows(rows, np.array([0, 0, 2]), 3).toarray()
    array([[3., 0., 2.],
           [0., 0., 0.],
           [0., 5., 0.]], dtype=float32)
    """
    coo = sp.csr_matrix(rows).tocoo()
    owners = np.asarray(owners, dtype=np.int64)
    if owners.shape != (coo.shape[0],):
        raise ValueError(f"{owners.shape[0]} owners for {coo.shape[0]} rows")
    keys = owners[coo.row] * coo.shape[1] + coo.col.astype(np.int64)  # one key per (text, column)
    order = np.lexsort((coo.data, keys))  # by key, then value: each key's largest value last
    keys, data = keys[order], coo.data[order]
    last = np.append(keys[1:] != keys[:-1], True) if keys.size else np.zeros(0, dtype=bool)
    keys, data = keys[last], data[last]
    shape = (n, coo.shape[1])
    return sp.csr_matrix((data.astype(np.float32), (keys // coo.shape[1], keys % coo.shape[1])), shape=shape)


def widened(matrix: sp.csr_matrix, width: int) -> sp.csr_matrix:
    """``matrix`` ``(N, V)`` as ``(N, width)``, ``width >= V``: the same rows, more columns, all empty (the data is
    shared, not copied).

    >>> widened(sp.csr_matrix(np.array([[0.0, 2.0]])), 3).toarray()
    array([[0., 2., 0.]])
    """
    return sp.csr_matrix((matrix.data, matrix.indices, matrix.indptr), shape=(matrix.shape[0], width))


def stacked(parts: Sequence[sp.csr_matrix]) -> sp.csr_matrix:
    """``parts`` ``(N_i, V_i)`` one under the other, each :func:`widened` to the widest one's width:
    ``(sum N_i, max V_i)`` (``(0, 1)`` float32 for no parts).

    >>> stacked([sp.csr_matrix(np.array([[1.0]])), sp.csr_matrix(np.array([[0.0, 2.0]]))]).toarray()
    array([[1., 0.],
           [0., 2.]])
    """
    width = max((p.shape[1] for p in parts), default=1)
    if not parts:
        return sp.csr_matrix((0, width), dtype=np.float32)
    return sp.vstack([widened(p, width) for p in parts], format="csr")


def prune_rows(matrix: sp.csr_matrix, top_k: int) -> sp.csr_matrix:
    """Only each row's ``top_k`` largest values (ties broken by the lower column), as :func:`to_csr` prunes
    dense weights; ``(N, V)`` in, ``(N, V)`` out.

    >>> prune_rows(sp.csr_matrix(np.array([[0.0, 0.5, 0.2, 0.9], [0.3, 0.0, 0.0, 0.0]])), 2).toarray()
    array([[0. , 0.5, 0. , 0.9],
           [0.3, 0. , 0. , 0. ]], dtype=float32)
    """
    if top_k < 1:
        raise InvalidInputError(f"top_k must be >= 1, got {top_k}", param="top_k")
    matrix = sp.csr_matrix(matrix, dtype=np.float32)
    matrix.sort_indices()
    keep = np.zeros(matrix.nnz, dtype=bool)
    for row in range(matrix.shape[0]):
        start, end = matrix.indptr[row], matrix.indptr[row + 1]
        keep[start + np.argsort(-matrix.data[start:end], kind="stable")[:top_k]] = True
    rows = np.repeat(np.arange(matrix.shape[0]), np.diff(matrix.indptr))
    return sp.csr_matrix((matrix.data[keep], (rows[keep], matrix.indices[keep])), shape=matrix.shape)
