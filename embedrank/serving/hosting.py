"""A hosted model: a loaded model's runners (one batching engine each, one per Router branch) and what its
kind can do, declared in one table. A request's prompt and branch are resolved here, once
(:meth:`HostedModel.resolve`), for every protocol that serves the model, and in a notebook as in the service.

A model is planned (:class:`ModelPlan`: what it is and where it will run), loaded, then served
(:meth:`HostedModel.start`, which builds the hosted model complete, runners included).

>>> from embedrank.testing.fake import FakeEncoder
>>> plan = ModelPlan(spec=FakeEncoder("m", prompts={"query": "query: "}).spec)
>>> plan.capabilities, plan.outputs
(['embeddings', 'rerank'], ['dense'])
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, cast

import numpy as np
import scipy.sparse as sp

from embedrank.errors import InvalidInputError, OutputNotAvailableError
from embedrank.math.quantization import quantize
from embedrank.math.ranking import RankedResult, rank_scores
from embedrank.math.sparse import row_arrays, row_pairs
from embedrank.models.adapters import adapter_for, adapter_prompt, role_of_task, role_tasks
from embedrank.models.colbert import ColBERTEncoder
from embedrank.models.cross_encoder import CrossEncoder
from embedrank.models.encoder import Encoder
from embedrank.models.image_text import ImageTextEncoder
from embedrank.models.m3 import M3Encoder
from embedrank.models.prompts import request_prompt
from embedrank.models.router import BranchTable, pick_branch, task_of
from embedrank.models.signature import EmbeddingSignature
from embedrank.models.sparse import SparseEncoder
from embedrank.models.tokens import TokenSpan
from embedrank.registry import ModelSpec
from embedrank.runtime.devices import GPU_MAX_BATCH_TOKENS as GPU_MAX_BATCH_TOKENS  # the settings' reference names it
from embedrank.runtime.devices import gpu_batch_tokens
from embedrank.runtime.lora import find_adapters
from embedrank.serving import tracing
from embedrank.serving.colbert import AsyncColBERTEncoder
from embedrank.serving.engine import CPU_BATCH_SIZE, CPU_BATCH_TOKENS, BatchEngine, BatchReport, EngineConfig
from embedrank.serving.image_text import AsyncImageTextEncoder, ImageInput
from embedrank.serving.m3 import AsyncM3Encoder
from embedrank.serving.options import (
    EMBED_DEFAULTS,
    OPENAI_FIELDS,
    RERANK_DEFAULTS,
    EmbedOptions,
    RequestFields,
    RerankOptions,
)
from embedrank.serving.remote import ModelFacts, RemoteEngine
from embedrank.serving.runners import AsyncCrossEncoder, AsyncEncoder
from embedrank.serving.sparse import AsyncSparseEncoder
from embedrank.serving.vector_cache import VectorCache
from embedrank.types import ModelOutput

logger = logging.getLogger("embedrank.serving")


class Runner(Protocol):
    """What every runner has: a batching engine (started, drained, observed) and a window."""

    engine: BatchEngine[Any]

    @property
    def max_seq_length(self) -> int: ...


class RerankRunner(Runner, Protocol):
    """A runner that scores documents against a query (every kind that declares ``rerank``) with every option
    of the call (:class:`~embedrank.serving.options.RerankOptions`)."""

    async def rerank(
        self, query: str, documents: Sequence[str], options: RerankOptions = RERANK_DEFAULTS
    ) -> ModelOutput: ...


class EmbeddingRunner(Runner, Protocol):
    """A runner that embeds texts (every kind that declares ``embeddings``) with every option of the call
    (:class:`~embedrank.serving.options.EmbedOptions`) and the prompt :meth:`HostedModel.resolve` chose. A
    kind's runner may take more keywords than these (ColBERT's ``query``)."""

    async def embed(self, texts: Sequence[str], options: EmbedOptions = EMBED_DEFAULTS, *, prompt: str = "") -> Any: ...

    async def count(
        self, texts: Sequence[str], *, prompt: str = "", return_tokens: bool = False
    ) -> tuple[list[int], list[list[str]] | None]: ...

    async def token_spans(
        self, texts: Sequence[str], *, prompt: str = "", add_special_tokens: bool = True
    ) -> list[list[TokenSpan]]: ...

    async def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]: ...


class DenseRunner(EmbeddingRunner, Protocol):
    """An embedding runner with dense vectors, whose compact types need int8/uint8 ranges."""

    async def quantization_ranges(self, dimensions: int | None = None) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class Kind:
    """What one kind of model declares: what it can be asked for (``embeddings``, ``rerank``, ``sparse``), the
    vectors it gives (``dense``, ``sparse``, ``multivector``), how it scores a query against documents, the
    runner that serves it and the core class that loads it; the backend it runs when none is named (None:
    the library's default, chosen as the model loads) and the precisions it runs in (None: any its backend
    runs; one precision: that one, whatever ``auto`` or a GPU would choose), whether int8/uint8 ranges are
    fitted for its dense vectors (and a ``ranges`` file may be named), whether its dense vectors may come from
    the vector cache, what it is preferred for when a request names no model, how TEI's ``/info`` describes it,
    and the inputs it embeds (``text``, ``image``)."""

    capabilities: tuple[str, ...]
    outputs: tuple[str, ...]
    scorer: str | None
    runner: type
    loader: type
    backend: str | None = None  # None: the library's default, resolved as the model loads
    precisions: tuple[str, ...] | None = None  # None: any its backend runs
    ranges: bool = False
    cached: bool = False
    preferred_for: tuple[str, ...] = ()
    tei_type: Literal["embedding", "reranker"] = "embedding"
    tei_pooling: str | None = None  # None: the model's own pooling
    inputs: tuple[str, ...] = ("text",)  # what it embeds: text, image


# the one table the protocols consult, a row per kind
KINDS: dict[str, Kind] = {
    "embedding": Kind(  # reranks by cosine
        ("embeddings", "rerank"),
        ("dense",),
        "bi-encoder",
        AsyncEncoder,
        Encoder,
        ranges=True,
        cached=True,
        preferred_for=("embeddings",),
    ),
    "multi-vector": Kind(
        ("embeddings", "rerank"),
        ("multivector",),
        "colbert",
        AsyncColBERTEncoder,
        ColBERTEncoder,
        preferred_for=("rerank",),
        tei_type="reranker",
    ),
    "sparse": Kind(  # SPLADE
        ("embeddings", "sparse"),
        ("sparse",),
        None,
        AsyncSparseEncoder,
        SparseEncoder,
        backend="torch",
        precisions=("fp32",),
        cached=True,
        tei_pooling="splade",
    ),
    "m3": Kind(
        ("embeddings", "rerank", "sparse"),
        ("dense", "sparse", "multivector"),
        "bge-m3",
        AsyncM3Encoder,
        M3Encoder,
        ranges=True,
        preferred_for=("embeddings",),
    ),
    "image-text": Kind(  # CLIP, SigLIP: texts and images into one space
        ("embeddings",),
        ("dense",),
        None,
        AsyncImageTextEncoder,
        ImageTextEncoder,
        inputs=("text", "image"),
        precisions=("fp32", "bf16"),
    ),
    "cross-encoder": Kind(  # LLM rerankers too
        ("rerank",),
        (),
        "cross-encoder",
        AsyncCrossEncoder,
        CrossEncoder,
        preferred_for=("rerank",),
        tei_type="reranker",
    ),
}
ADAPTED_KINDS = ("embedding", "cross-encoder", "sparse")
"""The kinds whose models run LoRA adapters (a request's ``adapter`` picks one)."""


def runtime_of(model: Any) -> tuple[str, str, str]:
    """``(backend, precision, inference_precision)`` of a loaded model; a fake reports backend ``fake``."""
    runtime = getattr(model, "runtime", None)
    if runtime is None:
        return "fake", "fp32", "f32"
    return runtime.backend, runtime.precision, runtime.inference_precision


SparseRow = tuple[list[int], list[float]]
"""One text's sparse vector: its non-zero weights as ``(indices, values)``, indices ascending."""


@dataclasses.dataclass(frozen=True)
class Embedded:
    """What :meth:`HostedModel.embed` and :meth:`HostedModel.sparse` give: the runner's output (vectors,
    token counts, and a bge-m3's, ColBERT's or SPLADE's own outputs), each compact type asked for, ``(N, D')``
    by type name, and the sparse vectors ``(N, V)`` when ``sparse`` was asked for (:attr:`sparse_matrix`; each
    text's as lists, :attr:`sparse`, made when a response reads them)."""

    output: Any
    compact: dict[str, np.ndarray]
    sparse_matrix: sp.csr_matrix | None = None

    @functools.cached_property
    def sparse(self) -> list[SparseRow] | None:
        """Each text's sparse vector as ``(indices, values)`` lists (the shape responses carry)."""
        return None if self.sparse_matrix is None else sparse_rows(self.sparse_matrix)

    def sparse_arrays(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each text's sparse vector as ``(indices, values)`` arrays (int32, float32), indices ascending, straight
        from :attr:`sparse_matrix` (none when it was not asked for)."""
        return [] if self.sparse_matrix is None else row_arrays(self.sparse_matrix)


@dataclasses.dataclass(frozen=True)
class Reranked:
    """What :meth:`HostedModel.rerank` gives: the runner's output (scores ``(N,)`` in input order, token
    counts) and the ranking, best first, cut to ``top_n``."""

    output: ModelOutput
    ranking: list[RankedResult]


def sparse_rows(matrix: sp.csr_matrix) -> list[SparseRow]:
    """Every row of ``matrix`` ``(N, V)`` as ``(indices, values)``, indices ascending."""
    return [row_pairs(matrix, i) for i in range(matrix.shape[0])]


@dataclasses.dataclass(frozen=True)
class Resolved:
    """What a request's ``input_type`` / ``prompt_name`` select: the branch's task, the runner of that branch,
    and the prompt to put before each text."""

    task: str | None
    runner: Runner
    prompt: str
    adapter: str | None = None  # the LoRA adapter its texts run with (None: the base model)


GPU_BATCH_SIZE = 2048  # EngineConfig.max_batch_size for a model on a GPU when the config leaves it unset
# forward threads for a model on a GPU: while one waits for its batch's result, the other collates and queues
# the next batch behind it on the GPU, so the GPU does not idle between batches
GPU_WORKERS = 2


def engine_config_on(config: EngineConfig, model: Any, device: str) -> EngineConfig:
    """``config`` with what it leaves unset filled in for a ``model`` on a GPU: the padded tokens a quarter of
    the GPU's free memory holds (:func:`~embedrank.runtime.devices.gpu_batch_tokens`), :data:`GPU_BATCH_SIZE`
    items and :data:`GPU_WORKERS` forward threads. On the CPU, ``config`` as it is (the engine's defaults
    apply)."""
    if not device.startswith("cuda"):
        return config
    tokens = config.max_batch_tokens
    runtime = getattr(model, "runtime", None)
    module = getattr(runtime, "module", None) or getattr(model, "model", None)
    if tokens is None and module is not None:
        tokens = gpu_batch_tokens(module, int(getattr(model, "max_seq_length", 512)))
    return dataclasses.replace(
        config,
        max_batch_tokens=tokens,
        max_batch_size=config.max_batch_size or GPU_BATCH_SIZE,
        workers=config.workers or GPU_WORKERS,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelPlan:
    """A model as configured, decided before any loading: its spec, the backend and precision it is to run
    on, its device, the other names clients may send for it and when it was configured. What its kind can do
    comes from :data:`KINDS`. :meth:`load` loads it; :meth:`HostedModel.start` serves the loaded model."""

    spec: ModelSpec
    backend: str = "torch"  # what runs the transformer (embedrank.runtime.backends); "fake" for fakes
    precision: str = "fp32"
    device: str = "cpu"  # where the model runs: "cpu" or "cuda:<index>" (embedrank.runtime.devices)
    aliases: tuple[str, ...] = ()
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    # an embedding model's LoRA adapters by name (PEFT folders); None: those it ships (embedrank.models.adapters)
    adapters: dict[str, str] | None = None

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def declared(self) -> Kind:
        """What its kind declares (:data:`KINDS`)."""
        return KINDS[self.kind]

    @property
    def capabilities(self) -> list[str]:
        """What it can be asked for: ``embeddings``, ``rerank``, ``sparse``."""
        return list(self.declared.capabilities)

    @property
    def outputs(self) -> list[str]:
        """The vectors it gives: ``dense``, ``sparse``, ``multivector``."""
        return list(self.declared.outputs)

    @property
    def scorer(self) -> str | None:
        """How it scores documents against a query: ``bi-encoder`` (cosine), ``cross-encoder``, ``colbert``
        (MaxSim), ``bge-m3`` (combined); None for a model that cannot rerank."""
        return self.declared.scorer

    @property
    def served_adapters(self) -> list[str]:
        """The LoRA adapters it will serve, by name (an embedding, cross-encoder or SPLADE model's): its entry's, else
        those its folder ships."""
        if self.kind not in ADAPTED_KINDS:
            return []
        if self.adapters is not None:
            return list(self.adapters)
        return list(find_adapters(self.spec.path))

    def task_names(self) -> list[str]:
        """What an embedding request's ``task`` may name for it: one of :attr:`served_adapters`, or a task of the
        query or document role (which every model takes)."""
        return sorted({*self.served_adapters, *role_tasks()})

    @property
    def batch_bounds(self) -> tuple[int, int]:
        """(padded tokens, items) a forward pass holds at most: the engine's defaults until it is served."""
        return CPU_BATCH_TOKENS, CPU_BATCH_SIZE

    def load(self, *, backend: str | None = None, precision: str | None = None, calibration: str | None = None) -> Any:
        """Load the weights as the core model of this kind (blocking). ``backend`` and ``precision`` are what
        the configuration names (None: the defaults; a model the default backend cannot export then runs on
        torch, and the core logs why); a SPLADE model runs on the backend resolved into :attr:`backend`.
        ``calibration`` names the texts that calibrate an int8 runtime."""
        loader: Any = self.declared.loader
        if self.declared.backend is not None:  # its kind's own default, resolved into this plan (SPLADE: torch)
            backend, precision = self.backend, self.precision
        extra = {"adapters": self.adapters} if self.kind in ADAPTED_KINDS else {}
        return loader.from_spec(
            self.spec, backend=backend, precision=precision, calibration=calibration, device=self.device, **extra
        )

    def prepare(self, model: Any, *, ranges: str | None = None, label: str = "") -> None:
        """Make a loaded (or prebuilt) ``model`` ready to serve: each branch's int8/uint8 embedding ranges
        fitted now (on the texts ``ranges`` names, else the default sample), so that no request pays for them."""
        for part in {id(m): m for m in (getattr(model, "branches", None) or {None: model}).values()}.values():
            if ranges:
                part.fit_ranges(ranges)
            if self.declared.ranges:
                started = time.perf_counter()
                part.quantization_ranges()
                encoder = getattr(part, "encoder", part)  # bge-m3's dense vectors are its encoder's
                read_from = getattr(getattr(encoder, "range_sample", None), "read_from", None)
                if read_from is not None:
                    logger.info("%s: int8/uint8 ranges read from %s", label or self.spec.model_id, read_from)
                else:
                    logger.info(
                        "%s: int8/uint8 ranges fitted in %.1f s",
                        label or self.spec.model_id,
                        time.perf_counter() - started,
                    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostedModel(ModelPlan):
    """A model as it is served, complete from the start (:meth:`start`): its plan, what really runs it, its
    runners (one batching engine each, one per Router branch) and the cache its dense vectors may use."""

    inference_precision: str  # what really computes
    fallback_reason: str | None = None  # why it runs on torch although no backend was named
    auto_choice: str | None = None  # what backend/precision "auto" chose and why
    dimension: int | None = None  # the embedding width (a static model's is measured); None for SPLADE
    runner: Runner | None = None  # the runner of a model without branches
    branch_runners: dict[str, Runner] = dataclasses.field(default_factory=dict)  # a Router model's, by branch
    branch_table: BranchTable | None = None
    cache: VectorCache | None = None  # computed vectors, for the requests that ask (``embed(cached=True)``)
    adapter_names: tuple[str, ...] = ()  # the LoRA adapters it runs (a request's ``adapter`` or ``task`` picks one)

    @property
    def served_adapters(self) -> list[str]:
        """The LoRA adapters it runs, by name."""
        return list(self.adapter_names)

    @classmethod
    def start(
        cls,
        plan: ModelPlan,
        model: Any,
        config: EngineConfig,
        *,
        cache: VectorCache | None = None,
        on_batch: Callable[[str | None], Callable[[BatchReport], None] | None] = lambda branch: None,
        on_idle: Callable[[], object] | None = None,
        engines: Callable[[str | None], RemoteEngine] | None = None,
        facts: ModelFacts | None = None,
    ) -> HostedModel:
        """Serve the loaded (and prepared) ``model`` of ``plan``: each of its branches wrapped in a runner with
        its own batching engine, started; must run inside the event loop. ``on_batch(branch)`` gives each
        engine's batch observer (branch None: a model without branches).

        In a process whose forward passes run elsewhere (``model`` loaded weightless,
        :func:`~embedrank.runtime.exports.weightless`), ``engines(branch)`` gives each runner's engine instead (a
        :class:`~embedrank.serving.remote.RemoteEngine`), and ``facts`` (a
        :class:`~embedrank.serving.remote.ModelFacts`) say what really runs the model there."""
        declared = plan.declared
        runner_cls = declared.runner
        config = engine_config_on(config, model, plan.device) if engines is None else config
        branches = getattr(model, "branches", None) or {None: model}
        runner: Runner | None = None
        branch_runners: dict[str, Runner] = {}
        for branch, part in branches.items():
            started = runner_cls(part, config, on_batch=on_batch(None if part is model else branch), on_idle=on_idle)
            if cache is not None and declared.cached:
                started.cache = cache
                sign = EmbeddingSignature.of if "dense" in declared.outputs else EmbeddingSignature.of_sparse
                signature = sign(part).cache_key()
                started.cache_signature = signature if part is model else f"{signature}|branch={branch}"
            if engines is not None:  # the runner's own engine is never started: the engine process computes
                started.engine = engines(None if part is model else branch)
            started.engine.start()
            if part is model:
                runner = started
            if branch is not None:
                branch_runners[branch] = started
        backend, precision, inference_precision = runtime_of(model)
        choice = getattr(model, "auto_choice", None)
        summary = choice.summary if choice is not None else None
        fallback_reason = getattr(model, "fallback_reason", None)
        if facts is not None:
            backend, precision, inference_precision = facts.backend, facts.precision, facts.inference_precision
            summary, fallback_reason = facts.auto_choice, facts.fallback_reason
        return cls(
            spec=plan.spec,
            backend=backend,
            precision=precision,
            device=plan.device,
            aliases=plan.aliases,
            created=plan.created,
            inference_precision=inference_precision,
            fallback_reason=fallback_reason,
            auto_choice=summary,
            # a SPLADE's width is its vocabulary: the spec says it
            dimension=model.dimension if {"dense", "multivector"} & set(declared.outputs) else None,
            runner=runner,
            branch_runners=branch_runners,
            branch_table=getattr(model, "branch_table", None),
            cache=cache,
            adapters=plan.adapters,
            adapter_names=tuple(getattr(model, "adapters", ()) or ()),
        )

    def started(self) -> list[tuple[str | None, Runner]]:
        """``(branch, runner)`` for every runner, once each (branch None: the model itself, a model without branches
        or a Router model's default branch)."""
        if self.runner is None:
            return list(self.branch_runners.items())
        return [(None, self.runner), *((b, r) for b, r in self.branch_runners.items() if r is not self.runner)]

    def runner_for(self, task: str | None) -> Runner:
        """The runner of ``task``'s branch (:func:`~embedrank.models.router.pick_branch`); the only runner of a
        model without branches."""
        if self.branch_table is None:
            return cast(Runner, self.runner)
        return self.branch_runners[pick_branch(self.branch_table, task)]

    def resolve(
        self,
        *,
        input_type: str | None = None,
        prompt_name: str | None = None,
        task: str | None = None,
        adapter: str | None = None,
        fields: RequestFields = OPENAI_FIELDS,
    ) -> Resolved:
        """The branch, the adapter and the prompt a request selects, decided once: ``input_type`` or
        ``prompt_name`` select the prompt and the branch (:func:`~embedrank.models.router.task_of`); ``adapter``
        names one of :attr:`adapter_names`, else jina's ``task`` or the query and document roles pick one
        (:func:`~embedrank.models.adapters.adapter_for`) with the model's prompt of the adapter's name, unless
        ``prompt_name`` names another (as ``Encoder.encode``'s ``adapter`` and ``task``).

        Raises:
            InvalidInputError: both of ``input_type`` and ``prompt_name`` are given, the input type is unknown, the
                prompt name is not the model's; an adapter the model lacks, or a task that picks none (the message
                lists the model's adapters).
        """
        role = task_of(input_type, prompt_name)
        named_adapter = adapter
        if adapter is not None:
            self._check_adapter(adapter, fields.adapter)
        elif task is not None:
            adapter = adapter_for(self.adapter_names, task)
            role = role_of_task(task) or role
            if adapter is None and (self.adapter_names or role is None):
                raise InvalidInputError(
                    f"unknown task {task!r} for model {self.spec.model_id!r}; {self._adapter_choices()}",
                    param=fields.task,
                )
        else:
            adapter = adapter_for(self.adapter_names, role)
        # an adapter a task or a role picked brings its prompt; one named by the request, the request's prompt
        picked = adapter is not None and named_adapter is None
        own = adapter_prompt(self.spec.prompts, adapter) if picked and prompt_name is None else None
        if own is not None:
            prompt = self.spec.prompts[own]
        else:
            if input_type is None and role is not None and prompt_name is None:  # a task of the query or document role
                input_type = role
            prompt = request_prompt(
                self.spec.prompts, self.spec.default_prompt_name, input_type=input_type, prompt_name=prompt_name
            )
        return Resolved(task=role, runner=self.runner_for(role), prompt=prompt, adapter=adapter)

    def resolve_options(self, options: EmbedOptions) -> Resolved:
        """:meth:`resolve` of an embedding call's options (the names of its request's fields cited in errors)."""
        return self.resolve(
            input_type=options.input_type,
            prompt_name=options.prompt_name,
            task=options.task,
            adapter=options.adapter,
            fields=options.fields,
        )

    def _check_adapter(self, adapter: str, param: str) -> None:
        """Refuse an ``adapter`` the model does not run, listing those it does (``param``: the request's field)."""
        if adapter not in self.adapter_names:
            raise InvalidInputError(
                f"unknown adapter {adapter!r} for model {self.spec.model_id!r}; {self._adapter_choices()}", param=param
            )

    def _adapter_choices(self) -> str:
        if self.adapter_names:
            return f"its adapters: {', '.join(self.adapter_names)}"
        if "embeddings" in self.capabilities:  # a model without adapters still takes a task of a role
            return "it has no adapters (a task of the query or document role selects its prompt)"
        return "it has no adapters"

    async def embed(
        self, texts: Sequence[str | ImageInput], options: EmbedOptions = EMBED_DEFAULTS, *, name: str = ""
    ) -> Embedded:
        """Embed ``texts`` (and images, :class:`~embedrank.serving.image_text.ImageInput`, for a kind that takes
        them) with every option of the call (the prompt and branch resolved once from its
        ``input_type`` or ``prompt_name``), giving each of ``options.types``: ``sparse`` and ``multivector``
        from the models that declare them, and the compact types of
        :func:`~embedrank.math.quantization.quantize` of the dense vectors (``float`` and the integer and binary
        types). ``name`` is the model's name in messages. With ``options.cached``, the dense vectors of texts
        embedded before come from :attr:`cache` (a dense model's, when it has one).

        Raises:
            OutputNotAvailableError: a type the model does not give (the request's ``embedding_types``).
            InvalidInputError: an image for a model that embeds text only.
        """
        label = name or self.spec.model_id
        pictures = [i for i, item in enumerate(texts) if not isinstance(item, str)]  # ImageInput items
        if pictures and "image" not in self.declared.inputs:
            first = cast(ImageInput, texts[pictures[0]])
            raise InvalidInputError(
                f"{first.name} is an image, but model {label!r} embeds text only; send images to an image-text "
                f"model (CLIP, SigLIP: GET /v1/models lists each model's inputs)",
                param=first.field,
            )
        chosen = self.resolve_options(options)
        types = options.types
        asked = set(types)
        outputs = {"sparse", "multivector"} & asked
        has = set(self.outputs) & {"sparse", "multivector"}  # ColBERT and SPLADE: one each and no dense; bge-m3 both
        sole = next(iter(has)) if "dense" not in self.outputs else None
        if outputs - has:
            raise OutputNotAvailableError(
                f"model {label!r} has no {' or '.join(sorted(outputs - has))} output (bge-m3 models have "
                "sparse and multivector, SPLADE models sparse, ColBERT models multivector)",
                param=options.fields.types,
            )
        if sole is not None and (sole not in outputs or asked - {sole, "float"}):
            what = "a ColBERT model" if sole == "multivector" else "a SPLADE model (or use /embed_sparse)"
            raise OutputNotAvailableError(
                f'model {label!r} is {what}: ask for embedding_types ["{sole}"]; compact types do not apply',
                param=options.fields.types,
            )
        prompt = chosen.prompt
        extra: dict[str, Any] = {}
        if sole == "multivector":  # a query's or a document's token vectors, marked by the model's own tokens
            extra["query"] = chosen.task == "query"
            prompt = ""
        runner = cast(DenseRunner, chosen.runner)  # the kind declares embeddings: the pool checked
        if chosen.adapter is not None:  # only a runner of a model with adapters (resolve checked the name)
            extra["adapter"] = chosen.adapter
        tracing.note_operation("embeddings")
        out = await runner.embed(texts, options, prompt=prompt, **extra)  # type: ignore[arg-type]  # images: checked above
        tracing.note_usage(out.total_tokens)
        compact = [t for t in types if t not in outputs]  # a SPLADE's "float" is empty
        if {"int8", "uint8"} & set(compact) and not self.declared.ranges:
            raise OutputNotAvailableError(
                f"model {label!r} has no int8/uint8 ranges (they are fitted for text embedding models); ask for "
                f"float, binary or ubinary",
                param=options.fields.types,
            )
        ranges = None
        if {"int8", "uint8"} & set(compact):
            adapted = {"adapter": chosen.adapter} if chosen.adapter is not None else {}
            ranges = await runner.quantization_ranges(options.dimensions, **adapted)
        return Embedded(
            out,
            {t: quantize(out.embeddings, t, ranges) for t in dict.fromkeys(compact)},
            out.sparse if "sparse" in outputs else None,  # type: ignore[attr-defined]  # SPLADE, bge-m3
        )

    async def rerank(self, query: str, documents: Sequence[str], options: RerankOptions = RERANK_DEFAULTS) -> Reranked:
        """Scores ``(N,)`` of ``documents`` against ``query`` in input order, by the kind's scorer: a
        cross-encoder's, a bi-encoder's cosine (a Router model's query branch embeds the query, its document
        branch the documents), MaxSim, or bge-m3's combined score, and the ``options.top_n`` best (all by
        default), ties by input order. Token counts cover the query (first) and every document."""
        if options.adapter is not None:
            self._check_rerank_adapter(options.adapter)
        extra: dict[str, Any] = {"query_runner": self.runner_for("query")} if self.branch_table else {}
        runner = cast(RerankRunner, self.runner_for("document"))
        tracing.note_operation("rerank")
        out = await runner.rerank(query, documents, options, **extra)
        tracing.note_usage(out.total_tokens)
        return Reranked(out, rank_scores(out.scores, options.top_n))

    def _check_rerank_adapter(self, adapter: str) -> None:
        """A reranking request's ``adapter``: one of a cross-encoder's adapters.

        Raises:
            InvalidInputError: the model reranks by another scorer, or has no adapter of that name (the message
                lists those it has).
        """
        if self.scorer != "cross-encoder":
            raise InvalidInputError(
                f"adapter: model {self.spec.model_id!r} reranks by {self.scorer} similarity, which takes no adapter; "
                "a cross-encoder's adapters score pairs",
                param="adapter",
            )
        self._check_adapter(adapter, "adapter")

    async def sparse(self, texts: Sequence[str], options: EmbedOptions = EMBED_DEFAULTS) -> Embedded:
        """The sparse vectors of a SPLADE or bge-m3 model for ``texts``, with the prompt and branch the request
        asks for (:meth:`resolve`): the output's rows ``(N, V)`` of ``scipy.sparse`` in input order, and each
        as ``(indices, values)``."""
        chosen = self.resolve_options(options)
        tracing.note_operation("embeddings")
        adapted = {"adapter": chosen.adapter} if chosen.adapter is not None else {}
        out = await cast(EmbeddingRunner, chosen.runner).embed(texts, options, prompt=chosen.prompt, **adapted)
        tracing.note_usage(out.total_tokens)
        return Embedded(out, {}, out.sparse)  # SPLADE, bge-m3

    async def count(
        self,
        texts: Sequence[str],
        *,
        input_type: str | None = None,
        prompt_name: str | None = None,
        task: str | None = None,
        adapter: str | None = None,
        return_tokens: bool = False,
    ) -> tuple[list[int], list[list[str]] | None]:
        """Each text's token count as :meth:`embed` would process it (same prompt and branch: :meth:`resolve`),
        untruncated, and its tokens with ``return_tokens``."""
        chosen = self.resolve(input_type=input_type, prompt_name=prompt_name, task=task, adapter=adapter)
        counts, tokens = await cast(EmbeddingRunner, chosen.runner).count(
            texts, prompt=chosen.prompt, return_tokens=return_tokens
        )
        return counts, tokens

    async def token_spans(
        self, texts: Sequence[str], *, prompt_name: str | None = None, add_special_tokens: bool = True
    ) -> list[Any]:
        """Every token of each text (id, text, special, character span), untruncated, after the prompt."""
        chosen = self.resolve(prompt_name=prompt_name)
        return await cast(EmbeddingRunner, chosen.runner).token_spans(
            texts, prompt=chosen.prompt, add_special_tokens=add_special_tokens
        )

    async def token_offsets(
        self, texts: Sequence[str], *, input_type: str | None = None
    ) -> list[list[tuple[int, int]]]:
        """Each text's tokens as character spans in the text, by the tokenizer of the branch ``input_type`` selects:
        special tokens excluded, untruncated, without the prompt (what a long document's windows are cut on)."""
        return await cast(EmbeddingRunner, self.resolve(input_type=input_type).runner).token_offsets(texts)

    @property
    def batch_bounds(self) -> tuple[int, int]:
        """(padded tokens, items) a forward pass of its engines holds at most."""
        engine = self.started()[0][1].engine
        return engine.max_batch_tokens, engine.max_batch_size

    def runners(self) -> list[Any]:
        """Every runner, once each."""
        return [runner for _, runner in self.started()]
