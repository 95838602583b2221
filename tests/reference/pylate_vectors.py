"""Run in the PyLate reference environment (.venv-pylate): PyLate's token vectors and MaxSim scores for a model.

    .venv-pylate/bin/python tests/reference/pylate_vectors.py IN.json MODEL_DIR OUT.npz [MODEL_DIR OUT.npz ...]

``IN.json`` holds ``{"queries": [...], "documents": [...]}``. Each ``OUT.npz`` holds ``q{i}`` and ``d{j}``, each
text's ``(T, D)`` vectors from ``ColBERT.encode`` (``is_query`` True/False), and ``scores`` ``(Q, N)`` from
``colbert_scores`` of each query against each document alone (no padding between documents).
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from pylate import models
from pylate.scores import colbert_scores

source, *pairs = sys.argv[1:]
texts = json.loads(Path(source).read_text(encoding="utf-8"))
for model_dir, target in zip(pairs[::2], pairs[1::2], strict=True):
    model = models.ColBERT(model_dir, device="cpu")
    queries = model.encode(texts["queries"], is_query=True, batch_size=3)
    documents = model.encode(texts["documents"], is_query=False, batch_size=3)
    scores = np.array(
        [
            [float(colbert_scores(torch.tensor(q)[None], torch.tensor(d)[None])[0, 0]) for d in documents]
            for q in queries
        ]
    )
    arrays = {f"q{i}": q for i, q in enumerate(queries)} | {f"d{j}": d for j, d in enumerate(documents)}
    np.savez(target, scores=scores, **arrays)
