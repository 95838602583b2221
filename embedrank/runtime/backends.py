"""Inference backends: what runs the transformer between our tokenization and our pooling or scoring.

A backend turns padded features ``(B, T)`` into token embeddings ``(B, T, H)`` (an encoder) or logits
``(B, L)`` (a cross-encoder), nothing more: tokenization, truncation, token counts, pooling,
normalization and activations stay embedrank's own and identical across backends.

========  ==========================  =====================================================================
backend   precision                   what runs
========  ==========================  =====================================================================
torch     ``fp32``                    the transformers model (padding-free for BERT/RoBERTa, :mod:`.packed`)
openvino  ``fp32``                    OpenVINO CPU plugin with ``INFERENCE_PRECISION_HINT=f32``: true fp32
openvino  ``bf16``                    OpenVINO with ``INFERENCE_PRECISION_HINT=bf16`` (its own default on
                                      CPUs with AVX512-BF16/AMX; here it is asked for by name)
openvino  ``int8``                    static int8 (``nncf.quantize`` on calibration texts); the operations
                                      NNCF leaves in float run in fp32
onnx      ``fp32``                    ONNX Runtime on a ``torch.onnx.export`` graph
onnx      ``int8``                    ONNX Runtime, dynamic int8 (``onnxruntime.quantization.quantize_dynamic``)
========  ==========================  =====================================================================

:attr:`Runtime.inference_precision` reports what the runtime really computes in, read back from the
compiled model (a CPU without bf16 support runs ``bf16`` requests in f32, and says so).

Exports are made with the maintained converters (``openvino.convert_model`` on the transformers model,
NNCF, ``torch.onnx.export``, ONNX Runtime's quantizer), never a hand-written graph rewrite, and cached by
:mod:`embedrank.runtime.exports`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import numpy as np
import torch

from embedrank.errors import InvalidInputError
from embedrank.runtime import packed
from embedrank.runtime.graphs import CudaGraphs
from embedrank.runtime.lora import BASE, AdapterNames, RowAdapters, positions_of

Backend = Literal["torch", "openvino", "onnx"]
Precision = Literal["fp32", "bf16", "fp16", "int8"]
# token embeddings (B, T, H), logits (B, L), or a causal LM's answer logit (B, 1): "yes" minus "no" at the
# last position (runtime.converters.YesNoLogit)
# "splade": a masked LM pooled by SPLADE inside the graph, (B, V) out
Head = Literal["encoder", "classifier", "yes-no", "splade"]

PRECISIONS: dict[str, tuple[str, ...]] = {
    "torch": ("fp32", "bf16", "fp16"),  # fp16 on a GPU only (runtime.exports.load_transformer)
    "openvino": ("fp32", "bf16", "int8"),
    "onnx": ("fp32", "int8"),
}
BACKEND_ENV = "EMBEDRANK_BACKEND"
PRECISION_ENV = "EMBEDRANK_PRECISION"
# The default backend: the fastest exact one on CPU (see the README's figures), unless the environment
# names another. ``torch`` is one setting away.
DEFAULT_BACKEND: Backend = "openvino"
DEFAULT_PRECISION: Precision = "fp32"
_PRECISION_ALIASES = {
    "float32": "fp32",
    "f32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "qint8": "int8",
}
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The torch dtype the torch backend computes in, by precision."""
# either setting may be "auto": the fastest runtime within the quality bound, measured (runtime.auto)
AUTO = "auto"


def check_backend(backend: str | None = None, precision: str | None = None) -> tuple[Backend, Precision]:
    """Validate a (backend, precision) pair; ``None`` takes ``$EMBEDRANK_BACKEND`` / ``$EMBEDRANK_PRECISION``,
    else the defaults (``openvino``, ``fp32``). Either may be ``"auto"`` (:mod:`embedrank.runtime.auto`; typed
    as a backend or precision although it names the choice still to make).

    >>> check_backend("torch", "float32")
    ('torch', 'fp32')
    >>> check_backend("auto", "int8")
    ('auto', 'int8')
    >>> check_backend("torch", "int8")
    Traceback (most recent call last):
    ...
    embedrank.errors.InvalidInputError: backend 'torch' runs precision fp32, bf16, fp16; got 'int8' (openvino runs fp32, bf16, int8; onnx runs fp32, int8)
    """
    name = (backend or os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND).strip().lower()
    if name not in PRECISIONS and name != AUTO:
        choices = [*sorted(PRECISIONS), AUTO]
        raise InvalidInputError(f"unknown backend {name!r}; choose one of {choices}", param="backend")
    prec = (precision or os.environ.get(PRECISION_ENV) or DEFAULT_PRECISION).strip().lower()
    prec = _PRECISION_ALIASES.get(prec, prec)
    if name == AUTO and prec not in {p for ps in PRECISIONS.values() for p in ps} | {AUTO}:
        raise InvalidInputError(f"unknown precision {prec!r}; choose fp32, bf16, fp16, int8 or auto", param="precision")
    if name != AUTO and prec != AUTO and prec not in PRECISIONS[name]:
        others = "; ".join(f"{b} runs {', '.join(p)}" for b, p in PRECISIONS.items() if b != name and len(p) > 1)
        raise InvalidInputError(
            f"backend {name!r} runs precision {', '.join(PRECISIONS[name])}; got {prec!r} ({others})",
            param="precision",
        )
    return name, prec  # type: ignore[return-value]


class Runtime(Protocol):
    """Runs the transformer: features ``(B, T)`` -> ``(B, T, H)`` token embeddings or ``(B, L)`` logits."""

    backend: Backend
    precision: Precision
    inference_precision: str  # what really computes: "f32", "bf16", "int8+f32", ...

    def __call__(self, features: dict[str, torch.Tensor], *, all_positions: bool = False) -> torch.Tensor:
        """``all_positions``: compute the states of masked-out positions too, as the model's own padded
        forward does (ColBERT's query expansion reads them); the exported graphs always do."""
        ...


class TorchRuntime:
    """The transformers model itself, padding-free where :mod:`embedrank.runtime.packed` applies. With
    :attr:`adapters` (:class:`~embedrank.runtime.lora.RowAdapters` on :attr:`module`), a batch's features may carry
    ``adapter_ids`` ``(B,)``: each row's adapter (:data:`~embedrank.runtime.lora.BASE` for none)."""

    backend: Backend = "torch"
    precision: Precision = "fp32"
    fallback_reason: str | None = None  # why it runs on torch although another backend was the default

    def __init__(self, model: torch.nn.Module, tokenizer: Any, head: Head, *, padding_free: bool | None = None) -> None:
        self.module = model.eval()
        self.head = head
        self.adapters: RowAdapters | None = None
        self.device = next(iter(model.parameters()), torch.empty(0)).device  # the caller moved it there
        supported = packed.supports(model) if head == "encoder" else packed.supports_classifier(model)
        self.padding_free = packed.enabled(supported, tokenizer, padding_free)
        dtype = next(iter(model.parameters()), torch.empty(0)).dtype
        self.inference_precision = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}.get(
            dtype, str(dtype)
        )
        self.precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")  # type: ignore[assignment]
        # on a GPU, the packed forward's attention too runs on the real tokens only (flash attention's
        # variable-length kernel) where it can: None attends on the padded layout
        self.varlen = packed.varlen_kernel(self.device, dtype, _head_dim(model)) if supported else None
        # on a GPU, small batches replay CUDA graphs of the padded forward (launching kernels one by one takes
        # longer than they compute); None: every batch runs eagerly
        self.graphs: CudaGraphs | None = None
        if supported and self.device.type == "cuda":
            token_types = "token_type_ids" in getattr(tokenizer, "model_input_names", ())
            forward = packed.padded_forward if head == "encoder" else packed.padded_classifier_logits
            self.graphs = CudaGraphs(partial(forward, model), self.device, token_types=token_types)

    @torch.inference_mode()
    def __call__(self, features: dict[str, torch.Tensor], *, all_positions: bool = False) -> torch.Tensor:
        rows = features.get("adapter_ids")
        if rows is not None:
            features = {k: v for k, v in features.items() if k != "adapter_ids"}
            if self.adapters is None:
                raise InvalidInputError("this model has no adapters", param="adapter")
            rows = rows if bool((rows != BASE).any()) else None  # the base model's rows alone: as without
        # CUDA graphs replay the base model only: rows with adapters run eagerly
        if rows is None and self.graphs is not None and not all_positions:  # padding positions come out zero
            out = self.graphs(features)
            if out is not None:
                return out
        packing = self.padding_free and (self.head != "encoder" or not all_positions)
        # the real tokens' positions are found where the features are (the host), before they move: found on
        # a GPU, they would make the host wait for it; None when there is too little padding to skip
        real = packed.real_positions(features["attention_mask"]) if packing else None
        if rows is None:
            return self._run(features, real)
        assert self.adapters is not None
        rows = rows.to(self.device)
        with self.adapters.rows(rows, positions_of(rows, features["input_ids"].shape[1], real)):
            return self._run(features, real)

    def _run(self, features: dict[str, torch.Tensor], real: torch.Tensor | None) -> torch.Tensor:
        """The forward: packed on the ``real`` positions (:func:`~embedrank.runtime.packed.real_positions`) if
        given, else on the padded layout."""
        inputs = {k: v.to(self.device, non_blocking=True) for k, v in features.items()}
        if real is not None:
            ids, mask, types = inputs["input_ids"], inputs["attention_mask"], inputs.get("token_type_ids")
            on_device = real.to(self.device, non_blocking=True)
            varlen = (
                None if self.varlen is None else packed.varlen_of(features["attention_mask"], self.varlen, self.device)
            )
            if self.head == "encoder":
                return packed.packed_forward(self.module, ids, mask, types, real=on_device, varlen=varlen)
            return packed.packed_classifier_logits(self.module, ids, mask, types, real=on_device, varlen=varlen)
        if self.head == "encoder":
            return self.module(**inputs).last_hidden_state
        return self.module(**inputs).logits


def _head_dim(model: torch.nn.Module) -> int:
    """The attention heads' size from the model's config (0 when it does not say)."""
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", 0)
    return getattr(config, "hidden_size", 0) // heads if heads else 0


def _feed(names: Sequence[str], features: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The graph's inputs from the features: int64 numpy, ``token_type_ids`` zeros if the tokenizer gave none.

    >>> _feed(["input_ids", "token_type_ids"], {"input_ids": torch.tensor([[101, 102]])})["token_type_ids"]
    array([[0, 0]])
    >>> _feed(["input_ids"], {"input_ids": torch.tensor([[101]]), "adapter_ids": torch.tensor([0])})
    Traceback (most recent call last):
    ...
    embedrank.errors.InvalidInputError: an exported graph runs its base model only: adapters run on torch
    """
    if "adapter_ids" in features:  # never computed as the base model without saying so
        raise InvalidInputError("an exported graph runs its base model only: adapters run on torch", param="adapter")
    ids = features["input_ids"]
    feed = {}
    for name in names:
        value = features.get(name)
        feed[name] = (value if value is not None else torch.zeros_like(ids)).numpy().astype(np.int64, copy=False)
    return feed


class OpenVINORuntime:
    """A compiled OpenVINO model on the CPU; one infer request per calling thread (per stream).

    ``streams=1`` (the default) compiles for latency: one stream runs each batch on every thread. ``streams=n``
    compiles for throughput (OpenVINO's ``THROUGHPUT`` hint with ``n`` streams sharing the threads; no more
    streams than threads) and runs each batch as that many parts of its rows at once, one per stream: about a
    tenth faster for batches of 32 on 2 cores, but a batch of one text runs on one stream's threads only, about
    half as fast (``eval/benchmarks/ov_hints.py``). Rows are independent, so the result is the same either way.
    """

    backend: Backend = "openvino"

    def __init__(
        self, xml: str | Path, precision: Precision, *, cache_dir: str | Path | None = None, streams: int = 1
    ) -> None:
        import openvino as ov

        self.precision = precision
        self.path = Path(xml)
        config: dict[str, Any] = {
            # fp32 must be true fp32: the CPU plugin otherwise runs bf16 wherever the CPU has it
            "INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32",
            "PERFORMANCE_HINT": "LATENCY" if streams == 1 else "THROUGHPUT",
            # as many threads as torch was given (Ray actors and tests set fewer than the cores)
            "INFERENCE_NUM_THREADS": torch.get_num_threads(),
            **({"NUM_STREAMS": streams} if streams > 1 else {}),
        }
        if cache_dir is not None:
            config["CACHE_DIR"] = str(cache_dir)
        core = ov.Core()
        self.compiled = core.compile_model(str(self.path), "CPU", config)
        self.input_names = [port.any_name for port in self.compiled.inputs]
        # OpenVINO runs no more streams than threads: what it compiled is what each batch is split into
        self.streams = int(self.compiled.get_property("NUM_STREAMS")) if streams > 1 else 1
        real = self.compiled.get_property("INFERENCE_PRECISION_HINT").to_string()  # an ov.Type: "f32", "bf16"
        self.inference_precision = f"int8+{real}" if precision == "int8" else real
        self._local = threading.local()

    def _requests(self) -> list[Any]:
        """This thread's infer requests, one per stream."""
        requests: list[Any] | None = getattr(self._local, "requests", None)
        if requests is None:
            requests = self._local.requests = [self.compiled.create_infer_request() for _ in range(self.streams)]
        return requests

    def __call__(self, features: dict[str, torch.Tensor], *, all_positions: bool = False) -> torch.Tensor:
        feed = _feed(self.input_names, features)
        requests = self._requests()
        rows = len(features["input_ids"])
        if self.streams == 1 or rows < 2:
            result = requests[0].infer(feed)
            return torch.from_numpy(np.array(result[0], dtype=np.float32, copy=True))
        parts = [part for part in np.array_split(np.arange(rows), self.streams) if len(part)]
        started = requests[: len(parts)]
        for request, part in zip(started, parts, strict=True):
            request.start_async({name: value[part[0] : part[-1] + 1] for name, value in feed.items()})
        for request in started:
            request.wait()
        out = [np.array(request.get_output_tensor(0).data, dtype=np.float32, copy=True) for request in started]
        return torch.from_numpy(np.concatenate(out))


class ONNXRuntime:
    """An ONNX Runtime CPU session."""

    backend: Backend = "onnx"

    def __init__(self, path: str | Path, precision: Precision, *, threads: int | None = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise ImportError("the ONNX backend needs onnxruntime: pip install 'embedrank[onnx]'") from None

        self.precision = precision
        self.path = Path(path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # idle worker threads sleep instead of spinning: a spinning one takes a core from the service's event
        # loop and the tokenizer; in-process it measured the same or faster (batch 16 queries: +8%)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.inference_precision = "int8+f32" if precision == "int8" else "f32"

    def __call__(self, features: dict[str, torch.Tensor], *, all_positions: bool = False) -> torch.Tensor:
        (out,) = self.session.run(None, _feed(self.input_names, features))[:1]
        return torch.from_numpy(np.asarray(out, dtype=np.float32))


class ElsewhereRuntime:
    """What stands for the transformer in a process that only tokenizes: the forward passes run in another
    process (a service's engine process, :mod:`embedrank.serving.remote`), which loaded the weights. A model
    built on it (:func:`~embedrank.runtime.exports.weightless`) tokenizes, counts and finishes vectors as the
    loaded model does (an image-text model preprocesses images too), and says the backend and precision that
    process runs (they key its vectors, e.g. in the embedding cache); calling it, or a tower of it, is an error.

    >>> ElsewhereRuntime("openvino", "int8", "int8+f32")({"input_ids": None})
    Traceback (most recent call last):
    ...
    RuntimeError: this model has no weights here: its forward passes run in the engine process
    """

    device = "cpu"
    adapters: AdapterNames | None = None  # the LoRA adapters the model runs there (by name: their rows' indexes)

    def __init__(self, backend: str = "torch", precision: str = "fp32", inference_precision: str = "f32") -> None:
        self.backend = cast(Backend, backend)
        self.precision = cast(Precision, precision)
        self.inference_precision = inference_precision

    def __call__(self, features: dict[str, torch.Tensor], *, all_positions: bool = False) -> torch.Tensor:
        raise RuntimeError("this model has no weights here: its forward passes run in the engine process")

    def text(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """An image-text model's text tower (:class:`~embedrank.runtime.towers.TorchTowers`): not here either."""
        return self(features)

    def image(self, pixels: dict[str, torch.Tensor]) -> torch.Tensor:
        """An image-text model's vision tower: not here either."""
        return self(pixels)


class ChoosesAdapters:
    """The LoRA adapters a model's :attr:`runtime` runs, by name, and their indexes (what a row carries)."""

    runtime: Any

    @property
    def adapters(self) -> tuple[str, ...]:
        """The names of the LoRA adapters the model runs (its ``from_spec``'s ``adapters``); empty when none."""
        names = getattr(self.runtime, "adapters", None)
        return tuple(names.names) if names is not None else ()

    def adapter_index(self, adapter: str | None) -> int:
        """The runtime's index of ``adapter`` (None: :data:`~embedrank.runtime.lora.BASE`, the base model).

        Raises:
            InvalidInputError: the model has no adapter of that name (the message lists those it has).
        """
        if adapter is None:
            return BASE
        names = getattr(self.runtime, "adapters", None)
        if names is None:
            model = getattr(getattr(self, "spec", None), "model_id", "")
            raise InvalidInputError(f"unknown adapter {adapter!r}; model {model!r} has none", param="adapter")
        return int(names.index(adapter))


class RuntimeFacts(ChoosesAdapters):
    """What :class:`~embedrank.models.encoder.Encoder` and ``CrossEncoder`` say about their :attr:`runtime`."""

    runtime: Runtime

    @property
    def model(self) -> torch.nn.Module | None:
        """The torch module (backend ``torch``), else None: the transformer runs as an exported graph."""
        return getattr(self.runtime, "module", None)

    @property
    def backend(self) -> str:
        return self.runtime.backend

    @property
    def precision(self) -> str:
        return self.runtime.precision

    @property
    def fallback_reason(self) -> str | None:
        """Why the model runs on torch although no backend was named and the default is another (the export
        failed), else None."""
        return getattr(self.runtime, "fallback_reason", None)

    @property
    def auto_choice(self) -> Any:
        """What ``backend``/``precision`` ``"auto"`` chose and why (a :class:`embedrank.runtime.auto.Choice`:
        ``.summary`` says it in a line, ``.trials`` has every candidate's figures), else None."""
        return getattr(self.runtime, "auto_choice", None)

    @property
    def on_gpu(self) -> bool:
        """Whether the transformer runs on a GPU (then the next inputs are tokenized while a batch computes;
        an exported graph runs on the CPU)."""
        return str(getattr(self.runtime, "device", "cpu")).startswith("cuda")

    @property
    def padding_free(self) -> bool:
        """Whether the torch backend skips padding tokens (:mod:`embedrank.runtime.packed`)."""
        return bool(getattr(self.runtime, "padding_free", False))

    @padding_free.setter
    def padding_free(self, value: bool) -> None:
        if isinstance(self.runtime, TorchRuntime):
            self.runtime.padding_free = value


def with_adapters(features: dict[str, torch.Tensor], adapter: Any) -> dict[str, torch.Tensor]:
    """``features`` of a batch with the adapter index each row runs with (``adapter``: per row, or one for all;
    :data:`~embedrank.runtime.lora.BASE` for none) as ``adapter_ids`` ``(B,)``, which a runtime with adapters reads;
    ``features`` themselves when every row runs the base model.

    >>> ids = torch.zeros(2, 3, dtype=torch.int64)
    >>> with_adapters({"input_ids": ids}, [0, BASE])["adapter_ids"].tolist(), list(with_adapters({"input_ids": ids}, BASE))
    ([0, -1], ['input_ids'])
    """
    if not np.any(np.asarray(adapter) != BASE):
        return features
    rows = features["input_ids"].shape[0]
    return {**features, "adapter_ids": torch.as_tensor(adapter).expand(rows).clone()}


class PerAdapterRuntime:
    """A runtime that runs each adapter's model apart: ``base`` for rows without one, ``adapted[name]`` (that
    adapter's model, its updates merged: one export per adapter) for the rows that ask for it. A batch's features
    may carry ``adapter_ids`` ``(B,)`` as :class:`TorchRuntime`'s do; its rows are run in one pass per adapter
    present and put back in their order. Every other fact (backend, precision, ...) is the base runtime's."""

    def __init__(self, base: Runtime, adapted: dict[str, Runtime]) -> None:
        self.base = base
        self.adapted = list(adapted.values())
        self.adapters = AdapterNames(list(adapted))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["base"], name)

    def __call__(self, features: dict[str, torch.Tensor], *, all_positions: bool = False) -> torch.Tensor:
        rows = features.get("adapter_ids")
        if rows is None:
            return self.base(features, all_positions=all_positions)
        features = {k: v for k, v in features.items() if k != "adapter_ids"}
        present = [int(i) for i in torch.unique(rows)]
        if len(present) == 1:  # one model for every row: no copy
            return self._runtime(present[0])(features, all_positions=all_positions)
        out: torch.Tensor | None = None
        for index in present:
            chosen = (rows == index).nonzero().squeeze(1)
            part = self._runtime(index)({k: v[chosen] for k, v in features.items()}, all_positions=all_positions)
            if out is None:
                out = part.new_empty((rows.shape[0], *part.shape[1:]))
            out[chosen] = part
        assert out is not None
        return out

    def _runtime(self, index: int) -> Runtime:
        if index == BASE:
            return self.base
        if not 0 <= index < len(self.adapted):
            raise InvalidInputError(f"no adapter of index {index}; this model has {len(self.adapted)}", param="adapter")
        return self.adapted[index]
