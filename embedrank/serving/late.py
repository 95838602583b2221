"""What the runners of bge-m3 and ColBERT models share: a model with a transformer ``encoder``, one engine over
the model's batches, and the model's window and width."""

from __future__ import annotations

from typing import Any, ClassVar

from embedrank.models.tokens import TokenRow
from embedrank.serving.engine import BatchEngine, EngineConfig
from embedrank.serving.runners import EncoderTokens


class LateInteractionRunner(EncoderTokens):
    """A late-interaction model (``model.encoder`` its transformer) behind a :class:`BatchEngine` that runs
    ``batch_model(model)``'s batches; token counting as any encoder's (:class:`EncoderTokens`)."""

    batch_model: ClassVar[type]

    def __init__(self, model: Any, config: EngineConfig | None = None, **engine_kwargs: Any) -> None:
        self.model = model
        self.encoder = model.encoder
        self.engine: BatchEngine[TokenRow] = BatchEngine(self.batch_model(model), config, **engine_kwargs)

    @property
    def max_seq_length(self) -> int:
        return int(self.model.max_seq_length)

    @property
    def dimension(self) -> int:
        return int(self.model.dimension)
