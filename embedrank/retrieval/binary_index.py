"""Binary-quantized search: one bit per dimension in a FAISS ``IndexBinaryFlat`` (Hamming distance),
with the top candidates rescored against the float query.

This is the "binary + rescoring" recipe of sentence-transformers' embedding-quantization guide: the
Hamming search over ``k * rescore_multiplier`` candidates is 32x smaller than float32 and fast; the
rescoring then restores most of the lost quality. Rescoring (``IndexConfig.rescore``) uses

- ``int8`` (default): the documents' int8 codes (:func:`~embedrank.math.quantization.quantize`, ranges
  from the first vectors added: the corpus calibrates itself), dequantized; ``D`` more bytes per vector,
  which could live on disk;
- ``bits``: the sign bits themselves as +1/-1 (sentence-transformers' rescoring of binary candidates,
  which ranks the same); no extra memory;
- ``none``: Hamming order only; scores are ``1 - 2 * hamming / D``, an estimate of the cosine.

Only ``cosine`` and ``dot`` metrics (the sign of a component carries no L2 meaning).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.math.quantization import dequantize, quantization_ranges, quantize, unpack_signs
from embedrank.retrieval.index_base import BaseIndex, IndexConfig, SearchResult, faiss_selector

RESCORE = ("int8", "bits", "none")


class BinaryIndex(BaseIndex):
    """Sign bits searched by Hamming distance, top candidates rescored (see the module docstring)."""

    kinds = frozenset({"binary"})

    def __init__(self, dimension: int, config: IndexConfig | None = None, *, model_id: str | None = None) -> None:
        import faiss

        super().__init__(dimension, config or IndexConfig(kind="binary"), model_id=model_id)
        c = self.config
        if c.metric == "l2":
            raise InvalidInputError("a binary index searches by cosine or dot product, not l2", param="metric")
        if c.rescore not in RESCORE:
            raise InvalidInputError(f"rescore must be one of {list(RESCORE)}, got {c.rescore!r}", param="rescore")
        if c.rescore_multiplier < 1:
            raise InvalidInputError(f"rescore_multiplier must be >= 1, got {c.rescore_multiplier}")
        self._index: Any = faiss.IndexBinaryFlat(-(-self.dimension // 8) * 8)  # whole bytes
        self._int8 = np.empty((0, self.dimension), dtype=np.int8)  # (N, D) when rescore == "int8"
        self.ranges: np.ndarray | None = None  # (2, D) int8 calibration, from the first add

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        x = self._prepare(vectors, "vectors")
        ids = self._register(ids, x.shape[0])
        if self.config.rescore == "int8":  # first, so that a refused add changes nothing
            if self.ranges is None and x.shape[0] < 2:
                raise InvalidInputError("the first add() of an int8-rescored binary index needs >= 2 vectors")
            self.ranges = quantization_ranges(x) if self.ranges is None else self.ranges
            self._int8 = np.vstack([self._int8, quantize(x, "int8", self.ranges)])
        codes = quantize(x, "ubinary")
        self._index.add(codes)
        self._commit(ids)

    @property
    def _codes(self) -> np.ndarray:
        """``(N, ceil(D / 8))`` uint8: the packed bits FAISS holds, viewed without a copy (taken anew at each
        use: an add may move FAISS's buffer)."""
        import faiss

        size = self._index.ntotal * self._index.code_size
        if size == 0:
            return np.empty((0, self._index.code_size), dtype=np.uint8)
        return faiss.rev_swig_ptr(self._index.xb.data(), size).reshape(-1, self._index.code_size)

    def _candidates(self, positions: np.ndarray) -> np.ndarray:
        """``(Q, K, D)`` float32 vectors the float query is rescored against."""
        if self.config.rescore == "int8":
            assert self.ranges is not None
            return dequantize(self._int8[positions], "int8", self.ranges)
        return unpack_signs(self._codes[positions], self.dimension)

    def search(self, queries: np.ndarray, k: int, *, skip: np.ndarray | None = None) -> SearchResult:
        """Top ``k`` per query (``min(k, len(self))``): Hamming search for ``k * rescore_multiplier``
        candidates, then rescoring (module docstring). ``skip``: ``(N,)`` bool, rows never returned."""
        import faiss

        q = self._prepare(queries, "queries")  # (Q, D)
        skip = self._skipped(skip)
        n = len(self) - (int(skip.sum()) if skip is not None else 0)
        if n == 0:
            return [np.zeros(0, dtype=np.float32) for _ in range(q.shape[0])], [[] for _ in range(q.shape[0])]
        k = min(k, n)
        rescore = self.config.rescore != "none"
        depth = min(n, k * self.config.rescore_multiplier) if rescore else k
        codes = quantize(q, "ubinary")
        if skip is None:
            hamming, positions = self._index.search(codes, depth)  # (Q, K) int32, int64
        else:
            with faiss_selector(skip) as selector:
                params = faiss.SearchParameters()
                params.sel = selector
                hamming, positions = self._index.search(codes, depth, params=params)
        if not rescore:
            return self._results(1 - 2 * hamming.astype(np.float32) / self.dimension, positions)
        scores = np.einsum("qd,qkd->qk", q, self._candidates(positions))  # (Q, K)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return self._results(np.take_along_axis(scores, order, axis=1), np.take_along_axis(positions, order, axis=1))

    @property
    def can_reconstruct(self) -> bool:
        return False  # sign bits and int8 codes are lossy

    def reconstruct(self, ids: Sequence[str]) -> None:
        return None

    @property
    def bytes_per_vector(self) -> float:
        """Bytes held per vector: the packed bits plus, with int8 rescoring, the int8 codes."""
        return float(self._index.code_size + (self.dimension if self.config.rescore == "int8" else 0))

    def save(self, directory: str | Path) -> Path:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / "codes.npy", self._codes)
        if self.config.rescore == "int8" and self.ranges is not None:
            np.save(out / "int8.npy", self._int8)
            np.save(out / "ranges.npy", self.ranges)
        self._write_meta(out)
        return out

    def _read(self, directory: Path) -> None:
        self._index.add(np.load(directory / "codes.npy"))
        if (directory / "ranges.npy").is_file():
            self._int8, self.ranges = np.load(directory / "int8.npy"), np.load(directory / "ranges.npy")
