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
# # 01 · Quickstart: embeddings, similarity, neighbours, pooling
#
# Loads the default encoder (the packaged `all-MiniLM-L6-v2`, offline), embeds a few sentences, shows a
# cosine-similarity heatmap and nearest neighbours, and compares pooling and normalization choices.

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import embedrank
from embedrank import Encoder, PoolingMode, similarity

encoder = Encoder.from_pretrained()
encoder

# %%
sentences = [
    "The cat sits on the mat.",
    "A kitten is resting on a rug.",
    "Stock markets fell sharply today.",
    "Shares dropped as investors panicked.",
    "How do vaccines train the immune system?",
    "Immunisation teaches the body to recognise pathogens.",
]
stats = encoder.encode_with_stats(sentences)
vectors = stats.embeddings
pd.DataFrame({"text": sentences, "tokens": stats.token_counts, "truncated": stats.truncated,
              "norm": np.linalg.norm(vectors, axis=1).round(4)})

# %%
sim = similarity(vectors, vectors)
fig, ax = plt.subplots(figsize=(6.5, 5.5))
im = ax.imshow(sim, vmin=-0.2, vmax=1.0, cmap="viridis")
labels = [s[:28] + ("…" if len(s) > 28 else "") for s in sentences]
ax.set_xticks(range(len(sentences)), labels, rotation=45, ha="right")
ax.set_yticks(range(len(sentences)), labels)
ax.set_xlabel("sentence")
ax.set_ylabel("sentence")
ax.set_title("Cosine similarity (all-MiniLM-L6-v2)")
for i in range(len(sentences)):
    for j in range(len(sentences)):
        ax.text(j, i, f"{sim[i, j]:.2f}", ha="center", va="center", color="white" if sim[i, j] < 0.6 else "black",
                fontsize=8)
fig.colorbar(im, ax=ax, label="cosine similarity (unitless)")
fig.tight_layout()

# %% [markdown]
# ## Nearest neighbours
# An exact index (the numpy oracle backend) over the sentences; each sentence's nearest other sentence.

# %%
from embedrank import build_index

index = build_index(encoder.dimension, kind="numpy", model_id=encoder.model_id)
index.add([str(i) for i in range(len(sentences))], vectors)
scores, ids = index.search(vectors, k=2)
pd.DataFrame({"text": sentences, "nearest neighbour": [sentences[int(row[1])] for row in ids],
              "cosine": [round(float(row[1]), 3) for row in scores]})

# %% [markdown]
# ## Pooling and normalization
# The model's own `1_Pooling/config.json` says how it was trained; other choices change the geometry.
# The table shows, for each pooling mode with and without L2 normalization, the mean similarity of the
# three paraphrase pairs, the mean similarity of unrelated pairs, and the gap between them.

# %%
print(f"trained with pooling={encoder.spec.pooling.value!r}, normalize={encoder.spec.normalize}")
pairs = [(0, 1), (2, 3), (4, 5)]
unrelated = [(0, 2), (0, 4), (2, 4), (1, 3), (1, 5), (3, 5)]
rows = []
for mode in PoolingMode:
    for normalize in (True, False):
        variant = Encoder(encoder.spec, encoder.runtime, encoder.tokenizer, pooling=mode, normalize=normalize)
        v = variant.encode(sentences)
        s = similarity(v, v)
        para = float(np.mean([s[i, j] for i, j in pairs]))
        other = float(np.mean([s[i, j] for i, j in unrelated]))
        rows.append({"pooling": mode.value, "normalize": normalize, "paraphrase cos": round(para, 3),
                     "unrelated cos": round(other, 3), "gap": round(para - other, 3),
                     "mean norm": round(float(np.linalg.norm(v, axis=1).mean()), 3),
                     "trained with": "✓" if mode == encoder.spec.pooling else ""})
pooling_table = pd.DataFrame(rows)
pooling_table

# %% [markdown]
# Cosine similarity does not depend on normalization (it normalizes anyway); normalization matters for
# dot-product and L2 indexes. The pooling the model was trained with (mean) separates paraphrases from
# unrelated pairs best here; CLS and last-token pooling on a mean-pooled model lose much of that gap.
# `embedrank.__version__` is printed for the record:

# %%
embedrank.__version__
