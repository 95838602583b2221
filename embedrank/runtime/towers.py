"""The two towers of an image-text model (CLIP, SigLIP) on a runtime: torch, or each tower exported to
OpenVINO or ONNX once and cached, as :mod:`embedrank.runtime.exports` caches encoders.

Each tower is exported with its projection (``get_text_features``, ``get_image_features``): the text tower
takes ``input_ids`` and ``attention_mask`` (batch and length dynamic), the vision tower the processor's pixel
tensors (batch dynamic). An export is checked against torch on two batches of different sizes (and text
lengths) before it is kept; one that disagrees or fails to convert is refused with the converter's reason
(SigLIP2's NaFlex vision tower resizes its position embeddings per image in Python, which a traced graph
bakes to the example's shapes: it runs in torch only).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedrank.paths import build_directory, default_cache_dir
from embedrank.registry import ModelSpec
from embedrank.runtime import converters
from embedrank.runtime.exports import ExportError, export_dir, export_key

log = logging.getLogger("embedrank.exports")

RECIPE = 1  # bumped when the way towers are exported changes
TOWERS = ("text", "image")
# an export is kept when it equals torch to this share of the output's scale on both check batches
AGREEMENT = 1e-4


def projected(out: Any) -> torch.Tensor:
    """A tower's projected vectors: transformers 5 returns them as ``pooler_output``, older versions bare."""
    return out.pooler_output if hasattr(out, "pooler_output") else out


class TorchTowers:
    """The towers of a transformers CLIP/SigLIP model run in torch: ``text(features)`` and ``image(pixels)``
    give the projected vectors ``(B, D)`` as fp32 tensors; ``bf16``: computed under bf16 autocast (the weights
    stay fp32)."""

    backend = "torch"
    fallback_reason: str | None = None  # why the towers run on torch although no backend was named

    def __init__(self, module: Any, precision: str = "fp32") -> None:
        self.module, self.precision = module, precision
        self.inference_precision = "bf16" if precision == "bf16" else "f32"

    def _autocast(self) -> Any:
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.precision == "bf16")

    def text(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.inference_mode(), self._autocast():
            return projected(self.module.get_text_features(**features)).float()

    def image(self, pixels: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.inference_mode(), self._autocast():
            return projected(self.module.get_image_features(**pixels)).float()


class _Tower(torch.nn.Module):
    """One tower as a module of positional inputs named ``names`` (what a converter traces)."""

    def __init__(self, module: Any, tower: str, names: Sequence[str]) -> None:
        super().__init__()
        self.module, self.tower, self.names = module, tower, tuple(names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        given = dict(zip(self.names, inputs, strict=True))
        run = self.module.get_text_features if self.tower == "text" else self.module.get_image_features
        return projected(run(**given))


class ExportedTowers:
    """Both towers as exported graphs (``text.xml``/``image.xml`` or ``.onnx``), compiled for the CPU; OpenVINO
    ``bf16`` compiles the fp32 graph to compute in bf16 where the CPU has it (AVX512_BF16, AMX), in fp32 where
    it does not (``inference_precision`` says which)."""

    def __init__(self, folder: Path, backend: str, precision: str = "fp32") -> None:
        self.backend, self.path, self.precision = backend, folder, precision
        self.inference_precision = "f32"
        self._local = threading.local()
        self.runs: dict[str, Any] = {}
        self.names: dict[str, list[str]] = {}
        for tower in TOWERS:
            if backend == "openvino":
                import openvino as ov

                hint = "bf16" if precision == "bf16" else "f32"
                config = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"}
                config["INFERENCE_NUM_THREADS"] = torch.get_num_threads()  # type: ignore[assignment]
                compiled = ov.Core().compile_model(str(folder / f"{tower}.xml"), "CPU", config)
                self.inference_precision = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
                self.runs[tower] = compiled
                self.names[tower] = [port.any_name for port in compiled.inputs]
            else:
                import onnxruntime as ort

                options = ort.SessionOptions()
                options.intra_op_num_threads = torch.get_num_threads()
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
                session = ort.InferenceSession(
                    str(folder / f"{tower}.onnx"), options, providers=["CPUExecutionProvider"]
                )
                self.runs[tower] = session
                self.names[tower] = [i.name for i in session.get_inputs()]

    def _run(self, tower: str, given: dict[str, torch.Tensor]) -> torch.Tensor:
        feed = {name: given[name].cpu().numpy() for name in self.names[tower]}
        if self.backend == "onnx":
            out = self.runs[tower].run(None, feed)[0]
        else:
            requests = self._local.__dict__.setdefault("requests", {})
            request = requests.get(tower) or requests.setdefault(tower, self.runs[tower].create_infer_request())
            out = request.infer(feed)[0]
        return torch.from_numpy(np.array(out, dtype=np.float32, copy=True))

    def text(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._run("text", features)

    def image(self, pixels: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._run("image", pixels)


def _convert(module: Any, tower: str, examples: Sequence[dict[str, torch.Tensor]], backend: str, out: Path) -> None:
    names = list(examples[0])
    wrapped = _Tower(module, tower, names).eval()
    first = tuple(examples[0][n] for n in names)
    with converters.exporting(f"{tower} tower"):
        if backend == "openvino":
            import openvino as ov

            graph = ov.convert_model(wrapped, example_input=first)
            for port, name in zip(graph.inputs, names, strict=True):
                port.get_tensor().set_names({name})
            ov.save_model(graph, str(out / f"{tower}.xml"), compress_to_fp16=False)
        else:
            converters.require("onnxscript", "onnx", "the ONNX backend's exporter")
            auto = torch.export.Dim.AUTO
            program = torch.onnx.export(
                wrapped,
                first,
                input_names=names,
                output_names=["embeddings"],
                # one entry for forward's *inputs, a dict of dynamic axes per tensor in it
                dynamic_shapes=(tuple({0: auto, 1: auto} if tower == "text" else {0: auto} for _ in names),),
                dynamo=True,
                optimize=True,
                verbose=False,
            )
            assert program is not None
            program.save(str(out / f"{tower}.onnx"))


def _disagreement(
    towers: ExportedTowers, reference: TorchTowers, tower: str, examples: Sequence[dict[str, torch.Tensor]]
) -> str | None:
    for example in examples:
        want = getattr(reference, tower)(example)
        got = getattr(towers, tower)(example)
        scale = float(want.abs().max()) or 1.0
        worst = float((got - want).abs().max()) / scale
        if got.shape != want.shape or not worst <= AGREEMENT:
            return f"the {tower} tower differs from torch by {worst:.2e} of its scale on a batch of {want.shape[0]}"
    return None


def exported_towers(
    spec: ModelSpec,
    module: Any,
    backend: str,
    examples: dict[str, Sequence[dict[str, torch.Tensor]]],
    *,
    precision: str = "fp32",
    cache_dir: str | Path | None = None,
) -> ExportedTowers:
    """Both towers of ``module`` exported to ``backend`` (``openvino`` or ``onnx``), from the cache when they
        were before; ``examples`` holds two check batches per tower (``text``: features, ``image``: pixels). The
    export is fp32 (checked against torch); OpenVINO ``precision`` ``bf16`` compiles it to compute in bf16.

        Raises:
            ExportError: a tower did not convert, or its graph differs from torch (the reason is kept, so a later
                load does not try again).
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    key = export_key(spec, "towers", backend, "fp32", [], recipe=RECIPE)  # type: ignore[arg-type]
    target = export_dir(spec, backend, "fp32", key, root)  # type: ignore[arg-type]
    done = f"image.{'xml' if backend == 'openvino' else 'onnx'}"
    failed = target.with_name(target.name + ".failed.json")
    if failed.is_file():
        raise ExportError(spec.model_id, backend, "fp32", json.loads(failed.read_text())["reason"])
    if not (target / done).is_file():
        log.warning(
            "embedrank: exporting the towers of %s to %s (first use; cached in %s)", spec.model_id, backend, target
        )
        started = time.perf_counter()

        def build(tmp: Path) -> None:
            try:
                for tower in TOWERS:
                    _convert(module, tower, examples[tower], backend, tmp)
                built = ExportedTowers(tmp, backend)
                reference = TorchTowers(module)
                problem = next(
                    (p for t in TOWERS if (p := _disagreement(built, reference, t, examples[t])) is not None), None
                )
                if problem is not None:
                    raise RuntimeError(problem)
            except (ImportError, MemoryError):
                raise
            except Exception as exc:  # the converters raise many types; all mean this model did not export
                reason = f"{type(exc).__name__}: {converters.first_line(exc)}"
                failed.write_text(json.dumps({"model_id": spec.model_id, "reason": reason}) + "\n")
                raise ExportError(spec.model_id, backend, "fp32", reason) from exc
            info = {
                "model_id": spec.model_id,
                "backend": backend,
                "export_seconds": round(time.perf_counter() - started, 2),
            }
            (tmp / "export.json").write_text(json.dumps(info, indent=2) + "\n")

        build_directory(target, build, done=done)
    return ExportedTowers(target, backend, precision)


# precision "auto" keeps bf16 when every check vector is at least this close to fp32's (cosine)
AUTO_BF16_COSINE = 0.999


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """What precision ``auto`` chose for an image-text model's towers, and why (``summary``: one line)."""

    precision: str
    summary: str


def choose_precision(
    folder: Path, backend: str, fp32: ExportedTowers, examples: dict[str, Sequence[dict[str, torch.Tensor]]]
) -> ExportedTowers:
    """``auto``: the OpenVINO towers compiled for bf16 when the CPU computes bf16 natively and every check
    vector stays within :data:`AUTO_BF16_COSINE` of fp32's, else ``fp32``; the result's ``auto_choice`` says
    which and why."""
    reason = "ONNX Runtime has no bf16 here"
    if backend == "openvino":
        half = ExportedTowers(folder, backend, "bf16")
        if half.inference_precision != "bf16":
            reason = "this CPU has no native bf16 (AVX512_BF16 or AMX): OpenVINO would compute fp32"
        else:
            worst = min(
                float(torch.nn.functional.cosine_similarity(getattr(half, t)(e), getattr(fp32, t)(e)).min())
                for t in TOWERS
                for e in examples[t]
            )
            if worst >= AUTO_BF16_COSINE:
                half.auto_choice = PrecisionChoice(  # type: ignore[attr-defined]
                    "bf16",
                    f"openvino bf16: the CPU computes bf16; lowest cosine to fp32 on the check batches {worst:.5f}",
                )
                return half
            reason = f"bf16's lowest cosine to fp32 on the check batches is {worst:.5f}, under {AUTO_BF16_COSINE}"
    fp32.auto_choice = PrecisionChoice("fp32", f"{backend} fp32: {reason}")  # type: ignore[attr-defined]
    return fp32
