"""A real cross-encoder that needs no download: a packaged backbone with a seeded classification head.

No cross-encoder weights can be had offline, so tests, notebooks and benchmarks build this one to exercise
the cross-encoder path for real (tokenized pairs, a sequence-classification forward pass, the sigmoid),
and compare it with ``sentence_transformers.CrossEncoder``. Its scores are not relevance judgments.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from embedrank.paths import build_directory, default_cache_dir
from embedrank.registry import DEFAULT_EMBEDDING_MODEL, quiet_loading, resolve_path


def seeded_cross_encoder(
    out: str | Path | None = None, *, backbone: str = DEFAULT_EMBEDDING_MODEL, seed: int = 1234
) -> str:
    """``backbone`` with a fresh 1-label head (weights ~ N(0, 0.5), seeded), saved to ``out``; returns the path.

    Without ``out`` the model goes to ``<cache>/models/seeded-cross-encoder-<seed>`` and is built only once
    (it is deterministic), so its OpenVINO/ONNX exports are reused too. The head's spread makes scores differ
    visibly between documents, so ranking checks mean something.
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if out is None:
        suffix = "" if backbone == DEFAULT_EMBEDDING_MODEL else "-" + hashlib.sha256(backbone.encode()).hexdigest()[:12]
        name = f"seeded-cross-encoder-{seed}{suffix}"
        out = default_cache_dir() / "models" / name
        if (out / "config.json").is_file():
            return str(out)
    path, _ = resolve_path(backbone)

    def build(tmp: Path) -> None:
        torch.manual_seed(seed)
        with quiet_loading():
            model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
            torch.nn.init.normal_(model.classifier.weight, std=0.5)
            model.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(path).save_pretrained(tmp)

    return build_directory(out, build)
