"""A vector store's search on this replica: the store's chunks held in memory (:class:`StoreIndex`, read from the
database and read again when the store's ``version`` moves: a file completed or removed on any replica), its
first stage (dense, BM25 or their fusion, the library's own :class:`~embedrank.retrieval.bm25.BM25Retriever`
and :func:`~embedrank.math.fusion.score_fusion`), the attribute filter, and the ranker.

Dense scores are the inner products of the store model's vectors (cosine for a model that normalizes them, as
the library's flat index scores them); a hybrid fuses the dense and BM25 runs, each ``HYBRID_DEPTH`` deep, by
min-max score fusion with the store's ``hybrid_weight``, as :class:`~embedrank.retrieval.stages.HybridRetriever`
does. A list of queries is searched query by query and each chunk keeps its best score; a ranker scores the
first stage's ``rerank_candidates`` best against the queries joined by newlines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from embedrank.math.fusion import score_fusion
from embedrank.math.ranking import top_k
from embedrank.retrieval.bm25 import BM25Retriever
from embedrank.retrieval.filters import Filter, matches
from embedrank.types import Run
from service.vector_stores.store import Searchable, StoreRow, VectorStoreTables

HYBRID_DEPTH = 1000
"""How deep each stage of a hybrid is read before fusing (the library's default)."""
CACHED_STORES = 64
"""Stores whose index a replica keeps in memory (least recently searched dropped past it)."""


@dataclasses.dataclass
class StoreIndex:
    """One store's chunks at one version, and its BM25 index (built on the first lexical search)."""

    data: Searchable
    _bm25: BM25Retriever | None = None
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def __len__(self) -> int:
        return len(self.data.texts)

    def allowed(self, where: Filter | None) -> np.ndarray | None:
        """``(N,)`` bool: the chunks whose attributes pass ``where`` (None: all)."""
        if where is None:
            return None
        return np.fromiter((matches(where, a) for a in self.data.attributes), dtype=bool, count=len(self))

    def dense(self, queries: np.ndarray, allowed: np.ndarray | None, depth: int) -> Run:
        """Top ``depth`` chunks (ids: row numbers as strings) by inner product, per query row of ``(Q, D)``."""
        scores = queries.astype(np.float32) @ self.data.vectors.T  # (Q, N)
        if allowed is not None:
            scores[:, ~allowed] = -np.inf
        k = min(depth, len(self))
        run: Run = {}
        for q, row in enumerate(scores):
            best = np.argpartition(-row, k - 1)[:k] if k < len(row) else np.arange(len(row))
            run[str(q)] = {str(int(i)): float(row[i]) for i in best if np.isfinite(row[i])}
        return run

    def lexical(self, queries: Sequence[str], allowed: np.ndarray | None, depth: int) -> Run:
        """Top ``depth`` chunks by BM25, per query."""
        with self._lock:
            if self._bm25 is None:
                self._bm25 = BM25Retriever([str(i) for i in range(len(self))], self.data.texts)
        k = len(self) if allowed is not None else depth  # a filter: every scored chunk, then the allowed ones
        run = self._bm25.retrieve({str(q): text for q, text in enumerate(queries)}, k)
        if allowed is not None:
            run = top_k({q: {d: s for d, s in docs.items() if allowed[int(d)]} for q, docs in run.items()}, depth)
        return run

    def first_stage(
        self,
        store: StoreRow,
        queries: Sequence[str],
        vectors: np.ndarray | None,
        where: Filter | None,
        depth: int,
    ) -> list[tuple[int, float]]:
        """The ``depth`` best chunks (row, score) for ``queries`` by ``store``'s first stage, best first."""
        if not len(self):
            return []
        allowed = self.allowed(where)
        if store.first_stage == "dense":
            assert vectors is not None
            run = self.dense(vectors, allowed, depth)
        elif store.first_stage == "bm25":
            run = self.lexical(queries, allowed, depth)
        else:
            assert vectors is not None
            deep = max(depth, HYBRID_DEPTH)
            fused = score_fusion(
                self.dense(vectors, allowed, deep), self.lexical(queries, allowed, deep), weight=store.hybrid_weight
            )
            run = {q: fused.get(q, {}) for q in map(str, range(len(queries)))}
        best: dict[int, float] = {}
        for docs in run.values():  # several queries: each chunk's best score
            for doc, score in docs.items():
                row = int(doc)
                best[row] = max(best.get(row, -np.inf), score)
        return sorted(best.items(), key=lambda item: (-item[1], item[0]))[:depth]


class IndexCache:
    """The stores' indexes this replica holds, each at the version it read (bounded: :data:`CACHED_STORES`)."""

    def __init__(self, tables: VectorStoreTables, capacity: int = CACHED_STORES) -> None:
        self.tables = tables
        self.capacity = capacity
        self._held: OrderedDict[str, StoreIndex] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    async def index(self, store: StoreRow, dimension: int) -> StoreIndex:
        """``store``'s index at the version its row (just read) has: the one held, or read again."""
        held = self._held.get(store.id)
        if held is not None and held.data.version == store.version:
            self._held.move_to_end(store.id)
            return held
        lock = self._locks.setdefault(store.id, asyncio.Lock())
        async with lock:  # concurrent searches of a changed store read it once
            held = self._held.get(store.id)
            if held is None or held.data.version < store.version:
                held = StoreIndex(await asyncio.to_thread(self.tables.searchable, store, dimension))
                self._held[store.id] = held
                self._held.move_to_end(store.id)
                while len(self._held) > self.capacity:
                    dropped, _ = self._held.popitem(last=False)
                    self._locks.pop(dropped, None)
        return held

    def forget(self, store_id: str) -> None:
        self._held.pop(store_id, None)


def chunk_results(index: StoreIndex, ranked: Sequence[tuple[int, float]]) -> list[dict[str, Any]]:
    """Each ranked chunk as a search result's fields."""
    data = index.data
    return [
        {
            "file_id": data.file_ids[row],
            "filename": data.filenames[row],
            "score": score,
            "attributes": data.attributes[row] or None,
            "text": data.texts[row],
        }
        for row, score in ranked
    ]
