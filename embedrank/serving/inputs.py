"""What a runner does to a request's inputs before any of them is queued: find the field a position belongs
to, find the first cut row, cut over-long texts from their start, split long texts into windows (off the
event loop), hold a request to its token budget, and refuse options that do not apply to the model."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from embedrank.errors import InvalidInputError, RequestTooLargeError
from embedrank.models.chunking import Chunking, ChunkPlan
from embedrank.models.prompts import with_prompt
from embedrank.models.tokens import TokenRow


def field_of(index: int, fields: Sequence[tuple[str, int]]) -> tuple[str, int]:
    """Map a position in the submitted items to (request field, index in that field).

    >>> field_of(0, [("query", 1), ("documents", 3)]), field_of(2, [("query", 1), ("documents", 3)])
    (('query', 0), ('documents', 1))
    """
    for name, size in fields:
        if index < size:
            return name, index
        index -= size
    raise IndexError(index)


def first_cut(rows: Sequence[TokenRow], limit: int | None = None) -> int | None:
    """Index of the first of ``rows[:limit]`` cut at the maximum length, or None."""
    return next((i for i, row in enumerate(rows[:limit]) if row.truncated), None)


def cut_starts(
    encoder: Any, texts: list[str], prompt: str, param: str = "input", positions: Sequence[int] | None = None
) -> list[str]:
    """``texts`` with each one too long for ``encoder`` (``prompt`` before it) cut from its start so that its
    last tokens fill the window. A cut can join or split a token at the new start, so the count is checked
    again and the cut moved until the text fits. ``positions``: where the texts stand in the request (for
    errors; default their own order).

    Raises:
        InvalidInputError: the prompt and special tokens alone fill the window.
    """
    limit = encoder.max_seq_length
    counts = encoder.count_tokens(with_prompt(texts, prompt), prompt="")
    long = [i for i, n in enumerate(counts) if n > limit]
    out = list(texts)
    for i, spans in zip(long, encoder.token_offsets([texts[i] for i in long]), strict=True):
        keep = limit - (counts[i] - len(spans))  # the window less the prompt and special tokens
        while True:
            if keep < 1:
                where = positions[i] if positions is not None else i
                raise InvalidInputError(f"the prompt of {param}[{where}] fills the model's window", param=param)
            out[i] = texts[i][spans[-keep][0] :]
            (n,) = encoder.count_tokens([prompt + out[i]], prompt="")
            if n <= limit:
                break
            keep -= n - limit
    return out


async def plan_chunks(
    texts: Sequence[str],
    offsets: Callable[[Sequence[str]], list[list[tuple[int, int]]]],
    window: Callable[[], int],
    chunking: Chunking,
    truncate: bool,
    param: str = "documents",
    budget: int | None = None,
) -> ChunkPlan:
    """:meth:`ChunkPlan.make <embedrank.models.chunking.ChunkPlan.make>` off the event loop (it tokenizes);
    ``window()`` (the model's window beside its prompt or query) is called only when ``chunking`` sets none;
    ``budget``: the most tokens the windows may hold together (refused as soon as they pass it)."""
    return await asyncio.to_thread(
        lambda: ChunkPlan.make(
            texts,
            offsets,
            window=chunking.window or window(),
            chunking=chunking,
            truncate=truncate,
            param=param,
            budget=budget,
        )
    )


def check_budget(rows: Sequence[TokenRow], budget: int | None) -> None:
    """Refuse rows that hold more than ``budget`` tokens together (one request's bound), before any is queued.

    Raises:
        RequestTooLargeError: over the budget.
    """
    total = sum(row.length for row in rows)
    if budget is not None and total > budget:
        raise RequestTooLargeError(f"the request holds {total} tokens; the limit is {budget} per request")
