"""A real cross-encoder that needs no download: a packaged backbone with a seeded classification head.

No cross-encoder weights can be had offline, so tests, notebooks and benchmarks build this one to exercise
the cross-encoder path for real (tokenized pairs, a sequence-classification forward pass, the sigmoid),
and compare it with ``sentence_transformers.CrossEncoder``. Its scores are not relevance judgments.
"""

from __future__ import annotations

from pathlib import Path

from embedrank.models.registry import DEFAULT_EMBEDDING_MODEL, quiet_loading, resolve_path


def seeded_cross_encoder(out: str | Path, *, backbone: str = DEFAULT_EMBEDDING_MODEL, seed: int = 1234) -> str:
    """Save ``backbone`` with a fresh 1-label head (weights ~ N(0, 0.5), seeded) to ``out``; returns the path.

    The head's spread makes scores differ visibly between documents, so ranking checks mean something.
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path, _ = resolve_path(backbone)
    torch.manual_seed(seed)
    with quiet_loading():
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
        torch.nn.init.normal_(model.classifier.weight, std=0.5)
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(path).save_pretrained(out)
    return str(out)
