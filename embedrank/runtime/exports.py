"""Exported graphs for the OpenVINO and ONNX backends, made once and cached on disk.

An export is keyed by the model (its path and the names, sizes and times of its weight files, so a model
saved again at the same place exports again), the head (encoder or classifier), backend, precision, the
versions of every library that shapes the graph, for int8 the calibration texts, and for one LoRA adapter's model
(a spec's ``merged_adapter``: the adapter's updates merged into the weights) the adapter's folder, weights and
configuration. It lives under ``<cache>/exports/<model>-<backend>-<precision>-<key>/`` (``<model>+<adapter>``) (``$EMBEDRANK_CACHE``, else
``~/.cache/embedrank``) with an ``export.json`` that says how it was made. Exports are written to a
temporary directory and renamed into place, so concurrent processes never see half an export.

An export that fails leaves ``<model>-<backend>-<precision>-<key>.failed.json`` with the converter's reason
instead, so later loads do not try again (delete it to retry); a new library version changes the key.

Converters (maintained tools only, :mod:`embedrank.runtime.converters`):

- OpenVINO: ``openvino.convert_model`` on the transformers model (whose output is narrowed to
  ``last_hidden_state`` or ``logits``), saved uncompressed (fp32 weights); int8: ``nncf.quantize``
  (static, ``ModelType.TRANSFORMER``) on the calibration texts, tokenized as the model will see them.
- ONNX: ONNX Runtime's fused-attention graph where its optimizer fuses every layer
  (:func:`~embedrank.runtime.converters.to_onnx_fused`), else ``torch.onnx.export`` with dynamic batch and
  sequence axes; int8: ``onnxruntime.quantization.quantize_dynamic`` (per-channel weights, dynamic activations;
  7-bit weights on a CPU without VNNI, :func:`~embedrank.runtime.converters.onnx_int8_reduce_range`, a fact of
  the key).

Calibration texts for int8 are the caller's (:data:`Calibration`: a list, a ``.txt``/``.jsonl`` file, or a
provider called only when an int8 export is made; at most :data:`CALIBRATION_SIZE`, seeded), else the
sample of real texts shipped with the package (:func:`~embedrank.texts.packaged_sample`): the same on every
machine, whatever the data directory holds.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import importlib
import importlib.metadata
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from embedrank.errors import InvalidInputError, UnsupportedModelError
from embedrank.paths import build_directory, default_cache_dir
from embedrank.registry import ModelSpec, quiet_loading, weights_fingerprint
from embedrank.runtime import converters
from embedrank.runtime.backends import (
    AUTO,
    BACKEND_ENV,
    PRECISION_ENV,
    TORCH_DTYPES,
    Backend,
    ElsewhereRuntime,
    Head,
    Precision,
    Runtime,
    TorchRuntime,
    check_backend,
)
from embedrank.runtime.devices import resolve_device
from embedrank.runtime.static import load_static, static_tokenizer
from embedrank.texts import SAMPLE_NAME, packaged_sample, read_texts, seeded_sample

log = logging.getLogger("embedrank.exports")

# bumped whenever the way we export changes (attention implementation, converter options), so old
# exports in the cache are not reused
RECIPE = 7
CALIBRATION_SIZE = 300  # texts for static int8 (NNCF's default subset is 300 samples)
_VERSIONED = {
    "openvino": ("openvino", "nncf", "torch", "transformers"),
    "onnx": ("onnxruntime", "onnx", "torch", "transformers"),
}


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


Calibration = Sequence[str] | str | Path | Callable[[], Sequence[str] | None] | None
"""int8 calibration texts: a list, a ``.txt``/``.jsonl`` file, or a provider called only when an int8 export
is made (its None, like None itself, means the packaged sample)."""


def calibration_texts(calibration: Calibration) -> tuple[list[str], str]:
    """The int8 calibration texts and where they came from (for ``export.json`` and logs)."""
    if callable(calibration):
        calibration = calibration()
    if calibration is not None and not isinstance(calibration, str | Path):
        texts = [t for t in calibration if isinstance(t, str) and t.strip()]
        if len(texts) < 2:
            raise InvalidInputError("int8 calibration needs at least 2 non-empty texts", param="calibration")
        return seeded_sample(
            texts, CALIBRATION_SIZE
        ), f"{min(len(texts), CALIBRATION_SIZE)} of {len(texts)} texts given"
    if calibration is not None:
        texts = read_texts(calibration)
        return seeded_sample(
            texts, CALIBRATION_SIZE
        ), f"{calibration} ({min(len(texts), CALIBRATION_SIZE)} of {len(texts)} texts)"
    sample = packaged_sample()
    texts = seeded_sample(sample, CALIBRATION_SIZE)
    return texts, f"{SAMPLE_NAME} ({len(texts)} of {len(sample)} texts)"


def export_key(
    spec: ModelSpec,
    head: Head | Literal["towers"],
    backend: Backend,
    precision: Precision,
    calibration: list[str],
    *,
    recipe: int = RECIPE,
) -> str:
    """The cache key of an export (see the module docstring for what goes in): of a model's ``head``, or of an
    image-text model's two ``towers`` (:mod:`embedrank.runtime.towers`, exported by its own ``recipe``)."""
    config = Path(spec.path) / "config.json"
    facts: dict[str, Any] = {
        "path": spec.path,
        "weights": weights_fingerprint(spec.path),
        "config": hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None,
        "recipe": recipe,
        "head": head,
        "backend": backend,
        "precision": precision,
        "versions": {p: _version(p) for p in _VERSIONED[backend]},
        "calibration": hashlib.sha256("\x00".join(calibration).encode()).hexdigest() if calibration else None,
    }
    if spec.merged_adapter is not None:  # one adapter's model: the base's weights with its updates merged
        facts["adapter"] = _adapter_facts(spec.merged_adapter)
    if backend == "onnx" and precision == "int8":  # 7-bit weights on a CPU without VNNI: another graph
        facts["reduce_range"] = converters.onnx_int8_reduce_range()
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _adapter_facts(folder: str) -> list[str]:
    """What identifies a merged adapter in a cache key: its folder, its weights' fingerprint and its configuration."""
    config = Path(folder) / "adapter_config.json"
    return [folder, weights_fingerprint(folder), hashlib.sha256(config.read_bytes()).hexdigest()]


def export_dir(spec: ModelSpec, backend: Backend, precision: Precision, key: str, cache_dir: Path | None) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(spec.model_id.rstrip("/")).name)[:60]
    if spec.merged_adapter is not None:
        name += "+" + re.sub(r"[^A-Za-z0-9._-]+", "_", Path(spec.merged_adapter).name)[:40]
    return (cache_dir or default_cache_dir()) / "exports" / f"{name}-{backend}-{precision}-{key}"


def runs_on(
    device: str | None,
    backend: str | None,
    precision: str | None,
    *,
    static: bool = False,
    spec: ModelSpec | None = None,
) -> tuple[str, str | None, str | None]:
    """``(device, backend, precision)`` as a model is loaded with them: the device resolved on this machine
    (:func:`~embedrank.runtime.devices.resolve_device`; ``"auto"`` is the CPU for a static model, a lookup
    per token), and on a GPU the torch backend in half precision (:func:`gpu_precision` of ``spec``) unless
    they are named (arguments, or ``$EMBEDRANK_BACKEND`` / ``$EMBEDRANK_PRECISION``).

    Raises:
        InvalidInputError: a device this machine lacks, or a GPU for a static model.
    """
    resolved = resolve_device(device)
    if resolved == "cpu":
        return resolved, backend, precision
    if static:
        if (device or "").strip().lower() == "auto":
            return "cpu", backend, precision
        raise InvalidInputError(
            f"a static model (a vector per token, no transformer) runs on the CPU; device {device!r} does not apply",
            param="device",
        )
    return resolved, *gpu_runtime(backend, precision, spec)


def gpu_runtime(backend: str | None, precision: str | None, spec: ModelSpec | None) -> tuple[str | None, str | None]:
    """``(backend, precision)`` a model loaded on a GPU runs with: as named (arguments, or
    ``$EMBEDRANK_BACKEND`` / ``$EMBEDRANK_PRECISION``), else torch in :func:`gpu_precision` of ``spec``.
    A named backend that runs on the CPU only is refused when the model loads."""
    if backend not in (None, AUTO) or os.environ.get(BACKEND_ENV):
        return backend, precision
    if precision in (None, AUTO) and not os.environ.get(PRECISION_ENV):
        precision = gpu_precision(spec) if spec is not None else "fp16"
    return "torch", precision


def gpu_precision(spec: ModelSpec) -> str:
    """The precision a model computes in on a GPU unless one is named: ``bf16`` for a model saved in
    bfloat16 (its ``config.json`` says so: trained in it, it may overflow fp16's range), else ``fp16``."""
    try:
        config = json.loads((Path(spec.path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "fp16"
    saved = str(config.get("torch_dtype") or config.get("dtype") or "")
    return "bf16" if "bfloat16" in saved else "fp16"


_WEIGHTLESS: contextvars.ContextVar[bool] = contextvars.ContextVar("embedrank_weightless", default=False)


@contextlib.contextmanager
def weightless() -> Iterator[None]:
    """Models loaded inside load their tokenizers, configurations and small heads, not the transformer: it is an
    :class:`~embedrank.runtime.backends.ElsewhereRuntime`, as for a service's front process, whose forward passes
    run in the engine process (:mod:`embedrank.serving.remote`). Nothing is exported, calibrated or compiled; the
    loader sets each part's runtime to what the engine process says it runs.
    """
    token = _WEIGHTLESS.set(True)
    try:
        yield
    finally:
        _WEIGHTLESS.reset(token)


def is_weightless() -> bool:
    """Whether models load without their transformer here (:func:`weightless`)."""
    return _WEIGHTLESS.get()


def load_transformer(
    spec: ModelSpec,
    head: Head,
    *,
    backend: str | None = None,
    precision: str | None = None,
    device: str = "cpu",
    torch_dtype: torch.dtype | None = None,
    max_seq_length: int,
    calibration: Calibration = None,
    cache_dir: str | Path | None = None,
    wrap_tokenizer: Callable[[Any], Any] | None = None,
    streams: int = 1,
) -> tuple[Any, torch.nn.Module | Runtime]:
    """The tokenizer and what runs the transformer: the torch module (backend ``torch``) or the runtime
    of the (cached) export, as :meth:`Encoder.from_spec <embedrank.models.encoder.Encoder.from_spec>` and
    ``CrossEncoder.from_spec`` load them.

    When neither the arguments nor ``$EMBEDRANK_BACKEND``/``$EMBEDRANK_PRECISION`` name the backend and the
    model cannot be exported to the default one, the model runs on torch, with one warning that gives the
    reason; a named backend that cannot run the model is an error. ``wrap_tokenizer`` turns the loaded
    tokenizer into the one the model is fed through (an LLM reranker's prompt template), so that int8
    calibration and the checks of exports see the inputs the model will see; the wrapped one is returned.

    ``streams`` (OpenVINO only, :class:`~embedrank.runtime.backends.OpenVINORuntime`): compile for throughput
    with that many streams, each batch split across them.

    Raises:
        InvalidInputError: an unknown backend or precision, ``device``/``torch_dtype`` with an exported
            backend (it runs on the CPU in its own precision), or ``streams`` other than 1 for a backend
            other than OpenVINO (``auto`` included; a static model runs in torch), or less than 1. When the
            default backend falls back to torch, ``streams`` does not apply, and the warning says so.
        ExportError: the named backend could not export the model (an :class:`UnsupportedModelError`).
    """
    from transformers import AutoTokenizer

    if spec.static is not None:  # a vector per token, no transformer: a lookup in torch (runtime.static)
        check_streams(streams, "torch", "fp32")
        if is_weightless():
            return static_tokenizer(Path(spec.path) / spec.static), ElsewhereRuntime()
        return load_static(spec, backend, precision)
    backend_name, prec = check_backend(backend, precision)
    check_streams(streams, backend_name, prec)
    with quiet_loading():
        tokenizer = AutoTokenizer.from_pretrained(spec.path, trust_remote_code=spec.trust_remote_code)
    if wrap_tokenizer is not None:
        tokenizer = wrap_tokenizer(tokenizer)
    if is_weightless():
        return tokenizer, ElsewhereRuntime()
    if backend_name == "torch" and prec != AUTO:
        if prec == "fp16" and device == "cpu":
            raise InvalidInputError(
                "precision fp16 runs on a GPU; on the CPU the torch backend runs fp32 or bf16", param="precision"
            )
        dtype = torch_dtype or (TORCH_DTYPES[prec] if prec != "fp32" else None)
        return tokenizer, converters.load_torch(spec, head, tokenizer, **({"dtype": dtype} if dtype else {}))
    if device != "cpu" or torch_dtype is not None:
        raise InvalidInputError(
            f"backend {backend_name!r} runs on the CPU in its own precision; device and torch_dtype "
            f"apply to backend='torch' only",
            param="backend",
        )
    if AUTO in (backend_name, prec):
        return tokenizer, auto_runtime(
            spec,
            tokenizer,
            head,
            backend_name,
            prec,
            max_seq_length=max_seq_length,
            calibration=calibration,
            cache_dir=cache_dir,
        )
    try:
        runtime = load_runtime(
            spec,
            tokenizer,
            head,
            backend_name,
            prec,
            max_seq_length=max_seq_length,
            calibration=calibration,
            cache_dir=cache_dir,
            streams=streams,
        )
    except ExportError as exc:
        if backend is not None or precision is not None or os.environ.get(BACKEND_ENV) or os.environ.get(PRECISION_ENV):
            raise  # the caller named the backend: run that one or fail
        log.warning(
            "embedrank: %s runs on torch%s: it could not be exported to the default backend %s %s (%s). "
            "backend='torch' (%s=torch) selects torch without this warning.",
            spec.model_id,
            f" in one stream (streams={streams} applies to OpenVINO only)" if streams != 1 else "",
            backend_name,
            prec,
            exc.reason,
            BACKEND_ENV,
        )
        fallback = TorchRuntime(converters.load_torch(spec, head, tokenizer), tokenizer, head)
        fallback.fallback_reason = f"could not export to {backend_name} {prec}: {exc.reason}"
        return tokenizer, fallback
    return tokenizer, runtime


def check_streams(streams: int, backend: str, precision: str) -> None:
    """Refuse ``streams`` that the runtime of ``backend``/``precision`` cannot run (:func:`load_transformer`).

    >>> check_streams(2, "openvino", "int8")
    >>> check_streams(2, "onnx", "int8")
    Traceback (most recent call last):
    ...
    embedrank.errors.InvalidInputError: streams=2 applies to backend 'openvino' only (this is 'onnx' int8); leave streams at 1
    """
    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
        raise InvalidInputError(f"streams must be a whole number, 1 or more, not {streams!r}", param="streams")
    if streams != 1 and (backend != "openvino" or precision == AUTO):
        raise InvalidInputError(
            f"streams={streams} applies to backend 'openvino' only (this is {backend!r} {precision}); leave streams at 1",
            param="streams",
        )


class ExportError(UnsupportedModelError):
    """A model torch runs that could not be exported to ``backend`` (the converter's reason attached)."""

    def __init__(self, model_id: str, backend: str, precision: str, reason: str) -> None:
        super().__init__(
            f"could not export {model_id!r} to {backend} {precision} ({reason}); load it with backend='torch'"
        )
        self.reason = reason


def exported_model(
    spec: ModelSpec,
    tokenizer: Any,
    head: Head,
    backend: Backend,
    precision: Precision,
    *,
    max_seq_length: int,
    calibration: Calibration = None,
    cache_dir: str | Path | None = None,
) -> Path:
    """The path of the exported graph (``model.xml`` or ``model.onnx``), exporting it on first use.

    The first export logs what it does and how long it took; later calls find it in the cache.
    """
    if backend == "torch":
        raise ValueError("the torch backend runs the transformers model itself; there is nothing to export")
    static = backend == "openvino" and precision == "int8"  # ONNX int8 is dynamic: no calibration
    texts, source = calibration_texts(calibration) if static else ([], None)
    # bf16 is a compile-time setting of OpenVINO's CPU plugin: it runs the fp32 export
    precision = "fp32" if precision == "bf16" else precision
    root = Path(cache_dir).expanduser() if cache_dir is not None else None
    key = export_key(spec, head, backend, precision, texts)
    target = export_dir(spec, backend, precision, key, root)
    graph = target / ("model.xml" if backend == "openvino" else "model.onnx")
    if graph.is_file():
        return graph
    failed = target.with_name(target.name + ".failed.json")  # an export that failed is not tried again
    if failed.is_file():
        raise ExportError(spec.model_id, backend, precision, json.loads(failed.read_text())["reason"])
    log.warning(
        "embedrank: exporting %s to %s %s (first use; cached in %s)%s",
        spec.model_id,
        backend,
        precision,
        target,
        f", calibrating on {source}" if source else "",
    )
    started = time.perf_counter()

    def build(tmp: Path) -> None:
        try:
            calib = converters.calibration_batches(tokenizer, head, texts, max_seq_length) if static else None
            attention = _convert(spec, tokenizer, head, backend, precision, calib, tmp)
        except (ImportError, MemoryError):
            raise
        except Exception as exc:  # the converters raise many types; all mean this model did not export
            reason = f"{type(exc).__name__}: {converters.first_line(exc)}"
            failed.write_text(json.dumps({"model_id": spec.model_id, "reason": reason}) + "\n")
            raise ExportError(spec.model_id, backend, precision, reason) from exc
        info = {
            "model_id": spec.model_id,
            "path": spec.path,
            "head": head,
            "backend": backend,
            "precision": precision,
            "calibration": source,
            **(
                {"reduce_range": converters.onnx_int8_reduce_range()}
                if (backend, precision) == ("onnx", "int8")
                else {}
            ),
            "attention": attention,
            "versions": {p: _version(p) for p in _VERSIONED[backend]},
            "export_seconds": round(time.perf_counter() - started, 2),
            "key": key,
        }
        (tmp / "export.json").write_text(json.dumps(info, indent=2) + "\n")

    build_directory(target, build, done=graph.name)  # another process's finished export is used as is
    seconds = time.perf_counter() - started
    log.warning("embedrank: exported %s to %s %s in %.1f s", spec.model_id, backend, precision, seconds)
    return graph


def _convert(
    spec: ModelSpec, tokenizer: Any, head: Head, backend: Backend, precision: Precision, calib: Any, out: Path
) -> str:
    """Export into ``out`` and check the graph against torch on a padded example; returns the attention
    implementation used. SDPA first (OpenVINO fuses it; eager attention's matmul/softmax chain ran 1.2x slower
    on SciFact passages here), eager when the architecture has no SDPA (MPNet, DeBERTa-v2) or when the SDPA
    graph disagrees with torch (OpenVINO returned NaN for padded rows of decoders' boolean masks: Gemma3,
    a causal LM's left padding)."""
    example = converters.example_inputs(tokenizer, head)
    if backend == "onnx" and head != "yes-no":  # ONNX Runtime's fused attention, where its optimizer fuses it
        reason = converters.onnx_fused_or_reason(spec, tokenizer, head, example, out, precision)
        if reason is None:
            return "eager, fused by ONNX Runtime"
        log.info("embedrank: %s: no fused ONNX graph (%s); exporting with torch.export", spec.model_id, reason)
    for attention in ("sdpa", "eager"):
        try:
            model = converters.model_to_export(spec, head, tokenizer, attention)
        except ValueError as exc:  # transformers: "... does not support an attention implementation through ..."
            if attention == "sdpa" and "attention" in str(exc):
                continue
            raise
        narrow = converters.Narrow(model, head, "token_type_ids" in example).eval()
        with converters.exporting(spec.model_id):
            if backend == "openvino":
                converters.to_openvino(narrow, example, out, precision, calib)
            else:
                converters.to_onnx(narrow, example, out, precision)
        problem = converters.disagreement(out, backend, precision, narrow, example)
        if problem is None:
            return attention
        if attention == "eager":
            raise RuntimeError(f"the exported graph disagrees with torch on a padded example: {problem}")
        log.info("embedrank: %s with SDPA attention exported wrong (%s); exporting with eager", spec.model_id, problem)
        converters.empty(out)
    raise AssertionError("unreachable")  # pragma: no cover


def load_runtime(
    spec: ModelSpec,
    tokenizer: Any,
    head: Head,
    backend: Backend,
    precision: Precision,
    *,
    streams: int = 1,
    **options: Any,
) -> Any:
    """An :class:`~embedrank.runtime.backends.OpenVINORuntime` (with ``streams``) or ``ONNXRuntime`` on the
    (cached) export; ``options`` are :func:`exported_model`'s (``max_seq_length``, ``calibration``,
    ``cache_dir``)."""
    from embedrank.runtime.backends import ONNXRuntime, OpenVINORuntime

    graph = exported_model(spec, tokenizer, head, backend, precision, **options)
    if backend == "openvino":
        return OpenVINORuntime(graph, precision, cache_dir=graph.parent / "compiled", streams=streams)
    return ONNXRuntime(graph, precision)


def auto_runtime(
    spec: ModelSpec,
    tokenizer: Any,
    head: Head,
    backend: str,
    precision: str,
    *,
    max_seq_length: int,
    calibration: Calibration = None,
    cache_dir: str | Path | None = None,
) -> Runtime:
    """The runtime ``backend``/``precision`` ``"auto"`` chooses (:mod:`embedrank.runtime.auto`), measured on
    first use and cached beside the exports; the decision is the runtime's ``auto_choice``."""
    import importlib.util

    from embedrank.runtime import auto
    from embedrank.runtime.cpus import cpu_identity, isa_limits

    cpu, flags = cpu_identity()
    options = auto.candidates(
        backend, precision, cpu_flags=flags, installed=lambda module: importlib.util.find_spec(module) is not None
    )
    texts, sample = calibration_texts(calibration)  # once: the int8 exports calibrate on the same texts
    facts = {
        "recipe": [RECIPE, auto.RECIPE],
        "model": [spec.path, weights_fingerprint(spec.path)]
        + (_adapter_facts(spec.merged_adapter) if spec.merged_adapter is not None else []),
        "head": head,
        "window": max_seq_length,
        "options": options,
        "cpu": [cpu, flags, int(torch.get_num_threads()), isa_limits()],
        "versions": {p: _version(p) for p in sorted(set(_VERSIONED["openvino"] + _VERSIONED["onnx"]))},
        "texts": hashlib.sha256("\x00".join(texts).encode()).hexdigest(),
    }
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    cache = export_dir(spec, "auto", "auto", key, Path(cache_dir).expanduser() if cache_dir else None)  # type: ignore[arg-type]

    def load(b: Backend, p: Precision) -> Runtime:
        if b == "torch":
            return TorchRuntime(converters.load_torch(spec, head, tokenizer), tokenizer, head)
        return load_runtime(
            spec, tokenizer, head, b, p, max_seq_length=max_seq_length, calibration=calibration, cache_dir=cache_dir
        )

    work = auto.workload(tokenizer, head, texts, max_seq_length, spec.pooling, sample=sample)
    runtime, choice = auto.choose(spec.model_id, options, load, work, cache.with_name(cache.name + ".json"))
    runtime.auto_choice = choice  # type: ignore[attr-defined]
    return runtime
