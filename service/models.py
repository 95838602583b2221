"""The models the service serves: resolution at startup, loading in the background, lookup by id.

Weights load through the core (``Encoder.from_spec`` / ``CrossEncoder.from_spec``), which checks the
model's kind. Tests and demos can hand ``create_app`` already-built models instead (``models=``), such
as the weightless fakes of :mod:`embedrank.testing.fake`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from embedrank.errors import ModelKindError, ModelNotFoundError
from embedrank.registry import resolve
from embedrank.runtime.backends import check_backend
from embedrank.serving.engine import BatchReport, EngineConfig
from embedrank.serving.hosting import HostedModel, runtime_of
from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder, FakeSparseEncoder
from service.decoding import shorten
from service.observability import Metrics
from service.settings import ModelEntry, SettingsError

logger = logging.getLogger("embedrank.service")


@dataclasses.dataclass(kw_only=True)
class ServedModel(HostedModel):
    """A hosted model (:class:`~embedrank.serving.hosting.HostedModel`) with its configuration entry."""

    entry: ModelEntry
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))


class ModelPool:
    """Resolves every configured model at construction (fast, fails loudly), loads weights in :meth:`load`.

    ``preloaded`` maps model ids to models that are already built (anything with a ``spec`` and the
    runner interface); then nothing is resolved or loaded, and ``entries`` only contribute aliases. An
    entry whose path is ``fake:encoder`` or ``fake:cross-encoder`` gets a weightless fake model.
    """

    def __init__(self, entries: tuple[ModelEntry, ...], preloaded: Mapping[str, Any] | None = None) -> None:
        self.models: dict[str, ServedModel] = {}
        self.aliases: dict[str, str] = {}
        self._built = dict(preloaded or {})  # models that need no loading: preloaded ones and fakes
        if preloaded is not None:
            by_id = {e.id: e for e in entries}
            entries = tuple(by_id.get(model_id, ModelEntry(id=model_id)) for model_id in preloaded)
        for entry in entries:
            if entry.id not in self._built and (entry.path or "").startswith("fake:"):
                self._built[entry.id] = fake_model(entry.id, entry.path or "")
            spec = (
                self._built[entry.id].spec
                if entry.id in self._built
                else resolve(entry.path or entry.id, trust_remote_code=entry.trust_remote_code)
            )
            built = self._built.get(entry.id)
            if built is None and spec.kind == "sparse":  # SPLADE: torch unless named, in fp32
                if (entry.precision or "fp32") not in ("fp32", "float32", "auto"):
                    raise SettingsError(
                        f"model {entry.id!r} is a SPLADE model, which runs in fp32 only (torch, openvino or onnx); "
                        f"its entry (or EMBEDRANK_PRECISION) asks for {entry.precision}"
                    )
                named = None if entry.backend in (None, "auto") or spec.static else entry.backend
                backend, precision = check_backend(named or "torch", "fp32")
            elif built is None:
                backend, precision = check_backend(entry.backend, entry.precision)
            else:
                backend, precision = runtime_of(built)[:2]  # type: ignore[assignment]
            if entry.calibration is not None and precision != "int8" and spec.kind == "embedding" and not entry.ranges:
                logger.warning(
                    "model %r: 'calibration' on a model that is not int8 sets its embedding ranges; name that "
                    "file 'ranges' ('calibration' calibrates an int8 runtime only; deprecated, removed next release)",
                    entry.id,
                )
                entry = msgspec.structs.replace(entry, ranges=entry.calibration, calibration=None)
            for field, allowed, what in (
                ("ranges", spec.kind == "embedding", "an embedding model"),
                ("calibration", precision == "int8", "a model with precision int8"),
            ):
                value = getattr(entry, field)
                if value is not None and (not allowed or not Path(value).is_file()):
                    raise SettingsError(
                        f"model {entry.id!r}: {field} {value!r} must be an existing .txt or .jsonl file, for {what}"
                    )
            self.models[entry.id] = ServedModel(entry=entry, spec=spec, backend=backend, precision=precision)
            for alias in entry.aliases:
                self.aliases.setdefault(alias, entry.id)

    def load(self) -> dict[str, Any]:
        """Load the weights (blocking; call from a worker thread), calibrating int8 runtimes on the texts an
        entry's ``calibration`` names and fitting embedding models' int8/uint8 ranges (on the texts its
        ``ranges`` names, else the default sample) before the service is ready. Returns the loaded models by id."""
        loaded: dict[str, Any] = {}
        for model_id, served in self.models.items():
            entry = served.entry
            model = self._built.get(model_id)
            if model is None:
                model = served.load(backend=entry.backend, precision=entry.precision, calibration=entry.calibration)
            served.prepare(model, ranges=entry.ranges, label=model_id)
            loaded[model_id] = model
        return loaded

    def start_engines(
        self,
        loaded: dict[str, Any],
        config: EngineConfig,
        metrics: Metrics,
        on_idle: Callable[[], object] | None = None,
    ) -> None:
        """Wrap each loaded model in its batching engine; must run inside the event loop. ``on_idle`` runs
        in a forward thread after ``config.idle_seconds`` without work (the service returns heap memory)."""
        for model_id, core in loaded.items():
            served = self.models[model_id]

            def observer(route: str | None, model_id: str = model_id) -> Callable[[BatchReport], None]:
                return metrics.batch_observer(model_id if route is None else f"{model_id}:{route}")

            for route, runner in served.start(core, config, on_batch=observer, on_idle=on_idle):
                label = model_id if route is None else f"{model_id}:{route}"  # the metrics' model label
                engine = runner.engine
                metrics.track_engine(
                    label, partial(getattr, engine, "queue_depth"), partial(getattr, engine, "dropped")
                )

    def get(self, model_id: str, capability: str) -> ServedModel:
        served = self.models.get(model_id) or self.models.get(self.aliases.get(model_id, ""))
        if served is None:
            raise ModelNotFoundError(
                f"model {shorten(model_id)!r} is not served here; available: {sorted(self.models)}"
            )
        if capability not in served.capabilities:
            raise ModelKindError(
                f"model {shorten(model_id)!r} is a {served.spec.kind} model and cannot serve {capability}; "
                f"use one of {sorted(m for m, s in self.models.items() if capability in s.capabilities)}"
            )
        return served

    def default(self, capability: str) -> str:
        """The first configured model that serves ``capability`` (for protocols whose bodies name no model);
        for reranking, the first that is not a plain embedding model if there is one (an embedding model
        reranks by cosine); for embeddings, the first dense embedding model if there is one."""
        able = [m for m, served in self.models.items() if capability in served.capabilities]
        kinds = {m: self.models[m].spec.kind for m in able}
        if capability == "rerank":
            preferred = [m for m in able if kinds[m] != "embedding"]
        else:  # a dense embedding model before a ColBERT or SPLADE model (whose vectors are not dense)
            preferred = [m for m in able if kinds[m] == "embedding"]
        if able:
            return (preferred or able)[0]
        raise ModelKindError(f"no served model can serve {capability}; served: {sorted(self.models)}")

    async def drain(self, timeout: float) -> None:
        for served in self.models.values():
            for runner in served.runners():
                await runner.engine.drain(timeout)


FAKE_PROMPTS = {"query": "query: ", "passage": "passage: "}  # e5-style, for fake:encoder-with-prompts


def fake_model(model_id: str, path: str) -> FakeEncoder | FakeCrossEncoder | FakeSparseEncoder:
    """The weightless model a ``fake:encoder``, ``fake:encoder-with-prompts`` (e5-style query and passage
    prompts, to try ``input_type``), ``fake:cross-encoder`` or ``fake:sparse`` path names."""
    if path == "fake:encoder":
        return FakeEncoder(model_id)
    if path == "fake:encoder-with-prompts":
        return FakeEncoder(model_id, prompts=FAKE_PROMPTS)
    if path == "fake:cross-encoder":
        return FakeCrossEncoder(model_id)
    if path == "fake:sparse":
        return FakeSparseEncoder(model_id)
    raise ModelNotFoundError(
        f"unknown fake model {path!r}; use fake:encoder, fake:encoder-with-prompts, fake:cross-encoder or fake:sparse"
    )
