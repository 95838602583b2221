#!/usr/bin/env python
"""OpenVINO's performance hints side by side on the packaged MiniLM: ``LATENCY`` (one stream using every thread,
what embedrank compiles) against ``THROUGHPUT`` (as many streams as OpenVINO chooses for the threads, each
batch split in equal parts run at once, one infer request per stream), fp32 and int8, on SciFact passages and
queries in batches of 32 (throughput) and one text at a time (latency). Systems alternated in each round;
medians.

    python -m eval bench ov-hints            # needs SciFact in $EMBEDRANK_DATA
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import embedrank.openmp  # noqa: F401  before torch, as in the server


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passages", type=int, default=256, help="SciFact documents per round")
    p.add_argument("--queries", type=int, default=512, help="SciFact queries per round")
    p.add_argument("--single", type=int, default=64, help="texts sent one at a time per round (latency)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)

    import numpy as np
    import openvino as ov
    import pandas as pd
    import torch

    from embedrank import Encoder
    from embedrank.retrieval.data import default_data_dir, doc_text, load_beir
    from embedrank.runtime.cpus import cpu_identity

    root = default_data_dir()
    if root is None or not (root / "scifact" / "corpus.jsonl").is_file():
        raise SystemExit("needs SciFact in the data directory ($EMBEDRANK_DATA): python eval/get_data.py fetch scifact")
    scifact = load_beir(root / "scifact")
    texts = {
        "passages": [doc_text(d) for d in list(scifact.corpus.values())[: args.passages]],
        "queries": list(scifact.queries.values())[: args.queries],
    }
    cache = tempfile.mkdtemp(prefix="embedrank-ov-hints-")
    core = ov.Core()
    threads = torch.get_num_threads()

    def measure(precision: str) -> list[dict[str, Any]]:
        enc = Encoder.from_pretrained(backend="openvino", precision=precision, cache_dir=cache)
        path = enc.runtime.path  # type: ignore[attr-defined]
        compiled = {
            hint: core.compile_model(
                str(path),
                "CPU",
                {"PERFORMANCE_HINT": hint, "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"},
            )
            for hint in ("LATENCY", "THROUGHPUT")
        }
        streams = int(compiled["THROUGHPUT"].get_property("NUM_STREAMS"))
        names = [port.any_name for port in compiled["LATENCY"].inputs]
        requests = {hint: [c.create_infer_request() for _ in range(streams)] for hint, c in compiled.items()}

        def batches(items: list[str], size: int) -> list[dict[str, np.ndarray]]:
            out = []
            for i in range(0, len(items), size):
                features = enc.tokenize(items[i : i + size]).features  # padded and cut as Encoder.encode feeds them
                out.append({n: features[n].numpy().astype(np.int64, copy=False) for n in names})
            return out

        def latency_hint(feeds: list[dict[str, np.ndarray]]) -> None:
            for feed in feeds:
                requests["LATENCY"][0].infer(feed)

        def throughput_hint(feeds: list[dict[str, np.ndarray]]) -> None:
            for feed in feeds:
                parts = [rows for rows in np.array_split(np.arange(len(feed[names[0]])), streams) if len(rows)]
                for request, part in zip(requests["THROUGHPUT"], parts, strict=False):
                    request.start_async({n: v[part] for n, v in feed.items()})
                for request in requests["THROUGHPUT"][: len(parts)]:
                    request.wait()

        systems: dict[str, Callable[[list[dict[str, np.ndarray]]], None]] = {
            "LATENCY (embedrank's)": latency_hint,
            f"THROUGHPUT ({streams} streams)": throughput_hint,
        }
        work = {
            "passages, batch 32": batches(texts["passages"], 32),
            "queries, batch 32": batches(texts["queries"], 32),
            "query, one at a time": batches(texts["queries"][: args.single], 1),
        }
        timings: dict[tuple[str, str], list[float]] = {(s, w): [] for s in systems for w in work}
        for feeds in work.values():  # warm both
            for run in systems.values():
                run(feeds[:2])
        for _ in range(args.rounds):
            for workload, feeds in work.items():
                for system, run in systems.items():
                    started = time.perf_counter()
                    run(feeds)
                    timings[system, workload].append(time.perf_counter() - started)
        rows = []
        for workload, feeds in work.items():
            count = sum(len(f[names[0]]) for f in feeds)
            base = statistics.median(timings["LATENCY (embedrank's)", workload])
            for system in systems:
                seconds = statistics.median(timings[system, workload])
                rows.append(
                    {
                        "precision": precision,
                        "workload": workload,
                        "hint": system,
                        "texts/s": count / seconds,
                        "ms per batch": seconds / len(feeds) * 1000,
                        "x LATENCY": base / seconds,
                    }
                )
        return rows

    rows = measure("fp32") + measure("int8")
    cpu, _ = cpu_identity()
    print(f"MiniLM on OpenVINO, {threads} threads, on {cpu}; medians of {args.rounds} alternated rounds")
    table = pd.DataFrame(rows).set_index(["precision", "workload", "hint"])
    print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    summary: dict[str, Any] = {
        key: table.loc[(precision, workload), "x LATENCY"].iloc[1]
        for key, (precision, workload) in {
            "fp32 passages": ("fp32", "passages, batch 32"),
            "fp32 queries": ("fp32", "queries, batch 32"),
            "fp32 single": ("fp32", "query, one at a time"),
            "int8 passages": ("int8", "passages, batch 32"),
            "int8 queries": ("int8", "queries, batch 32"),
        }.items()
    }
    print(
        "\nsummary: THROUGHPUT to LATENCY: fp32 passages {fp32 passages:.2f}x, queries {fp32 queries:.2f}x; int8 "
        "passages {int8 passages:.2f}x, queries {int8 queries:.2f}x; one query at a time {fp32 single:.2f}x".format(
            **summary
        )
    )


if __name__ == "__main__":
    raise SystemExit(run())
