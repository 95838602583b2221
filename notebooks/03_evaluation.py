# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Evaluation on BEIR-layout collections
#
# The same harness as `python eval/run.py` (`embedrank.evaluation.run_benchmark`), on three collections:
#
# | collection | runs | the same settings on the command line |
# |---|---|---|
# | scifact | dense, BM25, hybrid | `python eval/run.py scifact --retriever dense` (and `bm25`, `hybrid`) |
# | trec-dl19-passage-bm25top100 | published BM25 run, BM25 + MiniLM rerank | `python eval/run.py trec-dl19-passage-bm25top100 --retriever bm25 [--reranker sentence-transformers/all-MiniLM-L6-v2]` |
# | adi | dense, BM25, BM25 + MiniLM rerank | `python eval/run.py adi --retriever bm25 --reranker sentence-transformers/all-MiniLM-L6-v2` |
#
# `EMBEDRANK_NOTEBOOK_QUICK=1` (the test suite) limits the DL19 rerank to 10 queries; the committed outputs
# are the full run.

# %%
import os

import matplotlib.pyplot as plt

from embedrank import BenchmarkConfig, DataNotFoundError, resolve_dataset, results_table, run_benchmark

QUICK = os.environ.get("EMBEDRANK_NOTEBOOK_QUICK") == "1"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
try:
    for name in ("scifact", "trec-dl19-passage-bm25top100", "adi"):
        resolve_dataset(name)
except DataNotFoundError as exc:
    raise SystemExit(f"This notebook needs the collections in $EMBEDRANK_DATA.\n{exc}") from None

plan = [
    ("scifact", BenchmarkConfig(retriever="dense")),
    ("scifact", BenchmarkConfig(retriever="bm25")),
    ("scifact", BenchmarkConfig(retriever="hybrid")),
    ("trec-dl19-passage-bm25top100", BenchmarkConfig(retriever="bm25")),
    (
        "trec-dl19-passage-bm25top100",
        BenchmarkConfig(retriever="bm25", reranker=MINILM, max_queries=10 if QUICK else None),
    ),
    ("adi", BenchmarkConfig(retriever="dense")),
    ("adi", BenchmarkConfig(retriever="bm25")),
    ("adi", BenchmarkConfig(retriever="bm25", reranker=MINILM)),
]
results = [run_benchmark(name, cfg) for name, cfg in plan]
for r in results:
    for note in r.notes:
        print(f"[{r.dataset}] {note}")

# %%
table = results_table(results)
table["run"] = table["retriever"] + table["reranker"].map(lambda x: "" if x == "-" else " + rerank")
table[["dataset", "run", "queries", "ndcg@10", "recall@100", "mrr@10"]]

# %%
datasets = list(dict.fromkeys(table["dataset"]))
fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.8), sharey=True)
for ax, name in zip(axes, datasets, strict=True):
    sub = table[table["dataset"] == name]
    ax.bar(range(len(sub)), sub["ndcg@10"], color="tab:blue")
    ax.set_xticks(range(len(sub)), sub["run"], rotation=30, ha="right", fontsize=8)
    for i, v in enumerate(sub["ndcg@10"]):
        ax.text(i, v + 0.01, f"{v:.3f}", ha="center", fontsize=8)
    ax.set_title(name, fontsize=9)
    ax.set_ylim(0, 1)
axes[0].set_ylabel("nDCG@10 (0–1)")
fig.suptitle("nDCG@10 per collection and run")
fig.tight_layout()

# %% [markdown]
# ## Per query: first stage vs reranked
# Each point is one query of a reranked run; points above the diagonal improved with reranking.

# %%
reranked = [r for r in results if r.config.reranker]
fig, axes = plt.subplots(1, len(reranked), figsize=(4.5 * len(reranked), 4.2))
for ax, r in zip(axes, reranked, strict=True):
    x, y = r.first_stage_per_query["ndcg@10"], r.per_query["ndcg@10"]
    ax.scatter(x, y, alpha=0.7)
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("first-stage nDCG@10 (BM25)")
    ax.set_ylabel("reranked nDCG@10")
    better, worse = int((y > x).sum()), int((y < x).sum())
    ax.set_title(f"{r.dataset}: {better} better, {worse} worse", fontsize=9)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
fig.tight_layout()

# %% [markdown]
# ## Is the difference real?
# Every system against BM25 on each collection: paired randomization test on per-query nDCG@10, Holm-corrected
# across the cells of the table (`compare_systems`); † marks the cells where the difference is significant
# (p < 0.05 after correction). The command line gives it for SciFact and ADI with
# `python eval/run.py scifact adi --retriever bm25 dense hybrid`.

# %%
from embedrank import biggest_differences, compare_systems, load_beir, metric_table, unique_systems

systems = unique_systems(results, ["ndcg@10", "recall@100", "mrr@10"])
comparisons = compare_systems(systems, baseline="bm25", metrics=["ndcg@10"], permutations=2000)
metric_table(systems, "ndcg@10", comparisons)

# %%
import pandas as pd

pd.DataFrame([c.to_json() for c in comparisons])[
    ["dataset", "system", "delta", "wins", "ties", "losses", "t_test_p", "randomization_p", "p_holm", "significant"]
]

# %% [markdown]
# ### Per query: hybrid against BM25 on SciFact
# Each bar is one query's nDCG@10 difference (hybrid − BM25), sorted; then the queries where the two differ most,
# with each system's top document.

# %%
by_name = {(s.dataset, s.system): s for s in systems}
bm25, hybrid = by_name[("scifact", "bm25")], by_name[("scifact", "hybrid")]
delta = (hybrid.per_query["ndcg@10"] - bm25.per_query["ndcg@10"].reindex(hybrid.per_query.index)).sort_values()
fig, ax = plt.subplots(figsize=(9, 3))
ax.bar(range(len(delta)), delta, width=1.0, color=["tab:red" if d < 0 else "tab:green" for d in delta])
ax.axhline(0, color="grey", linewidth=0.8)
ax.set_xlabel("SciFact test queries, sorted by the difference")
ax.set_ylabel("Δ nDCG@10 (hybrid − BM25)")
ax.set_title(
    f"hybrid better on {(delta > 0).sum()}, worse on {(delta < 0).sum()}, tied on {(delta == 0).sum()} queries",
    fontsize=9,
)
plt.show()

# %%
biggest_differences(bm25, hybrid, load_beir("scifact"), n=5)
