"""Converters from a transformers model to an exported graph: OpenVINO (``openvino.convert_model`` on
``torch.export``, NNCF for int8) and ONNX (``torch.onnx.export``, ONNX Runtime's transformer optimizer where
it fuses the attention, ONNX Runtime's dynamic quantizer).

Only maintained tools convert; nothing rewrites a graph by hand. :mod:`embedrank.runtime.exports` decides
what to export and caches the result.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedrank.errors import UnsupportedModelError
from embedrank.registry import ModelSpec, quiet_loading
from embedrank.runtime.backends import Head, Precision
from embedrank.runtime.lora import merge_adapter, read_adapter

CALIBRATION_BATCH = 8
log = logging.getLogger("embedrank.exports")


@contextlib.contextmanager
def exporting(model_id: str) -> Iterator[None]:
    """Run an exporter or converter outside inference mode and without gradients; the warnings they give
    about their own internals (deprecations, tracing notes) go to the debug log, not to the user's terminal."""
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                log.debug("while exporting %s: %s: %s", model_id, w.category.__name__, w.message)


def empty(out: Path) -> None:
    """Remove what a failed export left in ``out``, for the next recipe."""
    for item in out.iterdir():
        item.unlink()


# encoder-decoder models whose encoder alone embeds (sentence-t5, GTR), as sentence-transformers loads them
ENCODER_OF = {
    "t5": "T5EncoderModel",
    "mt5": "MT5EncoderModel",
    "umt5": "UMT5EncoderModel",
    "longt5": "LongT5EncoderModel",
    "switch_transformers": "SwitchTransformersEncoderModel",
}


class Narrow(torch.nn.Module):
    """The transformers model with one tensor out: ``last_hidden_state`` or ``logits``."""

    def __init__(self, model: torch.nn.Module, head: Head, with_token_types: bool) -> None:
        super().__init__()
        self.model = model
        self.output = "last_hidden_state" if head == "encoder" else "logits"
        self.with_token_types = with_token_types

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        extra = {"token_type_ids": token_type_ids} if self.with_token_types else {}
        return getattr(self.model(input_ids=input_ids, attention_mask=attention_mask, **extra), self.output)


class YesNoLogit(torch.nn.Module):
    """A causal LM as a one-label classifier: ``logits`` ``(B, 1)`` = the logit of ``yes`` minus the logit of
    ``no`` at the last position (inputs padded on the left), so the sigmoid of it is ``P(yes)`` against
    ``P(no)``, the softmax over the two that LLM rerankers (Qwen3-Reranker) score with. Only the last
    position's logits are computed (``logits_to_keep=1``)."""

    def __init__(self, model: torch.nn.Module, yes_id: int, no_id: int) -> None:
        super().__init__()
        self.model = model
        self.config = model.config
        self.register_buffer("answers", torch.tensor([yes_id, no_id]), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any) -> Any:
        from transformers.modeling_outputs import SequenceClassifierOutput

        last = self.model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=1).logits[:, -1]  # (B, V)
        pair = last.index_select(1, self.answers)  # (B, 2): yes, no
        return SequenceClassifierOutput(logits=(pair[:, :1] - pair[:, 1:]).float())


class SpladeMax(torch.nn.Module):
    """A masked LM pooled as SPLADE (:func:`~embedrank.math.sparse.splade_max`) in the graph: ``logits``
    ``(B, V)``, the largest ``log(1 + ReLU)`` of each vocabulary entry's logit over the real tokens."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **extra: Any) -> Any:
        from transformers.modeling_outputs import SequenceClassifierOutput

        from embedrank.math.sparse import splade_max

        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits  # (B, T, V)
        return SequenceClassifierOutput(logits=splade_max(logits.float(), attention_mask))


def answer_ids(spec: ModelSpec, tokenizer: Any) -> tuple[int, int]:
    """Token ids of ``spec.answer_tokens`` (``yes``, ``no``) in the model's vocabulary (``tokenizer``'s).

    Raises:
        UnsupportedModelError: one of them is not a single token of the vocabulary.
    """
    vocab = tokenizer.get_vocab()
    missing = [t for t in spec.answer_tokens if t not in vocab]
    if missing:
        raise UnsupportedModelError(
            f"model {spec.model_id!r} is a causal LM, scored as an LLM reranker by its answer tokens "
            f"{list(spec.answer_tokens)}, but {missing} is not a token of its vocabulary"
        )
    return vocab[spec.answer_tokens[0]], vocab[spec.answer_tokens[1]]


def load_torch(spec: ModelSpec, head: Head, tokenizer: Any, **options: Any) -> torch.nn.Module:
    """The transformers model of ``spec``: ``AutoModel`` (encoder; an encoder-decoder's encoder),
    ``AutoModelForSequenceClassification`` (classifier) or a causal LM as :class:`YesNoLogit` (its answer
    tokens found in ``tokenizer``), with ``options`` for ``from_pretrained``, in eval mode."""
    import transformers
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSequenceClassification

    loader = {
        "encoder": AutoModel,
        "classifier": AutoModelForSequenceClassification,
        "yes-no": AutoModelForCausalLM,
        "splade": AutoModelForMaskedLM,
    }
    cls = loader[head]
    if head == "encoder" and spec.model_type in ENCODER_OF:  # an encoder-decoder embeds with its encoder
        cls = getattr(transformers, ENCODER_OF[spec.model_type])
    with quiet_loading():
        model = cls.from_pretrained(spec.path, trust_remote_code=spec.trust_remote_code, **options).eval()
    if spec.merged_adapter is not None:
        merge_adapter(model, read_adapter(spec.merged_adapter))
    if head == "splade":
        return SpladeMax(model).eval()
    return YesNoLogit(model, *answer_ids(spec, tokenizer)).eval() if head == "yes-no" else model


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "no message"


def model_to_export(spec: ModelSpec, head: Head, tokenizer: Any, attention: str) -> torch.nn.Module:
    """The transformers model to export with ``attention`` (``sdpa`` or ``eager``; a ValueError when the
    architecture lacks it). Decoders export without their key/value cache: one forward pass over whole
    inputs needs none, and the cache's growing concatenation does not convert."""
    model = load_torch(spec, head, tokenizer, attn_implementation=attention)
    config: Any = model.config
    if getattr(config, "use_cache", False):
        config.use_cache = False
    return model


def disagreement(
    out: Path, backend: str, precision: Precision, model: Narrow, example: dict[str, torch.Tensor]
) -> str | None:
    """None when the graph exported into ``out`` computes what ``model`` computes on ``example`` (a padded
    batch), on its real tokens: the same shape, finite numbers, and for fp32 within 1e-3 of the output's scale."""
    from embedrank.runtime.backends import ONNXRuntime, OpenVINORuntime

    graph = out / ("model.xml" if backend == "openvino" else "model.onnx")
    runtime = OpenVINORuntime(graph, precision) if backend == "openvino" else ONNXRuntime(graph, precision)
    got = runtime(example)
    with torch.no_grad():
        expected = model(**example).float()
    if got.shape != expected.shape:  # OpenVINO int8 of a decoder with SDPA once returned its vocabulary logits
        return f"output shape {tuple(got.shape)}, torch gives {tuple(expected.shape)}"
    if model.output == "last_hidden_state":  # padding positions may differ: compare real tokens only
        mask = example["attention_mask"].bool()
        got, expected = got[mask], expected[mask]
    if not torch.isfinite(got).all():
        return f"{int((~torch.isfinite(got)).sum())} of {got.numel()} outputs are not finite"
    if precision == "int8":
        return None
    error = float((got - expected).abs().max())
    scale = max(1.0, float(expected.abs().max()))
    return None if error <= 1e-3 * scale else f"largest difference {error:.2e} at output scale {scale:.2e}"


EXAMPLE = ("an example text", "a second example text, with many more words than the first one has")
# a batch of another size and length: a graph traced on EXAMPLE must compute this one right as well
OTHER_EXAMPLE = (
    "three",
    "a third example, of yet another length",
    "the last example text of the second batch is the longest of all of them, so that the traced graph has to "
    "handle a sequence much longer than the one it was traced on, and more rows than the first batch had",
)


def example_inputs(tokenizer: Any, head: Head, texts: tuple[str, ...] = EXAMPLE) -> dict[str, torch.Tensor]:
    """A padded batch of ``texts`` (default: two of clearly different lengths), padded as the tokenizer pads
    (the export traces it, and :func:`disagreement` checks the graph's padded rows on it)."""
    if head == "yes-no" and tokenizer.padding_side != "left":  # the answer is read at the last position
        tokenizer = copy.copy(tokenizer)
        tokenizer.padding_side = "left"
    if head in ("encoder", "splade"):
        enc = tokenizer(list(texts), padding=True, return_tensors="pt")
    else:
        queries = [f"query {i}: " + " ".join(text.split()[:3]) for i, text in enumerate(texts)]
        enc = tokenizer(queries, list(texts), padding=True, return_tensors="pt")
    return dict(enc)


def calibration_batches(tokenizer: Any, head: Head, texts: list[str], max_length: int) -> list[dict[str, np.ndarray]]:
    """Tokenized calibration batches as the runtime will feed them (length-sorted, padded per batch).
    A cross-encoder is calibrated on pairs: the first 12 words of text i against texts i and i+1."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    batches = []
    for start in range(0, len(order), CALIBRATION_BATCH):
        chunk = [texts[i] for i in order[start : start + CALIBRATION_BATCH]]
        if head in ("encoder", "splade"):
            enc = tokenizer(chunk, padding=True, truncation=True, max_length=max_length, return_tensors="np")
        else:
            queries = [" ".join(t.split()[:12]) for t in chunk]
            docs = chunk[1:] + chunk[:1]
            enc = tokenizer(
                queries * 2, chunk + docs, padding=True, truncation=True, max_length=max_length, return_tensors="np"
            )
        batches.append({k: np.asarray(v, dtype=np.int64) for k, v in enc.items()})
    return batches


def to_openvino(model: Narrow, example: dict[str, torch.Tensor], out: Path, precision: Precision, calib: Any) -> None:
    import openvino as ov

    # torch.export with dynamic batch and sequence axes (torch.jit.trace, convert_model's other path, is
    # deprecated); the graph's inputs keep the tokenizer's names
    # (Dim.AUTO: dynamic, with the range torch derives from the model, e.g. its position limit)
    auto = torch.export.Dim.AUTO
    program = torch.export.export(model, (), kwargs=example, dynamic_shapes={k: {0: auto, 1: auto} for k in example})
    ov_model = ov.convert_model(program)
    if precision == "int8":
        nncf = require("nncf", "int8", "OpenVINO int8")

        names = [p.any_name for p in ov_model.inputs]
        dataset = nncf.Dataset(calib, lambda batch: {n: batch[n] for n in names})
        options: dict[str, Any] = {}
        if isinstance(model.model, YesNoLogit):
            # an LLM reranker's answer is read from its vocabulary projection (the last MatMul): kept in float,
            # which it needs to be exact enough, and without which the CPU plugin returned the whole
            # vocabulary's logits instead of the answer (OpenVINO 2026.4, NNCF 3.4, transformer preset)
            head = [op.get_friendly_name() for op in ov_model.get_ordered_ops() if op.get_type_name() == "MatMul"][-1:]
            options["ignored_scope"] = nncf.IgnoredScope(names=head)
        ov_model = nncf.quantize(
            ov_model, dataset, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calib), **options
        )
    ov.save_model(ov_model, str(out / "model.xml"), compress_to_fp16=False)


def require(module: str, extra: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{what} needs {module}: pip install 'embedrank[{extra}]'") from None


def to_onnx(model: Narrow, example: dict[str, torch.Tensor], out: Path, precision: Precision) -> None:
    require("onnxscript", "onnx", "the ONNX backend's exporter")
    target = out / ("model_fp32.onnx" if precision == "int8" else "model.onnx")
    auto = torch.export.Dim.AUTO
    # the torch.export-based exporter (TorchScript tracing bakes the example's shapes into the mask ops)
    program = torch.onnx.export(
        model,
        (),
        kwargs=example,
        dynamic_shapes={k: {0: auto, 1: auto} for k in example},
        dynamo=True,
        output_names=[model.output],  # last_hidden_state or logits, as optimum names them
        optimize=True,
        verbose=False,
    )
    assert program is not None  # dynamo=True always returns the program
    program.save(str(target))
    if precision == "int8":
        require("onnxruntime", "onnx", "the ONNX backend")
        dynamic_int8(target, out / "model.onnx")
        target.unlink()


def onnx_int8_reduce_range() -> bool:
    """Whether ONNX int8 weights keep 7 bits: on a CPU without int8 dot products (:func:`has_int8_dot_products`),
    where ONNX Runtime's AVX2 kernels would otherwise saturate (its documented ``reduce_range``). With 7-bit
    weights no sum saturates, so those kernels compute the same integers as VNNI's."""
    from embedrank.runtime.cpus import has_int8_dot_products

    return not has_int8_dot_products()


def dynamic_int8(source: Path, target: Path, extra_options: dict[str, Any] | None = None) -> None:
    """ONNX Runtime's dynamic int8 of the graph at ``source`` into ``target``: int8 weights per channel (7 bits
    where :func:`onnx_int8_reduce_range`), activations quantized per batch at run time (no calibration)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(source),
        str(target),
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=onnx_int8_reduce_range(),
        extra_options=extra_options or {},
    )


FUSED_MAX_PARAMETERS = 400_000_000  # larger graphs pass 2 GB, which the one-file ONNX format cannot hold


def to_onnx_fused(
    model: Narrow, tokenizer: Any, head: Head, example: dict[str, torch.Tensor], out: Path, precision: Precision
) -> str | None:
    """ONNX Runtime's own recipe for transformer encoders: ``torch.onnx.export`` (the TorchScript exporter,
    eager attention; its graph is the pattern ONNX Runtime's fusions know), then
    ``onnxruntime.transformers.optimizer`` fuses each layer's attention into one ``Attention`` operator (and
    layer norms, GELU), and for int8 ``quantize_dynamic`` turns those into ``QAttention``. On SciFact passages
    with all-MiniLM-L6-v2 on an AVX2 CPU this ran int8 1.6x as fast as the unfused int8 graph.

    Writes ``out/model.onnx`` and returns None, or returns why the recipe does not apply to this model (what
    it wrote in ``out`` is then the caller's to remove): not every layer's attention fused, a graph too large
    for one file, or the fused fp32 graph differing from torch by more than 1e-3 of the output's scale on
    either of two batches of different sizes and lengths (a traced graph must not have kept the first one's
    shape).
    """
    require("onnxruntime", "onnx", "the ONNX backend")
    from onnxruntime.transformers import optimizer

    config = model.model.config
    layers, heads, hidden = (getattr(config, k, 0) for k in ("num_hidden_layers", "num_attention_heads", "hidden_size"))
    if sum(p.numel() for p in model.parameters()) > FUSED_MAX_PARAMETERS:
        return f"over {FUSED_MAX_PARAMETERS:,} parameters"
    traced = out / "model_traced.onnx"
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in example]  # Narrow.forward's order
    dynamic = {name: {0: "batch", 1: "sequence"} for name in [*names, model.output]}
    torch.onnx.export(
        model,
        tuple(example[n] for n in names),
        str(traced),
        input_names=names,
        output_names=[model.output],
        dynamic_axes=dynamic,
        opset_version=17,
        dynamo=False,
    )
    fused = optimizer.optimize_model(str(traced), model_type="bert", num_heads=heads, hidden_size=hidden)
    traced.unlink()
    found = fused.get_fused_operator_statistics().get("Attention", 0)
    if not layers or found != layers:
        return f"ONNX Runtime fused the attention of {found} of {layers} layers"
    fused.save_model_to_file(str(out / "model.onnx"))
    for other in (example, example_inputs(tokenizer, head, OTHER_EXAMPLE)):
        problem = disagreement(out, "onnx", "fp32", model, other)
        if problem is not None:
            return f"the fused graph disagrees with torch: {problem}"
    if precision == "int8":
        (out / "model.onnx").rename(out / "model_fp32.onnx")
        # the fused operators are ONNX Runtime's own: shape inference cannot type their outputs, which are float
        dynamic_int8(out / "model_fp32.onnx", out / "model.onnx", {"DefaultTensorType": 1})  # onnx.TensorProto.FLOAT
        (out / "model_fp32.onnx").unlink()
    return None


def onnx_fused_or_reason(
    spec: ModelSpec, tokenizer: Any, head: Head, example: dict[str, torch.Tensor], out: Path, precision: Precision
) -> str | None:
    """:func:`to_onnx_fused` on ``spec`` (eager attention): None when ``out`` holds the fused graph, else why
    not (an exporter or optimizer error included), with ``out`` left empty for another recipe."""
    try:
        model = model_to_export(spec, head, tokenizer, "eager")
        narrow = Narrow(model, head, "token_type_ids" in example).eval()
        with exporting(spec.model_id):
            reason = to_onnx_fused(narrow, tokenizer, head, example, out, precision)
    except (ImportError, MemoryError):
        raise
    except Exception as exc:  # the exporter and optimizer raise many types; all mean: use the other recipe
        reason = f"{type(exc).__name__}: {first_line(exc)}"
    if reason is not None:
        empty(out)
    return reason
