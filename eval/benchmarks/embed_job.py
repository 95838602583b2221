#!/usr/bin/env python
"""Throughput of the corpus embedding job: the local runner against the Ray runner (1 actor, then
``--actors`` actors), on the first ``--docs`` documents of a BEIR collection, alternating rounds
(local, ray x1, ray xN, local, ...) because this machine's speed drifts; medians are printed.

Each Ray run starts its actors (one model load each) inside the timed job, as a real job does; the
startup is reported apart, from the per-actor model-load time, so the steady per-worker rate is visible.

    python -m eval bench embed-job scifact --docs 2000 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", nargs="?", default="scifact", help="BEIR collection name or path (default: scifact)")
    p.add_argument(
        "--data-dir",
        help="directory holding BEIR collections (default: $EMBEDRANK_DATA, else ~/.local/share/embedrank)",
    )
    p.add_argument("--docs", type=int, default=2000, help="documents embedded per run (default: 2000)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (default: 2)")
    p.add_argument("--actors", type=int, default=2, help="actors of the second Ray configuration (default: 2)")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="CPUs given to the local Ray instance")
    args = p.parse_args(argv)

    from pathlib import Path

    import pandas as pd
    import ray
    import torch

    from embedrank import Encoder
    from embedrank.retrieval.data import resolve_dataset
    from embedrank.retrieval.embed_job import embed_collection
    from embedrank.retrieval.embed_ray import embed_collection_ray

    work = Path(tempfile.mkdtemp(prefix="bench-embed-job-"))
    source = resolve_dataset(args.dataset, args.data_dir) / "corpus.jsonl"
    with open(source, encoding="utf-8") as f, open(work / "corpus.jsonl", "w", encoding="utf-8") as out:
        for _, line in zip(range(args.docs), f, strict=False):
            out.write(line)
    corpus = work / "corpus.jsonl"
    model = "sentence-transformers/all-MiniLM-L6-v2"
    t0 = time.perf_counter()
    encoder = Encoder.from_pretrained(model)
    load_s = time.perf_counter() - t0
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    # jsonl reading takes 0.25 CPU per task: the actors share the rest
    per_actor = min(1.0, (args.cpus - 0.25) / args.actors)
    configs = {
        f"local ({torch.get_num_threads()} torch threads)": lambda out: embed_collection(encoder, corpus, out),
        "ray, 1 actor x 1 CPU": lambda out: embed_collection_ray(model, corpus, out, concurrency=1, num_cpus=1),
        f"ray, {args.actors} actors x {per_actor:g} CPU": lambda out: embed_collection_ray(
            model, corpus, out, concurrency=args.actors, num_cpus=per_actor
        ),
    }
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(args.rounds):
        for i, (name, run) in enumerate(configs.items()):
            t0 = time.perf_counter()
            run(work / f"out-{r}-{i}")
            seconds[name].append(time.perf_counter() - t0)
    ray.shutdown()
    rows = []
    for name, times in seconds.items():
        s = statistics.median(times)
        workers = args.actors if name.startswith(f"ray, {args.actors}") else 1
        rows.append(
            {
                "runner": name,
                "median s": round(s, 1),
                "docs/s": round(args.docs / s, 1),
                "docs/s per worker": round(args.docs / s / workers, 1),
                "runs (s)": " ".join(f"{t:.1f}" for t in times),
            }
        )
    print(f"{args.docs} {args.dataset} documents, {args.rounds} alternating rounds; one model load took {load_s:.1f} s")
    print(pd.DataFrame(rows).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
