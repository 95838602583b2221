"""Named types shared by every layer: the BEIR dict format, the one model-output type, and how long documents
are split into windows (:class:`Chunking`, the option every model kind and the service pass on)."""

from __future__ import annotations

import dataclasses
from typing import Literal, TypeAlias

import numpy as np

from embedrank.errors import InvalidInputError

Corpus: TypeAlias = dict[str, dict[str, str]]
"""``{doc_id: {"title": str, "text": str}}``"""

Queries: TypeAlias = dict[str, str]
"""``{query_id: query_text}``"""

Qrels: TypeAlias = dict[str, dict[str, int]]
"""``{query_id: {doc_id: relevance}}``; relevance is graded (0 = judged not relevant)."""

Run: TypeAlias = dict[str, dict[str, float]]
"""``{query_id: {doc_id: score}}``; higher is better."""


@dataclasses.dataclass(frozen=True)
class ModelOutput:
    """What a model gives back for ``N`` inputs, in input order: the values, and what it saw of each input.

    ``values`` is ``(N, D)`` float32 for embeddings, ``(N,)`` (or ``(N, L)`` for several labels) for scores;
    ``token_counts[i]`` is the number of tokens the model processed for input ``i`` (after truncation,
    special tokens included) and ``truncated[i]`` says whether input ``i`` was cut at the maximum length.

    >>> out = ModelOutput(np.zeros((2, 3), dtype=np.float32), [4, 7], [False, True])
    >>> (out.total_tokens, out.truncated_count, out.embeddings.shape)
    (11, 1, (2, 3))
    """

    values: np.ndarray
    token_counts: list[int]
    truncated: list[bool]
    chunked: int = 0  # documents scored as several windows (chunked reranking)

    @property
    def embeddings(self) -> np.ndarray:
        """``values``, named for an encoder's output ``(N, D)``."""
        return self.values

    @property
    def scores(self) -> np.ndarray:
        """``values``, named for a scorer's output ``(N,)``."""
        return self.values

    @property
    def total_tokens(self) -> int:
        return sum(self.token_counts)

    @property
    def truncated_count(self) -> int:
        return sum(self.truncated)


Aggregation = Literal["max", "mean", "first"]
AGGREGATIONS: tuple[str, ...] = ("max", "mean", "first")
"""How a document's window scores become its score (:func:`~embedrank.math.chunks.aggregate_window_scores`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Chunking:
    """How to split long documents (see :mod:`embedrank.models.chunking`). ``window=None``: the model's max length
    minus what the query and special tokens take. ``overlap=None``: 32 tokens, or half the window if less."""

    overlap: int | None = None
    aggregate: Aggregation = "max"
    max_chunks: int | None = None
    max_tokens: int | None = None
    window: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_chunks", "max_tokens", "window"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise InvalidInputError(f"{name} must be a positive integer, got {value!r}", param=name)
        if self.overlap is not None and (not isinstance(self.overlap, int) or self.overlap < 0):
            raise InvalidInputError(f"overlap must be an integer >= 0, got {self.overlap!r}", param="overlap")
        if self.aggregate not in AGGREGATIONS:
            raise InvalidInputError(
                f"aggregate must be one of {list(AGGREGATIONS)}, got {self.aggregate!r}", param="aggregate"
            )
