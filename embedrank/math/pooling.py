"""Pooling of token embeddings into one vector per sequence, as pure torch functions.

Shapes: ``B`` batch, ``T`` tokens (padded), ``H`` hidden size.
Every function takes ``token_embeddings`` of shape ``(B, T, H)`` and an ``attention_mask`` of shape
``(B, T)`` with 1 for real tokens and 0 for padding, and returns ``(B, H)``.
"""

from __future__ import annotations

import enum

import torch


class PoolingMode(str, enum.Enum):
    """How token embeddings become one sentence embedding."""

    MEAN = "mean"
    CLS = "cls"
    MAX = "max"
    LAST_TOKEN = "lasttoken"
    MEAN_SQRT_LEN = "mean_sqrt_len"


def mean_pool(token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average of the non-padding token embeddings.

    Args:
        token_embeddings: ``(B, T, H)``.
        attention_mask: ``(B, T)``, 1 for tokens, 0 for padding.

    Returns:
        ``(B, H)``. A row whose mask is all zero gives zeros (the sum is divided by ``max(count, 1e-9)``).

    >>> x = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    >>> mean_pool(x, torch.tensor([[1, 1, 0]]))
    tensor([[2., 3.]])
    """
    mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)  # (B, T, 1)
    summed = (token_embeddings * mask).sum(dim=1)  # (B, H)
    counts = mask.sum(dim=1).clamp(min=1e-9)  # (B, 1)
    return summed / counts


def mean_sqrt_len_pool(token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Sum of the non-padding token embeddings divided by the square root of their count.

    >>> x = torch.tensor([[[2.0], [2.0], [2.0], [2.0], [9.0]]])
    >>> mean_sqrt_len_pool(x, torch.tensor([[1, 1, 1, 1, 0]]))
    tensor([[4.]])
    """
    mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)  # (B, T, 1)
    summed = (token_embeddings * mask).sum(dim=1)  # (B, H)
    return summed / torch.sqrt(mask.sum(dim=1).clamp(min=1e-9))


def cls_pool(token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Embedding of the first token (``[CLS]``), assuming right padding.

    >>> x = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [0.0, 0.0]]])
    >>> cls_pool(x, torch.tensor([[1, 1], [1, 0]]))
    tensor([[1., 2.],
            [5., 6.]])
    """
    del attention_mask  # the first position is a real token under right padding
    return token_embeddings[:, 0]


def max_pool(token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum over the non-padding tokens; padding never wins.

    >>> x = torch.tensor([[[1.0, -5.0], [-2.0, -1.0], [50.0, 50.0]]])
    >>> max_pool(x, torch.tensor([[1, 1, 0]]))
    tensor([[ 1., -1.]])
    """
    mask = attention_mask.unsqueeze(-1).bool()  # (B, T, 1)
    filled = token_embeddings.masked_fill(~mask, torch.finfo(token_embeddings.dtype).min)
    return filled.max(dim=1).values


def last_token_pool(token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Embedding of the last non-padding token of each row; works for left and right padding.

    >>> x = torch.tensor([[[1.0], [2.0], [3.0]], [[4.0], [5.0], [6.0]]])
    >>> last_token_pool(x, torch.tensor([[1, 1, 0], [0, 1, 1]]))
    tensor([[2.],
            [6.]])
    """
    batch, seq_len = attention_mask.shape
    # Index of the last 1 in each row: position of the max of (mask * position), ties impossible.
    positions = torch.arange(seq_len, device=attention_mask.device).expand(batch, seq_len)  # (B, T)
    last = (positions * attention_mask.long()).argmax(dim=1)  # (B,)
    return token_embeddings[torch.arange(batch, device=token_embeddings.device), last]


def exclude_leading(attention_mask: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """A copy of ``attention_mask`` ``(B, T)`` with the first ``counts[i]`` real tokens of row ``i`` masked
    out, for left and right padding alike: pooling then leaves a prompt out (sentence-transformers'
    ``include_prompt=False``), while the model still saw it.

    >>> exclude_leading(torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]]), torch.tensor([2, 1]))
    tensor([[0, 0, 1, 0],
            [0, 0, 1, 1]])
    """
    first = attention_mask.to(torch.int32).argmax(dim=1)  # (B,): left padding before the first real token
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device).unsqueeze(0)  # (1, T)
    return attention_mask.masked_fill(positions < (first + counts.to(first.device)).unsqueeze(1), 0)


_POOLERS = {
    PoolingMode.MEAN: mean_pool,
    PoolingMode.CLS: cls_pool,
    PoolingMode.MAX: max_pool,
    PoolingMode.LAST_TOKEN: last_token_pool,
    PoolingMode.MEAN_SQRT_LEN: mean_sqrt_len_pool,
}


def pool(token_embeddings: torch.Tensor, attention_mask: torch.Tensor, mode: PoolingMode | str) -> torch.Tensor:
    """Dispatch to the pooling function named by ``mode``; ``(B, T, H), (B, T) -> (B, H)``.

    >>> pool(torch.ones(1, 2, 3), torch.ones(1, 2), "mean").shape
    torch.Size([1, 3])
    """
    return _POOLERS[PoolingMode(mode)](token_embeddings, attention_mask)
