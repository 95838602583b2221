#!/usr/bin/env python
"""Which layers of the packaged MiniLM's ONNX int8 graph lose the most, and what keeping them in fp32 buys and
costs: ONNX Runtime's dynamic int8 of the fused fp32 graph (the one ``backend="onnx"`` exports), side by side.

For 8-bit weights (CPUs with VNNI/AMX) and 7-bit weights (``reduce_range``, what embedrank exports on an
AVX2-only CPU; the integers VNNI computes from them are the ones AVX2's kernels compute):

1. each quantizable node left in fp32 alone (every other one int8), ranked by how much of the int8 graph's
   loss it removes on the packaged sample (1 - cosine to fp32, mean over the sample's texts): the *sensitive*
   layers, measured on what embedrank ships, not on the held-out data;
2. the ``--keep`` most sensitive ones left in fp32, per-channel against per-tensor weights, judged on held-out
   SciFact (documents searched by test queries, top-10 overlap and cosine to fp32; the bound ``auto`` holds:
   cosine >= 0.98, overlap >= 0.9);
3. speed of those graphs on this CPU (passages and queries, batch 32, systems alternated, medians), against
   the full int8 graph and fp32.

    python eval/bench_int8_layers.py           # needs SciFact in $EMBEDRANK_DATA
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import embedrank.openmp  # noqa: F401  before torch, as in the server

QUANTIZABLE = ("Attention", "MatMul", "Gather", "EmbedLayerNormalization")


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passages", type=int, default=400, help="held-out SciFact documents")
    p.add_argument("--queries", type=int, default=300, help="held-out SciFact test queries")
    p.add_argument("--keep", type=int, nargs="+", default=[1, 2, 4, 6], help="how many sensitive nodes stay fp32")
    p.add_argument("--rounds", type=int, default=3, help="speed rounds (systems alternated in each)")
    args = p.parse_args(argv)
    # onnxruntime.quantization advises shape pre-processing on every call (for static quantization of CNNs)
    logging.getLogger().addFilter(lambda record: "pre-processing" not in record.getMessage())

    import numpy as np
    import onnx
    import pandas as pd
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from embedrank import Encoder
    from embedrank.runtime.auto import BOUNDS
    from embedrank.runtime.backends import ONNXRuntime
    from embedrank.runtime.cpus import cpu_identity
    from embedrank.runtime.exports import CALIBRATION_SIZE
    from embedrank.texts import packaged_sample, seeded_sample
    from eval.harness.held_out import held_out_agreement, scifact_held_out

    held_docs, held_queries, _, _ = scifact_held_out(args.passages, args.queries)  # bench_calibration's
    sample = seeded_sample(packaged_sample(), CALIBRATION_SIZE)
    work = Path(tempfile.mkdtemp(prefix="embedrank-int8-layers-"))

    enc = Encoder.from_pretrained(backend="onnx", precision="fp32", cache_dir=work / "cache")
    fp32_graph = enc.runtime.path
    fp32_runtime = enc.runtime
    kinds = {n.name: n.op_type for n in onnx.load(str(fp32_graph), load_external_data=False).graph.node}
    nodes = [name for name, kind in kinds.items() if kind in QUANTIZABLE]

    def vectors(runtime: ONNXRuntime, texts: list[str]) -> np.ndarray:
        enc.runtime = runtime
        return enc.encode(texts, batch_size=32, show_progress=False)

    def int8(name: str, *, reduce_range: bool, per_channel: bool = True, exclude: Sequence[str] = ()) -> ONNXRuntime:
        target = work / f"{name}.onnx"
        quantize_dynamic(
            str(fp32_graph),
            str(target),
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
            reduce_range=reduce_range,
            nodes_to_exclude=list(exclude),
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        return ONNXRuntime(target, "int8")

    want_sample = vectors(fp32_runtime, sample)
    want_docs, want_queries = vectors(fp32_runtime, held_docs), vectors(fp32_runtime, held_queries)

    def sample_loss(runtime: ONNXRuntime) -> float:
        return float(np.mean(1 - np.sum(want_sample * vectors(runtime, sample), axis=1)))

    def held_out(runtime: ONNXRuntime) -> dict[str, Any]:
        return held_out_agreement(want_docs, vectors(runtime, held_docs), want_queries, vectors(runtime, held_queries))

    cpu, _ = cpu_identity()
    print(
        f"MiniLM's fused ONNX graph, dynamic int8 against its fp32 on {cpu}; {len(nodes)} quantizable nodes; "
        f"sensitivity on the packaged sample ({len(sample)} texts); held out: {len(held_docs)} SciFact documents, "
        f"{len(held_queries)} test queries (top 10); bound {BOUNDS['cosine']} cosine / {BOUNDS['overlap']} overlap",
        flush=True,
    )
    speed_systems: dict[str, Any] = {"fp32": fp32_runtime}
    rows = []
    for bits, reduce_range in (("8-bit", False), ("7-bit", True)):
        full = int8(f"full-{bits}", reduce_range=reduce_range)
        full_loss = sample_loss(full)
        gains = []
        for node in nodes:
            loss = sample_loss(
                int8(f"without-{node}-{bits}".replace("/", "_"), reduce_range=reduce_range, exclude=[node])
            )
            gains.append((full_loss - loss, node))
        gains.sort(reverse=True)
        print(
            f"\n{bits} weights: sample loss (1 - cos, mean) of the full int8 graph {full_loss:.6f}; each node left "
            "in fp32 alone, the share of that loss it removes (top 10):"
        )
        for gain, node in gains[:10]:
            print(f"  {node:<52} {kinds[node]:<10} {gain / full_loss:6.1%}")
        rows.append(
            {"weights": bits, "variant": "per-channel (embedrank's)", "sample loss": full_loss, **held_out(full)}
        )
        speed_systems[f"int8 {bits}"] = full
        tensor = int8(f"per-tensor-{bits}", reduce_range=reduce_range, per_channel=False)
        rows.append({"weights": bits, "variant": "per-tensor", "sample loss": sample_loss(tensor), **held_out(tensor)})
        for keep in args.keep:
            kept = [node for _, node in gains[:keep]]
            runtime = int8(f"keep{keep}-{bits}", reduce_range=reduce_range, exclude=kept)
            variant = f"{keep} most sensitive in fp32"
            rows.append({"weights": bits, "variant": variant, "sample loss": sample_loss(runtime), **held_out(runtime)})
            speed_systems[f"int8 {bits}, {keep} in fp32"] = runtime
    print()
    table = pd.DataFrame(rows).set_index(["weights", "variant"])
    print(table.to_string(float_format=lambda v: f"{v:.5f}"), flush=True)

    timings: dict[str, dict[str, list[float]]] = {name: {"passages": [], "queries": []} for name in speed_systems}
    passages, queries = held_docs[:256], held_queries[:256]
    for _ in range(args.rounds):
        for name, runtime in speed_systems.items():
            for kind, texts in (("passages", passages), ("queries", queries)):
                vectors(runtime, texts[:32])  # warm
                started = time.perf_counter()
                vectors(runtime, texts)
                timings[name][kind].append(len(texts) / (time.perf_counter() - started))
    base = {kind: statistics.median(timings["fp32"][kind]) for kind in ("passages", "queries")}
    print(
        f"\nspeed on this CPU ({cpu}), texts/s, medians of {args.rounds} alternated rounds, batch 32 "
        f"(7-bit weights run VNNI's kernels here: not an AVX2 speed)"
    )
    speed = pd.DataFrame(
        {
            name: {
                **{f"{kind}/s": statistics.median(t[kind]) for kind in t},
                **{f"{kind} x fp32": statistics.median(t[kind]) / base[kind] for kind in t},
            }
            for name, t in timings.items()
        }
    ).T
    print(speed.to_string(float_format=lambda v: f"{v:.2f}"))
    full, kept = (
        table.loc[("7-bit", "per-channel (embedrank's)")],
        table.loc[("7-bit", f"{args.keep[0]} most sensitive in fp32")],
    )
    fast, slow = speed.loc["int8 7-bit"], speed.loc[f"int8 7-bit, {args.keep[0]} in fp32"]
    print(
        f"\nsummary, 7-bit weights (AVX2's): held-out overlap {full['held-out overlap']:.4f} (in bound: "
        f"{full['held-out in bound']}), {args.keep[0]} most sensitive in fp32 {kept['held-out overlap']:.4f} (in bound: "
        f"{kept['held-out in bound']}); speed x fp32 on this CPU: queries {fast['queries x fp32']:.2f} -> "
        f"{slow['queries x fp32']:.2f}, passages {fast['passages x fp32']:.2f} -> {slow['passages x fp32']:.2f}"
    )


if __name__ == "__main__":
    raise SystemExit(run())
