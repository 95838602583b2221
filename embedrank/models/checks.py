"""Checks of what a model is called with, before any tokenizing or compute: the texts themselves, a window
size, and the error for an input longer than the model's window when truncation is off."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embedrank.errors import InputTooLongError, InvalidInputError


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


def check_max_seq_length(value: int | None) -> None:
    """Refuse a model window that is not a positive number of tokens (None: the model's own).

    >>> check_max_seq_length(0)
    Traceback (most recent call last):
    embedrank.errors.InvalidInputError: max_seq_length must be a positive integer (None: the model's own), got 0
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidInputError(
            f"max_seq_length must be a positive integer (None: the model's own), got {value!r}", param="max_seq_length"
        )


def too_long_error(
    index: int, max_length: int, *, param: str = "input", tokens: int | None = None
) -> InputTooLongError:
    """The error for ``param[index]`` (``query``: the one query) being longer than ``max_length`` tokens when
    truncation was not allowed."""
    size = f" ({tokens} tokens)" if tokens is not None else ""
    where = param if param == "query" else f"{param}[{index}]"
    return InputTooLongError(
        f"{where} is longer{size} than the model's maximum of {max_length} tokens and truncation was disabled",
        param=param,
        index=index,
    )


def check_truncation(
    truncated: Sequence[bool], max_length: int, truncate: bool, *, offset: int = 0, param: str = "input"
) -> None:
    """Raise :func:`too_long_error` for the first cut input (``param[offset + i]``) when truncation is off."""
    if not truncate and any(truncated):
        raise too_long_error(offset + list(truncated).index(True), max_length, param=param)
