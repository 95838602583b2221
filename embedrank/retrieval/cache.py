"""On-disk cache of corpus embeddings, keyed by the model and a hash of the corpus."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from embedrank.paths import CACHE_ENV, default_cache_dir, writing

__all__ = ["CACHE_ENV", "EmbeddingCache", "corpus_key", "default_cache_dir"]


def corpus_key(model_key: str, ids: Sequence[str], texts: Sequence[str]) -> str:
    """A stable key for (model settings, ids, texts).

    >>> corpus_key("m", ["1"], ["a"]) == corpus_key("m", ["1"], ["a"]) != corpus_key("m", ["1"], ["b"])
    True
    """
    h = hashlib.sha256(model_key.encode())
    for doc_id, text in zip(ids, texts, strict=True):
        h.update(b"\x00" + doc_id.encode() + b"\x01" + text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]


class EmbeddingCache:
    """Stores ``(N, D)`` float32 arrays as ``<key>.npy`` with a JSON sidecar describing them."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir() / "embeddings"

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.npy"

    def load(self, key: str, expected_rows: int) -> np.ndarray | None:
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            array = np.load(path)
        except (OSError, ValueError):
            return None  # a torn write: recompute
        return array if array.shape[0] == expected_rows else None

    def store(self, key: str, array: np.ndarray, info: dict) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp.npy")  # one per writer
        with writing(tmp):
            np.save(tmp, array)
            os.replace(tmp, path)
        path.with_suffix(".json").write_text(json.dumps({**info, "shape": list(array.shape)}, indent=2))
        return path
