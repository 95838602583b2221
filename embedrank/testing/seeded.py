"""Real models that need no download: a packaged backbone with a seeded classification head (a cross-encoder),
and encoders of a real size with seeded weights in a model's own layout.

No cross-encoder weights can be had offline, so tests, notebooks and benchmarks build this one to exercise
the cross-encoder path for real (tokenized pairs, a sequence-classification forward pass, the sigmoid),
and compare it with ``sentence_transformers.CrossEncoder``. Its scores are not relevance judgments.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

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


def seeded_encoder(
    out: str | Path, source: str | Path, *, seed: int = 0, max_seq_length: int | None = None, **config: Any
) -> str:
    """A sentence-transformers model laid out as ``source`` (its modules, pooling, normalization and tokenizer)
    whose transformer is rebuilt from ``source``'s config with ``config`` changed (``hidden_size=768``, ...)
    and seeded random weights (transformers' own initialization), saved to ``out``; returns the path.

    Speed does not depend on the weights: this gives a model of a real size (BERT-base from MiniLM's layout)
    without downloading one. ``max_seq_length`` replaces the window in ``sentence_bert_config.json``."""
    import torch
    from transformers import AutoConfig, AutoModel

    source, out = Path(source), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.suffix in (".safetensors", ".bin", ".onnx") or item.name in ("README.md", "onnx", "openvino"):
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, out / item.name)
    settings = AutoConfig.from_pretrained(source)
    for key, value in config.items():
        setattr(settings, key, value)
    torch.manual_seed(seed)
    with quiet_loading():
        AutoModel.from_config(settings).save_pretrained(out)
    pooling = out / "1_Pooling" / "config.json"
    if pooling.is_file():
        described = json.loads(pooling.read_text(encoding="utf-8"))
        described["word_embedding_dimension"] = settings.hidden_size
        pooling.write_text(json.dumps(described, indent=2), encoding="utf-8")
    window = out / "sentence_bert_config.json"
    if max_seq_length is not None and window.is_file():
        described = json.loads(window.read_text(encoding="utf-8"))
        described["max_seq_length"] = max_seq_length
        window.write_text(json.dumps(described, indent=2), encoding="utf-8")
    return str(out)
