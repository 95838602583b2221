#!/usr/bin/env python
"""Where an OpenVINO forward pass spends its time: per-operation-type shares from the CPU plugin's own
performance counters (``PERF_COUNT``), and the achieved arithmetic rate against the model's FLOPs.

One fixed batch (``--batch`` x ``--tokens``, random token ids, no padding) of the packaged MiniLM per
``--precisions`` entry, timed over ``--repeats`` runs after a warm-up; the torch forward on the same batch is
timed alongside for the ratio. FLOPs are counted from the model's shapes: per token and layer, the
Q/K/V/output projections and the feed-forward (``2 x (4 H^2 + 2 H F)``) plus attention's two matrix
products (``2 x 2 T H``).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "int8"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--top", type=int, default=6, help="operation types listed per precision")
    args = p.parse_args()
    import numpy as np
    import openvino as ov
    import torch

    from embedrank import Encoder

    reference = Encoder.from_pretrained(backend="torch")
    config = reference.model.config  # type: ignore[union-attr]
    hidden, ffn, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    tokens = args.batch * args.tokens
    flops = tokens * layers * 2 * (4 * hidden * hidden + 2 * hidden * ffn + 2 * args.tokens * hidden)
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 20000, size=(args.batch, args.tokens), dtype=np.int64)
    features = {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.ones(ids.shape, dtype=torch.int64),
        "token_type_ids": torch.zeros(ids.shape, dtype=torch.int64),
    }

    def timed(run) -> float:
        run()
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    torch_s = timed(lambda: reference.forward(features))
    print(
        f"batch {args.batch} x {args.tokens} tokens, {flops / 1e9:.0f} GFLOP per forward; "
        f"torch fp32 {1000 * torch_s:.0f} ms ({flops / torch_s / 1e9:.0f} GFLOP/s)"
    )
    core = ov.Core()
    for precision in args.precisions:
        enc = Encoder.from_pretrained(backend="openvino", precision=precision)
        runtime = enc.runtime
        hint = "bf16" if precision == "bf16" else "f32"
        compiled = core.compile_model(
            str(runtime.path),  # type: ignore[attr-defined]
            "CPU",
            {
                "INFERENCE_PRECISION_HINT": hint,
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_NUM_THREADS": torch.get_num_threads(),
                "PERF_COUNT": True,
            },
        )
        request = compiled.create_infer_request()
        feed = {port.any_name: features[port.any_name].numpy() for port in compiled.inputs}
        seconds = timed(lambda feed=feed, request=request: request.infer(feed))
        by_type: collections.Counter[str] = collections.Counter()
        for info in request.profiling_info:
            by_type[f"{info.node_type} ({info.exec_type.split('_')[0]})"] += info.real_time.total_seconds()
        total = sum(by_type.values()) or 1.0
        shares = ", ".join(f"{name} {100 * t / total:.0f}%" for name, t in by_type.most_common(args.top))
        print(
            f"openvino {precision:<4} ({runtime.inference_precision}): {1000 * seconds:.0f} ms, "
            f"{flops / seconds / 1e9:.0f} GFLOP/s, {torch_s / seconds:.2f}x torch | {shares}"
        )


if __name__ == "__main__":
    main()
