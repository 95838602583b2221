"""The models one process serves: each configured entry planned at construction (resolved, fast, fails
loudly: :class:`~embedrank.serving.hosting.ModelPlan`), loaded in :meth:`ModelPool.load`, served by
:meth:`ModelPool.start` (each a complete :class:`~embedrank.serving.hosting.HostedModel`), found by id or alias.

The service builds one pool from its settings; a notebook can build the same pool and call the same
:class:`~embedrank.serving.hosting.HostedModel` methods the HTTP handlers call. An entry whose path is one
of :data:`~embedrank.testing.fake.FAKE_PATHS` gets a weightless fake, and ``preloaded`` models (already built,
e.g. fakes) are served as they are, which is how the fast HTTP tests run.

>>> pool = ModelPool((ModelEntry(id="demo", path="fake:encoder", aliases=("d",)),))
>>> pool.plans["demo"].capabilities, pool.default("rerank")
(['embeddings', 'rerank'], 'demo')
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from embedrank.errors import (
    ConfigurationError,
    InvalidInputError,
    ModelKindError,
    ModelLoadError,
    ModelNotFoundError,
    ModelUnavailableError,
    NotReadyError,
    shorten,
)
from embedrank.models.encoder import Encoder
from embedrank.registry import DEFAULT_EMBEDDING_MODEL, resolve
from embedrank.runtime.backends import AUTO, DEFAULT_BACKEND, ElsewhereRuntime, check_backend
from embedrank.runtime.cpus import limit_threads, usable_cpus
from embedrank.runtime.devices import resolve_device
from embedrank.runtime.exports import runs_on, weightless
from embedrank.serving import tracing
from embedrank.serving.engine import BatchEngine, BatchReport, EngineConfig
from embedrank.serving.hosting import ADAPTED_KINDS, KINDS, HostedModel, ModelPlan, runtime_of
from embedrank.serving.remote import Description, EngineFacts, EngineLink, ModelFacts, RemoteEngine
from embedrank.serving.vector_cache import VectorCache
from embedrank.testing.fake import fake_model

logger = logging.getLogger("embedrank.serving")


class ModelEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One served model: an ``EMBEDRANK_MODELS`` entry or a ``[[models]]`` table of the service's TOML file."""

    id: Annotated[str, Meta(min_length=1, description="the name clients send as `model`")]
    path: Annotated[str | None, Meta(description="a local folder or a hub id (default: the id)")] = None
    aliases: Annotated[tuple[str, ...], Meta(description="other names clients may send for this model")] = ()
    ranges: Annotated[
        str | None,
        Meta(
            description="a `.txt` (one text per line) or BEIR `.jsonl` file whose embeddings set the int8/uint8 "
            "ranges of `embedding_types` (default: the packaged sample of 800 English texts)"
        ),
    ] = None
    calibration: Annotated[
        str | None,
        Meta(
            description='such a file to calibrate the int8 runtime of a model with `precision = "int8"` or `"auto"` '
            "(default: the packaged sample)"
        ),
    ] = None
    backend: Annotated[
        str | None, Meta(description="`openvino`, `torch`, `onnx` or `auto` (default: the top-level `backend`)")
    ] = None
    precision: Annotated[
        str | None, Meta(description="`fp32`, `bf16`, `fp16`, `int8` or `auto` (default: the top-level `precision`)")
    ] = None
    device: Annotated[
        str | None,
        Meta(
            description="`cpu`, `cuda`, `cuda:<index>` or `auto`: a GPU where there is one (default: the top-level `device`)"
        ),
    ] = None
    trust_remote_code: Annotated[
        bool, Meta(description="let the model's own Python code run (its config's `auto_map`)")
    ] = False
    adapters: Annotated[
        dict[str, str] | None,
        Meta(
            description="an embedding, cross-encoder or SPLADE model's LoRA adapters by name: PEFT adapter folders "
            "(default: those the model ships in `adapters/<name>/`; `{}` for none); requests choose one with "
            "`adapter` (or an embedding request's `task`)"
        ),
    ] = None


DEFAULT_ENTRIES = (ModelEntry(id=DEFAULT_EMBEDDING_MODEL, aliases=("all-MiniLM-L6-v2",)),)
"""What a pool serves when nothing is configured: the packaged MiniLM, also under its hub name."""


def check_runtime(backend: str | None, precision: str | None) -> None:
    """Refuse a backend name, a precision name or a pair of them that no model runs on (before any loading).

    Raises:
        InvalidInputError: with ``param`` ``backend`` or ``precision``.
    """
    check_backend(backend, precision)


def check_device(device: str | None) -> str:
    """The device ``device`` names on this machine, ``cpu`` or ``cuda:<index>`` (before any loading).

    Raises:
        InvalidInputError: not a device name, or a CUDA device this machine lacks (param ``device``).
    """
    return resolve_device(device)


def compute_threads() -> tuple[int, int]:
    """Lower the compute threads to the CPUs this process may use (a container's quota, not the host's
    cores); call it from the main thread before loading. Returns ``(threads in use, usable CPUs)``."""
    return limit_threads(), usable_cpus()


class ModelPool:
    """Plans every entry at construction (:attr:`plans`), loads weights in :meth:`load`, serves the loaded
    models in :meth:`start` (:attr:`models`, the hosted ones).

    ``preloaded`` maps model ids to models that are already built (anything with a ``spec`` and the
    model interface the runners use); then nothing is resolved or loaded, and ``entries`` only contribute
    aliases. ``cache`` keeps the dense models' computed vectors for the requests that ask for it.

    With ``engine_link`` the pool is a front's: the models' forward passes run in the engine process that
    ``engine_link`` reaches (an :class:`~embedrank.serving.remote.EngineHost` serving the same entries, its pool's
    :meth:`engines` and :meth:`describe`). :meth:`load` then loads each model without its transformer
    (:func:`~embedrank.runtime.exports.weightless`: tokenizers, configurations, small heads) and takes what needs
    the weights from the engine process's :class:`~embedrank.serving.remote.Description` (the measured widths, the
    int8/uint8 range samples' embeddings, the models it could not load); :meth:`start` gives every runner a
    :class:`~embedrank.serving.remote.RemoteEngine`. Tokenizing, truncation, prompts, chunking, normalization and
    the compact types happen here, as in one process; the answers are the same.

    Raises:
        ConfigurationError: an entry asks for what its model cannot do (a SPLADE model in int8, a ranges
            file for a cross-encoder, a file that does not exist).
        ModelNotFoundError: an entry's model cannot be found.
    """

    def __init__(
        self,
        entries: tuple[ModelEntry, ...],
        preloaded: Mapping[str, Any] | None = None,
        *,
        cache: VectorCache | None = None,
        engine_link: EngineLink | None = None,
    ) -> None:
        self.cache = cache
        self.link = engine_link  # a front's: where the forward passes run
        self.description: Description | None = None  # a front's: the engine process's, once loaded
        self.cores: dict[str, Any] = {}  # the loaded models by id, once started
        self.entries: dict[str, ModelEntry] = {}  # the configuration of each planned model
        self.plans: dict[str, ModelPlan] = {}  # every configured model that can still be served, by id
        self.models: dict[str, HostedModel] = {}  # the served ones, once started
        self.aliases: dict[str, str] = {}
        self.failed: dict[str, str] = {}  # a model left out by load(keep_going=True): its id -> why
        self._failed_aliases: dict[str, str] = {}  # an alias of such a model -> its id
        self._stopping = threading.Event()  # set when the pool drains: background work stops
        self._built = dict(preloaded or {})  # models that need no loading: preloaded ones and fakes
        if preloaded is not None:
            by_id = {e.id: e for e in entries}
            entries = tuple(by_id.get(model_id, ModelEntry(id=model_id)) for model_id in preloaded)
        for entry in entries:
            if entry.id not in self._built and (entry.path or "").startswith("fake:"):
                self._built[entry.id] = fake_model(entry.id, entry.path or "")
            self.entries[entry.id], self.plans[entry.id] = self._plan(entry, self._built.get(entry.id))
            for alias in entry.aliases:
                self.aliases.setdefault(alias, entry.id)

    def _plan(self, entry: ModelEntry, built: Any) -> tuple[ModelEntry, ModelPlan]:
        """The entry (as it is to be read) and its model resolved, not loaded, with the backend and precision
        it will run on."""
        spec = (
            built.spec
            if built is not None
            else resolve(entry.path or entry.id, trust_remote_code=entry.trust_remote_code)
        )
        device, asked_backend, asked_precision = "cpu", entry.backend, entry.precision
        if built is None:
            try:  # on a GPU: torch in half precision unless named
                device, asked_backend, asked_precision = runs_on(
                    entry.device, entry.backend, entry.precision, static=spec.static is not None, spec=spec
                )
            except InvalidInputError as exc:
                raise ConfigurationError(f"model {entry.id!r}: {exc}") from None
        declared = KINDS[spec.kind]
        if built is None:
            if declared.backend is not None:  # its kind's own default backend unless one is named (SPLADE: torch)
                if asked_backend in (None, "auto") or spec.static:
                    asked_backend = declared.backend
                asked_precision = entry.precision  # as named: not a GPU's half precision
            only = declared.precisions  # SPLADE: fp32; an image-text model: fp32, bf16 or auto's choice of them
            if only is not None and len(only) == 1 and asked_precision in (None, "auto"):
                asked_precision = only[0]
            where = f" on {device}" if device != "cpu" else ""
            try:
                if only is not None:
                    wanted = check_backend(AUTO, asked_precision)[1]  # its aliases resolved (float32: fp32)
                    if wanted not in (*only, AUTO):
                        runs_in = " or ".join(only) if len(only) > 1 else f"{only[0]} only"
                        article = "an" if spec.kind[0] in "aeiou" else "a"
                        raise ConfigurationError(
                            f"model {entry.id!r} is {article} {spec.kind} model, which runs in {runs_in}; its entry "
                            f"(or EMBEDRANK_PRECISION) asks for {wanted}"
                        )
                backend, precision = check_backend(asked_backend, asked_precision)
            except InvalidInputError as exc:  # e.g. bf16 named for a GPU, where torch runs fp32
                raise ConfigurationError(f"model {entry.id!r}{where}: {exc}") from None
            if only is not None and backend == AUTO:  # the precision alone is chosen
                backend = DEFAULT_BACKEND
        else:
            backend, precision = runtime_of(built)[:2]  # type: ignore[assignment]
        if entry.calibration is not None and precision != "int8" and declared.ranges and not entry.ranges:
            logger.warning(
                "model %r: 'calibration' on a model that is not int8 sets its embedding ranges; name that "
                "file 'ranges' ('calibration' calibrates an int8 runtime only; deprecated, removed next release)",
                entry.id,
            )
            entry = msgspec.structs.replace(entry, ranges=entry.calibration, calibration=None)
        for field, allowed, what in (
            ("ranges", declared.ranges, "an embedding model"),
            ("calibration", precision == "int8", "a model with precision int8"),
        ):
            value = getattr(entry, field)
            if value is not None and (not allowed or not Path(value).is_file()):
                raise ConfigurationError(
                    f"model {entry.id!r}: {field} {value!r} must be an existing .txt or .jsonl file, for {what}"
                )
        if entry.adapters and spec.kind not in ADAPTED_KINDS:
            raise ConfigurationError(
                f"model {entry.id!r}: adapters apply to embedding, cross-encoder and SPLADE models; this is a "
                f"{spec.kind} model"
            )
        plan = ModelPlan(
            spec=spec,
            backend=backend,
            precision=precision,
            device=device,
            aliases=entry.aliases,
            adapters=entry.adapters,
        )
        return entry, plan

    def load(self, *, keep_going: bool = False, description: Description | None = None) -> dict[str, Any]:
        """Load the weights (blocking; call from a worker thread), calibrating int8 runtimes on the texts an
        entry's ``calibration`` names and fitting embedding models' int8/uint8 ranges (on the texts its
        ``ranges`` names, else the default sample) before the models are served. Returns the loaded models by id.

        With ``keep_going``, a model that cannot be loaded is left out and the others are served: it leaves
        :attr:`models`, and :attr:`failed` maps its id to why (asking for it is then a
        :class:`~embedrank.errors.ModelUnavailableError` that says so).

        A front's pool (``engine_link``) needs the engine process's ``description``
        (:meth:`~embedrank.serving.remote.EngineLink.describe`): its models are loaded without their weights, and
        those the engine process could not load are left out as it says.

        Raises:
            ModelLoadError: a model could not be loaded (with ``keep_going``: none could); the message names
                it and gives the cause.
        """
        loaded: dict[str, Any] = {}
        failed: dict[str, str] = {}
        if self.link is not None:
            if description is None:
                raise ValueError("a front's pool loads with the engine process's description")
            self.description = description
            failed.update((m, why) for m, why in description.failed.items() if m in self.plans)
            keep_going = True  # what the engine process served, and only that
        for model_id, plan in self.plans.items():
            if model_id in failed:
                continue
            entry = self.entries[model_id]
            model = self._built.get(model_id)
            try:
                if description is not None and model_id not in description.models:
                    raise ModelLoadError(f"model {model_id!r} is not served by the engine process")
                if model is None:  # a front's models without their weights: the engine process holds them
                    with weightless() if description is not None else contextlib.nullcontext():
                        model = plan.load(
                            backend=entry.backend, precision=entry.precision, calibration=entry.calibration
                        )
                if description is not None:
                    self._adopt(model_id, model, entry, description)
                else:
                    plan.prepare(model, ranges=entry.ranges, label=model_id)
            except Exception as exc:  # each cause has its own type; all mean this entry cannot be served
                where = f" from {plan.spec.path}" if plan.spec.path and plan.spec.path != model_id else ""
                reason = " ".join(str(exc).split()) or "no message"
                error = ModelLoadError(f"model {model_id!r}{where} could not be loaded: {type(exc).__name__}: {reason}")
                if not keep_going:
                    raise error from exc
                logger.error("%s; serving the other models", error)
                failed[model_id] = str(error)
                continue
            loaded[model_id] = model
        if failed and not loaded:
            raise ModelLoadError("; ".join(failed.values()))
        for model_id in failed:
            del self.plans[model_id]
        self.failed.update(failed)
        self._failed_aliases.update((a, m) for a, m in self.aliases.items() if m in failed)
        self.aliases = {a: m for a, m in self.aliases.items() if m not in failed}
        return loaded

    def _adopt(self, model_id: str, model: Any, entry: ModelEntry, description: Description) -> None:
        """What a front's weightless ``model`` takes from the engine process: each part's measured width and the
        embeddings of its int8/uint8 range sample."""
        for label, part in _parts(model_id, model):
            facts = description.engines.get(label)
            if facts is None:
                raise ModelLoadError(f"the engine process serves no engine {label!r}")
            inner = getattr(part, "encoder", part)  # bge-m3's dense vectors are its encoder's
            if isinstance(getattr(inner, "runtime", None), ElsewhereRuntime):  # what runs it there keys its vectors
                elsewhere = ElsewhereRuntime(facts.backend, facts.precision, facts.inference_precision)
                elsewhere.adapters = inner.runtime.adapters
                inner.runtime = elsewhere
            if facts.width is not None and isinstance(inner, Encoder):
                inner.dimension = facts.width
            if facts.range_embeddings is not None:
                if entry.ranges:
                    part.fit_ranges(entry.ranges)
                inner.range_sample.adopt(facts.range_embeddings)

    def _remote_engine(self, label: str) -> RemoteEngine:
        """A front's engine ``label``: the engine process's, through :attr:`link`."""
        assert self.link is not None and self.description is not None
        return RemoteEngine(self.link, label, self.description.engines.get(label))

    def engines(self) -> dict[str, BatchEngine]:
        """Every started engine by label (the model id; ``id:branch`` for a Router model's branches): what an
        :class:`~embedrank.serving.remote.EngineHost` serves to front processes."""
        return {
            _label(model_id, branch): runner.engine
            for model_id, hosted in self.models.items()
            for branch, runner in hosted.started()
        }

    def describe(self) -> Description:
        """What front processes need to serve these models without their weights (:meth:`load` of a front's
        pool): each served model's runtime, each engine's batch bounds, measured width and range sample
        embeddings, and the models that could not be loaded."""
        models: dict[str, ModelFacts] = {}
        engines: dict[str, EngineFacts] = {}
        for model_id, hosted in self.models.items():
            models[model_id] = ModelFacts(
                hosted.backend, hosted.precision, hosted.inference_precision, hosted.fallback_reason, hosted.auto_choice
            )
            parts = dict(_parts(model_id, self.cores[model_id]))
            for branch, runner in hosted.started():
                label = _label(model_id, branch)
                part = parts[label]
                inner = getattr(part, "encoder", part)
                width = inner.dimension if isinstance(inner, Encoder) and not inner.spec.dimension else None
                sample = inner.range_sample.computed if hosted.declared.ranges else None
                engines[label] = EngineFacts(
                    runner.engine.max_batch_tokens,
                    runner.engine.max_batch_size,
                    *runtime_of(inner),
                    width=width,
                    range_embeddings=sample,
                )
        return Description(0, models, engines, dict(self.failed))

    def start(
        self,
        loaded: dict[str, Any],
        config: EngineConfig,
        *,
        on_batch: Callable[[str], Callable[[BatchReport], None] | None] = lambda label: None,
        on_engine: Callable[[str, BatchEngine], object] = lambda label, engine: None,
        on_idle: Callable[[], object] | None = None,
    ) -> None:
        """Serve each loaded model: :meth:`HostedModel.start <embedrank.serving.hosting.HostedModel.start>`
        wraps each of its branches in a runner with its own batching engine; must run inside the event loop.
        Each engine has a label, the model id (``id:branch`` for a Router model's branches): ``on_batch(label)``
        gives its batch observer, ``on_engine(label, engine)`` is told of it once started. ``on_idle`` runs in a
        forward thread after ``config.idle_seconds`` without work (the service returns heap memory then)."""
        for model_id, core in loaded.items():
            hosted = self._hosted(model_id, core, config, on_batch, on_idle)
            self.models[model_id] = hosted
            self.cores[model_id] = core
            for branch, runner in hosted.started():
                on_engine(_label(model_id, branch), runner.engine)
            if self.link is not None:
                continue  # auto's decision is the engine process's to measure again
            choice = getattr(core, "auto_choice", None)
            if getattr(choice, "remeasure", None) is not None:  # a provisional "auto" decision: measured again
                engines = [runner.engine for _, runner in hosted.started()]
                threading.Thread(
                    target=remeasure_when_idle,
                    args=(model_id, choice, engines, config.idle_seconds, self._stopping),
                    name=f"embedrank-auto-{model_id}",
                    daemon=True,
                ).start()

    def _hosted(
        self,
        model_id: str,
        core: Any,
        config: EngineConfig,
        on_batch: Callable[[str], Callable[[BatchReport], None] | None],
        on_idle: Callable[[], object] | None,
    ) -> HostedModel:
        """``core`` served (:meth:`HostedModel.start`); in a front, each runner submitting to the engine process's
        engine of its label."""
        label = functools.partial(_label, model_id)
        remote = self.description
        return HostedModel.start(
            self.plans[model_id],
            core,
            config,
            cache=self.cache,
            on_batch=lambda branch: on_batch(label(branch)),
            on_idle=on_idle,
            engines=(lambda branch: self._remote_engine(label(branch))) if remote is not None else None,
            facts=remote.models[model_id] if remote is not None else None,
        )

    def get(self, model_id: str, capability: str) -> HostedModel:
        """The served model ``model_id`` names (its id or an alias), if it can serve ``capability``.

        Raises:
            ModelNotFoundError: no configured model has that id or alias.
            ModelUnavailableError: the model was configured but could not be loaded; the message says why.
            ModelKindError: the model cannot serve ``capability``; the message lists those that can.
            NotReadyError: the model is configured but not served yet.
        """
        tracing.note_model(model_id)
        found = model_id if model_id in self.plans else self.aliases.get(model_id)
        failed = model_id if model_id in self.failed else self._failed_aliases.get(model_id)
        if found is None and failed is not None:
            raise ModelUnavailableError(self.failed[failed])
        if found is None:
            raise ModelNotFoundError(f"model {shorten(model_id)!r} is not served here; available: {sorted(self.plans)}")
        plan = self.plans[found]
        if capability not in plan.capabilities:
            raise ModelKindError(
                f"model {shorten(model_id)!r} is a {plan.spec.kind} model and cannot serve {capability}; "
                f"use one of {sorted(m for m, p in self.plans.items() if capability in p.capabilities)}"
            )
        hosted = self.models.get(found)
        if hosted is None:
            raise NotReadyError(f"model {found!r} is not served yet: it is still loading")
        return hosted

    def described(self) -> dict[str, ModelPlan]:
        """Every configured model that can still be served, by id: the hosted model once served, else its
        plan (what protocols describe before the models are ready)."""
        return {model_id: self.models.get(model_id, plan) for model_id, plan in self.plans.items()}

    def default(self, capability: str) -> str:
        """The first configured model that serves ``capability`` (for protocols whose bodies name no model);
        for reranking, the first that is not a plain embedding model if there is one (an embedding model
        reranks by cosine); for embeddings, the first dense embedding model if there is one."""
        able = [m for m, plan in self.plans.items() if capability in plan.capabilities]
        preferred = [m for m in able if capability in self.plans[m].declared.preferred_for]
        if able:
            return (preferred or able)[0]
        raise ModelKindError(f"no served model can serve {capability}; served: {sorted(self.plans)}")

    async def drain(self, timeout: float) -> None:
        """Wait until every engine has finished its queued work, at most ``timeout`` seconds each."""
        self._stopping.set()
        for served in self.models.values():
            for runner in served.runners():
                await runner.engine.drain(timeout)


def _label(model_id: str, branch: str | None) -> str:
    """An engine's label: the model id, ``id:branch`` for a Router model's branch other than its default."""
    return model_id if branch is None else f"{model_id}:{branch}"


def _parts(model_id: str, model: Any) -> list[tuple[str, Any]]:
    """``(label, part)`` for each part of a loaded model that a runner serves: the model itself (labelled by its
    id; a Router model's default branch) and a Router model's other branches (``id:branch``)."""
    branches = getattr(model, "branches", None) or {None: model}
    return [(_label(model_id, None if part is model else branch), part) for branch, part in branches.items()]


def remeasure_when_idle(
    model_id: str, choice: Any, engines: Sequence[BatchEngine], idle_seconds: float, stopping: threading.Event
) -> None:
    """Measure a provisional ``auto`` decision again (:attr:`~embedrank.runtime.auto.Choice.remeasure`) once every
    engine of its model has had no work for ``idle_seconds``, until a decision is confident or ``stopping`` is set.
    The new decision replaces the cached one, which the next start loads; the runtime serving now stays."""
    while not stopping.wait(min(5.0, idle_seconds)):
        if min(engine.idle_for() for engine in engines) < idle_seconds:
            continue
        try:
            new = choice.remeasure()
        except Exception:  # the trial could not run now (memory, a file): the provisional decision stands
            logger.exception("%s: auto could not measure its runtimes again", model_id)
            return
        same = (new.backend, new.precision) == (choice.backend, choice.precision)
        logger.warning(
            "%s: auto measured again while idle and chose %s%s",
            model_id,
            new.summary,
            "" if same else f" (this server keeps {choice.backend} {choice.precision} until its next start)",
        )
        if new.remeasure is None:
            return
        choice = new
