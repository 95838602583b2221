"""The models the service serves: resolution at startup, loading in the background, lookup by id."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from embedrank.cross_encoder import CrossEncoder
from embedrank.encoder import Encoder
from embedrank.engine import AsyncCrossEncoder, AsyncEncoder, EngineConfig
from embedrank.errors import ModelKindError, ModelNotFoundError
from embedrank.registry import ModelSpec, quiet_loading, resolve
from service.observability import Metrics
from service.settings import ModelEntry


@dataclasses.dataclass
class ServedModel:
    entry: ModelEntry
    spec: ModelSpec
    runner: AsyncEncoder | AsyncCrossEncoder | None = None
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    @property
    def capabilities(self) -> list[str]:
        return ["embeddings", "rerank"] if self.spec.kind == "embedding" else ["rerank"]


class ModelPool:
    """Resolves every configured model at construction (fast, fails loudly), loads weights in :meth:`load`."""

    def __init__(self, entries: tuple[ModelEntry, ...]) -> None:
        self.models: dict[str, ServedModel] = {}
        self.aliases: dict[str, str] = {}
        for entry in entries:
            spec = resolve(entry.path or entry.id)
            self.models[entry.id] = ServedModel(entry=entry, spec=spec)
            for alias in entry.aliases:
                self.aliases.setdefault(alias, entry.id)

    def load(self) -> dict[str, Any]:
        """Load the weights (blocking; call from a worker thread). Returns the loaded cores by id."""
        loaded: dict[str, Any] = {}
        for model_id, served in self.models.items():
            path = served.spec.path
            if served.spec.kind == "embedding":
                loaded[model_id] = Encoder(served.spec, *_load_parts(path, "embedding"))
            else:
                loaded[model_id] = CrossEncoder(served.spec, *_load_parts(path, "cross-encoder"))
        return loaded

    def start_engines(self, loaded: dict[str, Any], config: EngineConfig, metrics: Metrics) -> None:
        """Wrap each loaded model in its batching engine; must run inside the event loop."""
        for model_id, core in loaded.items():
            served = self.models[model_id]
            runner_cls = AsyncEncoder if isinstance(core, Encoder) else AsyncCrossEncoder
            served.runner = runner_cls(core, config, on_batch=metrics.batch_observer(model_id))
            served.runner.engine.start()
            engine = served.runner.engine
            metrics.track_engine(model_id, lambda e=engine: e.queue_depth, lambda e=engine: e.stats.dropped)

    def get(self, model_id: str, capability: str) -> ServedModel:
        served = self.models.get(model_id) or self.models.get(self.aliases.get(model_id, ""))
        if served is None:
            raise ModelNotFoundError(f"model '{model_id}' is not served here; available: {sorted(self.models)}")
        if capability not in served.capabilities:
            raise ModelKindError(
                f"model '{model_id}' is a {served.spec.kind} model and cannot serve {capability}; "
                f"use one of {sorted(m for m, s in self.models.items() if capability in s.capabilities)}"
            )
        return served

    async def drain(self, timeout: float) -> None:
        for served in self.models.values():
            if served.runner is not None:
                await served.runner.engine.drain(timeout)


def _load_parts(path: str, kind: str) -> tuple[Any, Any]:
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

    model_cls = AutoModel if kind == "embedding" else AutoModelForSequenceClassification
    with quiet_loading():
        return model_cls.from_pretrained(path), AutoTokenizer.from_pretrained(path)
