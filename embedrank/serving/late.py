"""What the runners of bge-m3 and ColBERT models share: a model with a transformer ``encoder``, one engine over
its batches of tokenized rows, and the model's window and width."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from embedrank.models.tokens import TokenRow
from embedrank.serving.engine import BatchEngine, EngineConfig
from embedrank.serving.runners import EncoderTokens
from embedrank.types import ModelOutput


@dataclasses.dataclass(frozen=True)
class Held:
    """One item's value kept whole by the engine (arrays of different shapes, such as token vectors, do not
    stack)."""

    value: Any


class RowsBatchModel:
    """Batches of tokenized rows through ``run(rows)`` (one value per row); each value is :class:`Held` so the
    engine stacks a request's values as objects."""

    def __init__(self, run: Callable[[Sequence[TokenRow]], Sequence[Any]], max_seq_length: int) -> None:
        self.run = run
        self.max_seq_length = max_seq_length

    def item_tokens(self, item: TokenRow) -> int:
        return item.length

    def run_batch(self, items: Sequence[TokenRow]) -> ModelOutput:
        values = np.empty(len(items), dtype=object)
        values[:] = [Held(v) for v in self.run(items)]
        return ModelOutput(values, [r.length for r in items], [r.truncated for r in items])


class LateInteractionRunner(EncoderTokens):
    """A late-interaction model (``model.encoder`` its transformer) behind a :class:`BatchEngine` that runs
    :meth:`run_rows` on batches of rows; token counting as any encoder's (:class:`EncoderTokens`)."""

    def __init__(self, model: Any, config: EngineConfig | None = None, **engine_kwargs: Any) -> None:
        self.model = model
        self.encoder = model.encoder
        batches = RowsBatchModel(self.run_rows, self.max_seq_length)
        self.engine: BatchEngine[TokenRow] = BatchEngine(batches, config, **engine_kwargs)

    def run_rows(self, rows: Sequence[TokenRow]) -> Sequence[Any]:
        """One forward pass over ``rows``: a value per row (the subclass's model call)."""
        raise NotImplementedError

    async def submit_rows(self, rows: list[TokenRow], priority: int) -> tuple[list[Any], ModelOutput]:
        """``rows`` through the engine as one job: the values in order, and the job's output (counts, flags)."""
        out = await self.engine.submit(rows, priority=priority)
        return [v.value for v in out.values], out

    @property
    def max_seq_length(self) -> int:
        return int(self.model.max_seq_length)

    @property
    def dimension(self) -> int:
        return int(self.model.dimension)
