"""Seeded synthetic stores for the vector-store benchmarks: 384-dimension unit vectors (MiniLM's size) drawn
around random centres, so that neighbours exist as in a corpus, and a store's index over them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embedrank.retrieval.store import Chunks, StoreIndex

DIMENSION = 384


def clusters(rng: np.random.Generator) -> np.ndarray:
    """``(1000, 384)`` random centres: a store's chunks and its queries are drawn around the same ones."""
    return rng.standard_normal((1000, DIMENSION)).astype(np.float32)


def vectors(n: int, centres: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``(n, 384)`` float32 unit vectors, each around one of ``centres`` drawn at random."""
    x = centres[rng.integers(0, len(centres), n)] + 0.6 * rng.standard_normal((n, DIMENSION)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def store(x: np.ndarray, kind: str, folder: Path | None = None, version: int = 1, first: int = 0) -> StoreIndex:
    """A store's index over ``x``, its chunks' keys numbered from ``first``."""
    n = len(x)
    data = Chunks(
        version=version,
        file_ids=["f"] * n,
        filenames=["f"] * n,
        texts=[""] * n,
        attributes=[{}] * n,
        vectors=x,
        keys=[str(i) for i in range(first, first + n)],
    )
    return StoreIndex(data, kind=kind, folder=folder)  # type: ignore[arg-type]
