"""An inverted index over sparse (SPLADE, bge-m3 lexical) vectors: Seismic (``pyseismic-lsr``), with the
exact scores.

Seismic keeps, per vocabulary entry, the documents that have it (at most ``n_postings`` of the heaviest),
groups each list into blocks with a summary vector, and at query time visits the query's
``query_cut`` heaviest entries, skipping blocks whose summary cannot beat the current top-k times
``heap_factor``. Its stored weights are 16-bit, so its scores differ from the exact dot product in the
fourth digit: :class:`SparseIndex` asks it for more candidates than ``k`` and scores them exactly
(:func:`~embedrank.math.sparse.sparse_scores`), so results carry the exact scores. With every posting
kept, block summaries that keep all their weights (``summary_energy=1``), the whole query read and
``heap_factor=1`` (the defaults) it returns the exact scorer's top-k; smaller settings (Seismic's own
defaults are ``summary_energy=0.4``, ``heap_factor=0.7``) trade recall for speed.

Saved as ``sparse.index.seismic`` with the ids, the document vectors and ``sparse-index.json`` (the
model it was built with: loading it for another model is an :class:`~embedrank.errors.IndexMismatchError`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from embedrank.errors import IndexMismatchError, InvalidInputError
from embedrank.math.sparse import sparse_scores

META = "sparse-index.json"
CANDIDATES = 2  # candidates asked of Seismic per result, rescored exactly


def _seismic() -> Any:
    try:
        import seismic
    except ImportError as exc:  # an optional extra
        raise ImportError("the sparse inverted index needs pyseismic-lsr: pip install 'embedrank[sparse]'") from exc
    return seismic


def _tokens(indices: np.ndarray, seismic: Any) -> np.ndarray:
    return np.array([str(int(i)) for i in indices], dtype=seismic.get_seismic_string())


class SparseIndex:
    """Top-k by dot product over sparse document vectors ``(N, V)`` with string ids (see the module doc)."""

    def __init__(self, ids: Sequence[str], vectors: sp.csr_matrix, index: Any, *, model_id: str, params: dict) -> None:
        self.ids = [str(i) for i in ids]
        self.vectors = vectors.tocsr().astype(np.float32)
        self.index = index
        self.model_id = model_id
        self.params = params

    @classmethod
    def build(
        cls,
        ids: Sequence[str],
        vectors: sp.csr_matrix,
        *,
        model_id: str,
        n_postings: int | None = None,
        summary_energy: float = 1.0,
    ) -> SparseIndex:
        """Index ``vectors`` (row ``i`` is document ``ids[i]``); ``n_postings``: the most documents kept per
        vocabulary entry (None: all, so nothing is pruned); ``summary_energy``: the share of each block's
        weight its summary keeps (1: all; the summaries then never skip a block that holds a result)."""
        if vectors.shape[0] != len(ids):
            raise InvalidInputError(f"{vectors.shape[0]} vectors for {len(ids)} ids", param="vectors")
        seismic = _seismic()
        vectors = vectors.tocsr().astype(np.float32)
        dataset = seismic.SeismicDataset()
        for row in range(vectors.shape[0]):
            start, end = vectors.indptr[row], vectors.indptr[row + 1]
            if end > start:  # a document without weights scores 0 for every query: never a result
                dataset.add_document(str(row), _tokens(vectors.indices[start:end], seismic), vectors.data[start:end])
        postings = n_postings or max(1, int(np.bincount(vectors.indices, minlength=1).max()))
        params = {"n_postings": postings, "summary_energy": summary_energy}
        index = seismic.SeismicIndex.build_from_dataset(
            dataset, n_postings=postings, summary_energy=summary_energy, max_fraction=1.0, num_threads=1
        )
        return cls(ids, vectors, index, model_id=model_id, params=params)

    def __len__(self) -> int:
        return len(self.ids)

    def search(
        self, queries: sp.csr_matrix, k: int, *, query_cut: int | None = None, heap_factor: float = 1.0
    ) -> list[list[tuple[str, float]]]:
        """Per query row, its top ``k`` documents ``(id, exact score)`` with a score above 0, best first (ties by
        document order); ``query_cut``: the query's heaviest entries read (None: all)."""
        seismic = _seismic()
        queries = queries.tocsr().astype(np.float32)
        results: list[list[tuple[str, float]]] = []
        for q in range(queries.shape[0]):
            start, end = queries.indptr[q], queries.indptr[q + 1]
            if end == start or k < 1:
                results.append([])
                continue
            found = self.index.search(
                str(q),
                _tokens(queries.indices[start:end], seismic),
                queries.data[start:end],
                k=min(len(self.ids), k * CANDIDATES + 10),
                query_cut=query_cut or int(end - start),
                heap_factor=heap_factor,
            )
            rows = np.array(sorted({int(doc) for _, _, doc in found}), dtype=np.int64)
            scores = sparse_scores(queries[q], self.vectors[rows])[0] if len(rows) else np.zeros(0, np.float32)
            order = np.argsort(-scores, kind="stable")[:k]
            results.append([(self.ids[rows[i]], float(scores[i])) for i in order if scores[i] > 0])
        return results

    def save(self, directory: str | Path) -> Path:
        """Write the index, ids, vectors and metadata into ``directory``; returns it."""
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        self.index.save(str(root / "sparse"))
        sp.save_npz(root / "vectors.npz", self.vectors)
        (root / "ids.json").write_text(json.dumps(self.ids), encoding="utf-8")
        meta = {"kind": "seismic", "model_id": self.model_id, "count": len(self.ids), "params": self.params}
        (root / META).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        return root

    @classmethod
    def load(cls, directory: str | Path, *, model_id: str) -> SparseIndex:
        """An index :meth:`save` wrote, for queries from ``model_id``.

        Raises:
            IndexMismatchError: no sparse index there, or one built with another model.
        """
        root = Path(directory)
        if not (root / META).is_file():
            raise IndexMismatchError(f"{root} is not an embedrank sparse index directory (no {META})")
        meta = json.loads((root / META).read_text(encoding="utf-8"))
        if meta.get("model_id") != model_id:
            raise IndexMismatchError(
                f"the sparse index in {root} was built with {meta.get('model_id')!r}; queries come from {model_id!r}"
            )
        index = _seismic().SeismicIndex.load(str(root / "sparse.index.seismic"))
        ids = json.loads((root / "ids.json").read_text(encoding="utf-8"))
        return cls(ids, sp.load_npz(root / "vectors.npz").tocsr(), index, model_id=model_id, params=meta["params"])
