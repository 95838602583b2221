"""Document stores served to requests: a file's documents cut into chunks of a served model's tokens, and
the chunks of one store held in memory and searched by a first stage (dense, BM25 or their fusion), filtered
on attributes.

Chunks are the library's long-document windows (:func:`~embedrank.models.chunking.split_windows`): ``size``
tokens of the model's tokenizer overlapping by ``overlap``, each window the document's own text between its
first and last token, a document that fits one window kept whole. Dense scores are the inner products of the
model's vectors (cosine for a model that normalizes them, as the library's flat index scores them); a hybrid
fuses the dense and BM25 runs, each :data:`HYBRID_DEPTH` deep, by min-max score fusion with the dense stage's
weight, as :class:`~embedrank.retrieval.stages.HybridRetriever` does. A list of queries is searched query by
query and each chunk keeps its best score.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

import numpy as np

from embedrank.math.fusion import score_fusion
from embedrank.math.ranking import top_k
from embedrank.models.chunking import Offsets, split_windows
from embedrank.retrieval.bm25 import BM25Retriever
from embedrank.retrieval.documents import Document, InvalidFileError, UnsupportedFileError, file_type, read_documents
from embedrank.retrieval.filters import Filter, matches, parse_filter
from embedrank.retrieval.index import AnyIndex, IndexConfig, build_index
from embedrank.serving.hosting import HostedModel
from embedrank.types import Chunking, Run

__all__ = [
    "AUTO_ANN_CHUNKS",
    "HYBRID_DEPTH",
    "MIN_ANN_CHUNKS",
    "Chunks",
    "Document",
    "Filter",
    "InvalidFileError",
    "StoreIndex",
    "StoreIndexKind",
    "UnsupportedFileError",
    "chunk_documents",
    "file_type",
    "parse_filter",
    "read_documents",
    "window_of",
]

StoreIndexKind = Literal["auto", "flat", "hnsw", "ivf", "pq", "binary"]
MIN_ANN_CHUNKS = 1000
"""Fewer chunks than this are searched exactly whatever the store's index (an exact search is then as fast)."""
AUTO_ANN_CHUNKS = 1_000_000
"""From how many chunks ``auto`` searches through HNSW rather than exactly: exact search of 200,000 chunks
takes about 14 ms a query on 2 cores, where HNSW with the library's defaults finds only part of the exact top 10
(``eval/bench_store_index.py``), so ``auto`` stays exact up to the default ``max_vector_store_chunks``."""
HYBRID_DEPTH = 1000
"""How deep each stage of a hybrid is read before fusing (the library's default)."""
SLICE = 256
"""Documents tokenized at a time while chunking."""

FirstStage = Literal["dense", "bm25", "hybrid"]


async def window_of(served: HostedModel) -> int:
    """The tokens of a chunk ``served`` reads whole: its length less what its document prompt and special tokens
    take."""
    counts, _ = await served.count([""], input_type="document")
    return int(served.spec.max_seq_length - counts[0])


async def chunk_documents(
    served: HostedModel, docs: Sequence[Document], size: int, overlap: int
) -> list[tuple[str, int]]:
    """Every chunk of ``docs``: windows of ``size`` tokens of ``served``'s tokenizer overlapping by ``overlap``
    (a document that fits one is one chunk, its text as it is; a blank one has none); each chunk's text and the
    position of its document."""
    chunks: list[tuple[str, int]] = []
    for first in range(0, len(docs), SLICE):
        owners = [i for i, d in enumerate(docs[first : first + SLICE], start=first) if d.text.strip()]
        if not owners:
            continue
        texts = [docs[i].text for i in owners]
        spans = await served.token_spans(texts, add_special_tokens=False)
        computed = iter([[(s.start, s.stop) for s in row if s.start is not None] for row in spans])

        def offsets(part: Sequence[str], computed: Iterator[Offsets] = computed) -> list[Offsets]:
            return [next(computed) for _ in part]  # split_windows asks for the texts in order

        windows = split_windows(texts, offsets, window=size, chunking=Chunking(overlap=overlap))
        chunks.extend((text, owners[int(owner)]) for text, owner in zip(windows.texts, windows.owners, strict=True))
    return chunks


@dataclasses.dataclass(frozen=True)
class Chunks:
    """Every chunk of a store at ``version``: ``(N,)`` file ids, file names, texts and attributes, and their
    ``(N, D)`` float32 vectors."""

    version: int
    file_ids: list[str]
    filenames: list[str]
    texts: list[str]
    attributes: list[Mapping[str, str | int | float | bool]]
    vectors: np.ndarray


@dataclasses.dataclass
class StoreIndex:
    """One store's chunks at one version, its BM25 index (built on the first lexical search) and, for a
    ``kind`` other than ``flat``, its approximate dense index (``auto``: HNSW from :data:`AUTO_ANN_CHUNKS`
    chunks), built in a thread of its own from the first dense search on: until it is ready, and for a
    filtered search or a store of fewer than :data:`MIN_ANN_CHUNKS` chunks, the dense search is exact."""

    data: Chunks
    kind: StoreIndexKind = "flat"
    _bm25: BM25Retriever | None = None
    _ann: AnyIndex | None = None
    _building: threading.Thread | None = None
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def __len__(self) -> int:
        return len(self.data.texts)

    @property
    def dense_kind(self) -> str:
        """The index the unfiltered dense searches use: ``flat`` (exact) or an approximate kind."""
        if len(self) < MIN_ANN_CHUNKS or self.kind == "flat":
            return "flat"
        if self.kind == "auto":
            return "hnsw" if len(self) >= AUTO_ANN_CHUNKS else "flat"
        return self.kind

    def approximate(self) -> AnyIndex | None:
        """The approximate index if it is built; else None, and its build started (once)."""
        with self._lock:
            if self._ann is None and self._building is None:
                self._building = threading.Thread(target=self._build, name="store-index", daemon=True)
                self._building.start()
        return self._ann

    def wait_built(self, timeout: float | None = None) -> bool:
        """Wait for the approximate index's build (started by :meth:`approximate`); whether it is ready."""
        if self._building is not None:
            self._building.join(timeout)
        return self._ann is not None

    def _build(self) -> None:
        ann = build_index(self.data.vectors.shape[1], IndexConfig(kind=self.dense_kind, metric="dot"))  # type: ignore[arg-type]
        ann.add([str(i) for i in range(len(self))], self.data.vectors)
        self._ann = ann

    def allowed(self, where: Filter | None) -> np.ndarray | None:
        """``(N,)`` bool: the chunks whose attributes pass ``where`` (None: all)."""
        if where is None:
            return None
        return np.fromiter((matches(where, a) for a in self.data.attributes), dtype=bool, count=len(self))

    def dense(self, queries: np.ndarray, allowed: np.ndarray | None, depth: int) -> Run:
        """Top ``depth`` chunks (ids: row numbers as strings) by inner product, per query row of ``(Q, D)``:
        through the approximate index when it is ready and there is no filter, else exactly."""
        k = min(depth, len(self))
        ann = self.approximate() if allowed is None and self.dense_kind != "flat" else None
        if ann is not None:
            found = ann.search(queries.astype(np.float32), k)
            return {
                str(q): {i: float(s) for i, s in zip(ids, scores, strict=True) if i}
                for q, (scores, ids) in enumerate(zip(found[0], found[1], strict=True))
            }
        scores = queries.astype(np.float32) @ self.data.vectors.T  # (Q, N)
        if allowed is not None:
            scores[:, ~allowed] = -np.inf
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
        stage: FirstStage,
        queries: Sequence[str],
        vectors: np.ndarray | None,
        where: Filter | None,
        depth: int,
        *,
        hybrid_weight: float = 0.5,
    ) -> list[tuple[int, float]]:
        """The ``depth`` best chunks (row, score) for ``queries`` (their vectors ``(Q, D)`` for a dense stage)
        by ``stage``, among those that pass ``where``, best first."""
        if not len(self):
            return []
        allowed = self.allowed(where)
        if stage == "dense":
            assert vectors is not None
            run = self.dense(vectors, allowed, depth)
        elif stage == "bm25":
            run = self.lexical(queries, allowed, depth)
        else:
            assert vectors is not None
            deep = max(depth, HYBRID_DEPTH)
            fused = score_fusion(
                self.dense(vectors, allowed, deep), self.lexical(queries, allowed, deep), weight=hybrid_weight
            )
            run = {q: fused.get(q, {}) for q in map(str, range(len(queries)))}
        best: dict[int, float] = {}
        for docs in run.values():  # several queries: each chunk's best score
            for doc, score in docs.items():
                row = int(doc)
                best[row] = max(best.get(row, -np.inf), score)
        return sorted(best.items(), key=lambda item: (-item[1], item[0]))[:depth]
