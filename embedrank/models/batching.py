"""Batches of the closest lengths: the one loop that orders inputs for padding-light forward passes, used by
every model kind (the serving engine batches across requests on its own, by a token budget).

Sorting by exact token length pads less than sorting by characters, as sentence-transformers does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

PROGRESS_THRESHOLD = 1024  # inputs; above this, encode and score show a progress bar unless told otherwise
TOKENIZE_CHUNK = 8192  # inputs tokenized at once before length-sorted batching
AHEAD_CHUNK = 1024  # inputs per chunk when the next chunks are tokenized while this one computes (a GPU)
# threads tokenizing chunks ahead when the tokenizer runs on one thread (each a chunk at a time; the tokenizer
# releases the GIL): one such thread keeps up with a GPU on short queries but not on passages
AHEAD_WORKERS = max(1, min(8, len(os.sched_getaffinity(0)) // 2)) if hasattr(os, "sched_getaffinity") else 1


def ahead_workers() -> int:
    """Threads that tokenize ahead: one where Hugging Face tokenizers split each batch over the cores themselves
    (``TOKENIZERS_PARALLELISM`` unset or true, their default), :data:`AHEAD_WORKERS` where it is off."""
    # encode on a GPU, MiniLM-L6, 4,096 passages, 16 cores (an H200 machine, 2026-11-28, one-off timing):
    # the tokenizer's own threads with 1 worker 3,798 texts/s, with 4 workers 2,698; the tokenizer on one
    # thread with 4 workers 2,741, with 1 worker 1,552
    setting = os.environ.get("TOKENIZERS_PARALLELISM")
    own_threads = setting is None or setting.strip().lower() not in ("", "off", "false", "f", "no", "n", "0")
    return 1 if own_threads else AHEAD_WORKERS


class HasLength(Protocol):
    @property
    def length(self) -> int: ...


Row = TypeVar("Row", bound=HasLength)


def by_length(lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    """Positions of ``lengths`` in batches of at most ``batch_size``, longest first, ties in input order.

    >>> list(by_length([1, 5, 3, 5], 2))
    [[1, 3], [2, 0]]
    """
    order = np.argsort([-n for n in lengths], kind="stable")
    for start in range(0, len(order), batch_size):
        yield [int(i) for i in order[start : start + batch_size]]


def run_by_length(rows: Sequence[Row], batch_size: int, run: Callable[[list[Row]], Sequence[Any]]) -> list[Any]:
    """``run`` over batches of ``rows`` (anything with a token ``length``) of the closest lengths
    (:func:`by_length`); its values (one per row) back in input order.

    >>> from embedrank.models.tokens import token_rows
    >>> run_by_length(token_rows([{"input_ids": [1]}, {"input_ids": [1, 2, 3]}], [False, False]), 1, lambda b: [b[0].length])
    [1, 3]
    """
    out: list[Any] = [None] * len(rows)
    for positions in by_length([r.length for r in rows], batch_size):
        for i, value in zip(positions, run([rows[i] for i in positions]), strict=True):
            out[i] = value
    return out
