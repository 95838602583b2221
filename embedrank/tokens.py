"""Tokenization with per-input token counts and truncation flags, shared by encoders and cross-encoders."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from embedrank.errors import InputTooLongError, InvalidInputError


@dataclasses.dataclass(frozen=True)
class Tokenized:
    """A padded batch ready for the model, plus what happened to each input.

    ``features`` hold ``(B, T)`` tensors; ``token_counts[i]`` is the number of tokens the model
    processes for input ``i`` (after truncation, special tokens included); ``truncated[i]`` says
    whether input ``i`` was cut at the maximum length.
    """

    features: dict[str, torch.Tensor]
    token_counts: list[int]
    truncated: list[bool]

    @property
    def padded_tokens(self) -> int:
        """Cost of the batch in padded tokens, ``B * T``."""
        ids = self.features["input_ids"]
        return int(ids.shape[0] * ids.shape[1])


def check_texts(texts: Any, name: str = "texts") -> list[str]:
    """Validate a list of input strings and return it as a list.

    >>> check_texts(["a", ""])
    ['a', '']
    >>> check_texts([])
    Traceback (most recent call last):
    ...
    embedrank.errors.InvalidInputError: texts is empty; pass at least one string
    """
    if isinstance(texts, str):
        raise InvalidInputError(f"{name} must be a list of strings, not a single string; wrap it in a list")
    try:
        items = list(texts)
    except TypeError:
        raise InvalidInputError(f"{name} must be a list of strings, got {type(texts).__name__}") from None
    if not items:
        raise InvalidInputError(f"{name} is empty; pass at least one string")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidInputError(f"{name}[{i}] must be a string, got {type(item).__name__}")
    return items


def tokenize(
    tokenizer: Any,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    max_length: int,
    truncate: bool = True,
) -> Tokenized:
    """Tokenize ``texts`` (or ``(texts[i], pairs[i])`` pairs) the way sentence-transformers does.

    Padding is to the longest input, truncation is ``longest_first`` at ``max_length``. Only the rows
    that come out exactly ``max_length`` long are tokenized again without truncation, to tell whether
    they were cut, so the common case costs one pass.

    Raises:
        InputTooLongError: ``truncate=False`` and some input is longer than ``max_length``.
    """
    args: tuple[Any, ...] = (list(texts),) if pairs is None else (list(texts), list(pairs))
    features = tokenizer(
        *args, padding=True, truncation="longest_first", max_length=max_length, return_tensors="pt"
    )
    counts = features["attention_mask"].sum(dim=1).tolist()
    truncated = [False] * len(counts)
    full_rows = [i for i, c in enumerate(counts) if c >= max_length]
    if full_rows:
        sub = [[args[k][i] for i in full_rows] for k in range(len(args))]
        full = tokenizer(*sub, truncation=False, padding=False, verbose=False)["input_ids"]
        for row, ids in zip(full_rows, full, strict=True):
            truncated[row] = len(ids) > max_length
    if not truncate and any(truncated):
        first = truncated.index(True)
        raise InputTooLongError(
            f"input {first} is longer than the model's maximum of {max_length} tokens "
            f"and truncation was disabled"
        )
    return Tokenized(features=dict(features), token_counts=[int(c) for c in counts], truncated=truncated)


def length_order(texts: Sequence[str]) -> list[int]:
    """Indices that sort ``texts`` longest first (stable), as sentence-transformers batches them.

    >>> length_order(["a", "abc", "ab", "xyz"])
    [1, 3, 2, 0]
    """
    return sorted(range(len(texts)), key=lambda i: -len(texts[i]))
