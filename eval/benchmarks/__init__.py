"""The benchmarks, one module each (each exposes ``run(argv)``), and the registry that names every record:
which module (or quality check) it runs, with which arguments, under which title.

``python -m eval bench NAME`` runs a record's command; ``python -m eval record NAME`` (``make bench NAME=...``)
runs it through the recorder into ``eval/results/NAME.json`` and renders the pages. A record whose kernels are
held to AVX2 runs under ``tests/as_avx2.sh``.
"""

from __future__ import annotations

import dataclasses
import shlex


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One record: ``eval/results/{name}.json``, titled ``title``, made by ``module``'s ``entry`` with ``args``."""

    name: str
    module: str
    title: str
    args: tuple[str, ...] = ()
    about: str = ""
    avx2: bool = False  # kernels held to AVX2 (tests/as_avx2.sh), the CPU's AVX-512 and AMX flags hidden
    entry: str = "run"

    @property
    def command(self) -> list[str]:
        """The command the record shows (run from the repository's root)."""
        return ["python", "-m", "eval", "bench", self.name]


def _bench(name: str, title: str, args: str = "", about: str = "", module: str = "", avx2: bool = False) -> Benchmark:
    """A benchmark of this package: ``eval.benchmarks.<module>`` (the name's own by default)."""
    module = f"eval.benchmarks.{module or name.replace('-', '_')}"
    return Benchmark(name, module, title, tuple(shlex.split(args)), about, avx2)


def _quality(name: str, title: str, args: str = "", about: str = "", module: str = "", avx2: bool = False) -> Benchmark:
    """A quality record: ``eval/run.py`` (the quality CLI, its ``main``) or ``eval.quality.<module>``."""
    if not module:
        return Benchmark(name, "eval.run", title, tuple(shlex.split(args)), about, avx2, entry="main")
    return Benchmark(name, f"eval.quality.{module}", title, tuple(shlex.split(args)), about, avx2)


ENCODE = "--rounds 2 --systems torch:fp32 openvino:fp32 openvino:int8 onnx:fp32 onnx:int8 auto:auto"
METRICS = "--metrics ndcg@10 recall@100"
THREE = "scifact nfcorpus-preprocessed-partial cranfield"
SERVED = "--dense-windows --bm25-windows --served-store local --served-chunking static:254:32"

BENCHMARKS = (
    # retrieval quality (eval/run.py) and the quality checks beside it
    _quality(
        "quality",
        "Retrieval quality: SciFact, NFCorpus and Cranfield, dense, BM25 and hybrid",
        f"{THREE} --retriever dense bm25 hybrid {METRICS}",
        about="the reference evaluations on $EMBEDRANK_DATA (make eval runs them with quality-dl19 and quantization)",
    ),
    _quality(
        "quality-dl19",
        "Retrieval quality: TREC DL19, BM25 and BM25 reranked",
        "trec-dl19-passage-bm25top100 --retriever bm25 --reranker sentence-transformers/all-MiniLM-L6-v2",
    ),
    _quality(
        "quality-auto-avx2-emulated",
        "Retrieval quality with auto, kernels held to AVX2",
        f"scifact --retriever dense --backend auto --precision auto {METRICS}",
        about="SciFact with backend and precision auto, kernels held to AVX2",
        avx2=True,
    ),
    _quality(
        "quality-store",
        "Quality through a served vector store, against the library's own runs",
        f"{THREE} --retriever dense bm25 hybrid {SERVED} --served-first-stage dense bm25 hybrid",
        about="search through a served vector store against the library's runs (dense, BM25, hybrid)",
    ),
    _quality(
        "quality-store-splade",
        "SPLADE through a served vector store against the library (SciFact)",
        f"scifact --retriever dense bm25 splade hybrid:bm25+dense+splade {SERVED} --served-first-stage splade hybrid"
        " --served-hybrid-weights dense=1 bm25=1 splade=1",
    ),
    _quality("quantization", "Compact vectors: quality of each embedding type", "scifact", module="quantization"),
    _quality(
        "image-parity",
        "Image-text models: towers by backend against sentence-transformers",
        about="CLIP, SigLIP and SigLIP2 by tower and backend against sentence-transformers (docs/models.md)",
        module="image_parity",
    ),
    _quality(
        "support",
        "Support matrix: architectures by backend and precision",
        about="every architecture on every backend and precision against sentence-transformers (docs/models.md)",
        module="support_matrix",
    ),
    # speed in-process
    _bench(
        "encode",
        "Encoding speed by backend and precision (in-process)",
        ENCODE.replace("openvino:fp32", "openvino:fp32 openvino:bf16"),
    ),
    _bench(
        "encode-avx2-emulated",
        "Encoding speed with kernels held to AVX2 (in-process)",
        ENCODE,
        module="encode",
        avx2=True,
    ),
    _bench(
        "encode-streams",
        "Encoding speed with OpenVINO's streams (in-process)",
        "--rounds 2 --queries 1000 --passages 500 --systems openvino:fp32 openvino:fp32:streams=2 openvino:int8"
        " openvino:int8:streams=2",
        about="Encoder.encode with OpenVINO's streams=2 against one stream, fp32 and int8",
        module="encode",
    ),
    _bench(
        "auto-load",
        "auto started on a busy machine: the final choice's speed against the quiet choice's",
        about="backend and precision auto chosen beside two busy loops, then on the quiet machine: SciFact speed",
    ),
    _bench(
        "calibration",
        "int8 calibration samples side by side",
        about="which sample int8 is calibrated and judged on: vocabulary sentences, the packaged sample, SciFact",
    ),
    _bench(
        "calibration-avx2-emulated",
        "int8 calibration samples side by side, kernels held to AVX2",
        module="calibration",
        avx2=True,
    ),
    _bench("int8-layers", "ONNX int8: the most sensitive layers kept in fp32, side by side", "--keep 1 2 4"),
    _bench(
        "ov-hints",
        "OpenVINO's performance hints side by side",
        about="OpenVINO's LATENCY hint (embedrank's) against THROUGHPUT with each batch split across streams",
    ),
    _bench("rerank", "Cross-encoder scoring speed by backend (in-process)", "--rounds 2"),
    _bench(
        "images",
        "Image embeddings: images per second against sentence-transformers",
        about="images per second of CLIP and SigLIP against sentence-transformers, in-process and served",
    ),
    _bench("embed-job", "Corpus embedding job: the local runner against Ray", "scifact --docs 2000 --rounds 2"),
    _bench(
        "adapters",
        "Task adapters: one base with 3 LoRA adapters against the bare base and 3 merged models",
        "--passages 300",
        about="texts/s of mixed-adapter batches against the bare base and one merged model per adapter; memory",
    ),
    _bench(
        "index-memory",
        "Index memory per vector, built from shards",
        "--vectors 1000000 --shard-size 100000",
    ),
    # the service
    _bench(
        "service",
        "HTTP service throughput against in-process encoding",
        "--servers default int8 --clients 32 --rounds 2",
    ),
    _bench(
        "tracing",
        "Tracing's cost: every request traced and exported against no tracing",
        "--servers default traced --clients 32 --rounds 4",
        module="service",
    ),
    _bench("span-cost", "Tracing's CPU per one-query request, the service's tracing code alone"),
    _bench(
        "ceiling",
        "The service's own ceiling: a forward pass that costs nothing",
        "--servers single fronts-1 fronts-2 --clients 1 32 --rounds 2",
        about="the service's load on a zero-cost model (real tokenizer, zero vectors): texts/s, CPU per request by process",
    ),
    _bench("fairness", "Fairness: small requests during a bulk request"),
    _bench(
        "ready",
        "Time to ready: first start and later starts",
        about="time from `litestar run` to ready: a first start on an empty cache, then later starts",
    ),
    _bench("load", "Load: 64 clients, mixed requests"),
    _bench(
        "gpu",
        "GPU: parity, encode speed, the forward pass's matrix rate, the service",
        "--device cuda",
        about="on a machine with a CUDA GPU: parity, encode speed, forward rate, the service (or eval/gpu_check.sh)",
    ),
    # batches and vector stores
    _bench("batch", "Batch jobs: throughput, fairness to direct requests, the embedding cache"),
    _bench("batch-owners", "Batch jobs of two keys: a small batch beside another key's large ones"),
    _bench("batch-validation", "Validating a batch's input file: memory and the event loop"),
    _bench("vector-store", "Vector stores: ingestion, search latency, memory per chunk"),
    _bench("store-filters", "Vector stores: filtered against unfiltered search, every first stage"),
    _bench("store-index", "Vector stores: exact against HNSW search by store size"),
    _bench("pgvector", "Vector stores: pgvector in PostgreSQL against the replica's own index"),
    _bench(
        "long-line",
        "Vector stores: one file of a single 100 MB line, the server's memory and another key's calls",
        about="a 100 MB single-line text file read, chunked and embedded: memory above idle, other keys' p99",
    ),
    _bench(
        "hostile-files",
        "Vector stores: one key's hostile PDFs and another key's calls",
        about="one key's PDF bombs attached to a store: the other key's latency, memory, SIGTERM, restart",
    ),
)

REGISTRY = {b.name: b for b in BENCHMARKS}
