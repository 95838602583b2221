# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Index trade-offs: flat, IVF, HNSW and IVF-PQ over the same embeddings
#
# SciFact corpus embeddings (cached on disk after the first run), test queries as the query set. Recall@10
# is measured against exact search; throughput is queries per second on this machine (2 CPU cores).
# `EMBEDRANK_NOTEBOOK_QUICK=1` (used by the test suite) shortens the sweeps.

# %%
import os
import time

import matplotlib.pyplot as plt
import pandas as pd

from embedrank import (
    DataNotFoundError,
    EmbeddingCache,
    Encoder,
    build_index,
    doc_text,
    embed_corpus,
    load_beir,
    recall_at_k,
)

QUICK = os.environ.get("EMBEDRANK_NOTEBOOK_QUICK") == "1"
try:
    ds = load_beir("scifact")
except DataNotFoundError as exc:
    raise SystemExit(f"This notebook needs the SciFact collection.\n{exc}") from None

encoder = Encoder.from_pretrained()
ids = list(ds.corpus)
embedded = embed_corpus(encoder, ids, [doc_text(ds.corpus[d]) for d in ids], cache=EmbeddingCache())
doc_vectors = embedded.vectors
query_vectors = encoder.encode(list(ds.queries.values()))
print(f"{len(ids)} documents, {len(query_vectors)} queries, dim {encoder.dimension}; {embedded.describe()}")

# %%
exact = build_index(encoder.dimension, kind="flat")
exact.add(ids, doc_vectors)
_, truth = exact.search(query_vectors, 10)


def measure(index, label, **params):
    index.set_search_params(**params) if params else None
    repeats = 1 if QUICK else 5
    start = time.perf_counter()
    for _ in range(repeats):
        _, got = index.search(query_vectors, 10)
    qps = repeats * len(query_vectors) / (time.perf_counter() - start)
    return {"index": label, **params, "recall@10": recall_at_k(got, truth), "queries/s": qps,
            "bytes/vector": index.bytes_per_vector}


rows = [measure(exact, "flat")]
ivf = build_index(encoder.dimension, kind="ivf")
ivf.add(ids, doc_vectors)
for nprobe in ([1, 8, 32] if QUICK else [1, 2, 4, 8, 16, 24, 32, 48, 72]):
    rows.append(measure(ivf, "ivf", nprobe=nprobe))
hnsw = build_index(encoder.dimension, kind="hnsw")
hnsw.add(ids, doc_vectors)
for ef in ([16, 64] if QUICK else [8, 16, 32, 64, 128, 256]):
    rows.append(measure(hnsw, "hnsw", ef_search=ef))
pq = build_index(encoder.dimension, kind="pq")
pq.add(ids, doc_vectors)
for nprobe in ([8, 32] if QUICK else [4, 8, 16, 32, 72]):
    rows.append(measure(pq, "ivf-pq", nprobe=nprobe))
table = pd.DataFrame(rows)
table.round(3)

# %%
fig, ax = plt.subplots(figsize=(7, 4.5))
for label, group in table.groupby("index", sort=False):
    ax.plot(group["recall@10"], group["queries/s"], marker="o", label=label)
    for _, row in group.iterrows():
        knob = row.get("nprobe") if label in ("ivf", "ivf-pq") else row.get("ef_search")
        if pd.notna(knob):
            ax.annotate(f"{int(knob)}", (row["recall@10"], row["queries/s"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
ax.set_xlabel("recall@10 against exact search (fraction)")
ax.set_ylabel("throughput (queries/s, batch of all test queries)")
ax.set_yscale("log")
ax.set_title("SciFact: recall vs speed (labels: nprobe / efSearch)")
ax.legend()
ax.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# ## Memory per vector
# Serialized index size divided by the number of vectors (384 float32 = 1,536 bytes of raw data).

# %%
table.groupby("index", sort=False)["bytes/vector"].first().round(0).to_frame("bytes per vector")
