"""A document store's chunks held in memory and searched by a first stage (dense, BM25, SPLADE, or a fusion of
them), filtered on attributes: the search a served vector store runs, callable in-process on the same chunks.

:class:`Chunks` holds a store's chunks (texts, attributes, dense and sparse vectors); :class:`StoreIndex`
searches them. Each stage takes its query input as vectors (the queries' dense vectors ``(Q, D)``, their SPLADE
vectors ``(Q, V)``; BM25 the texts) and a filter as a mask of the allowed chunks ``(N,)``
(:meth:`StoreIndex.allowed`, evaluated over the chunks' attribute columns at once). Dense scores are the inner
products of the model's vectors (cosine for a model that normalizes them, as the library's flat index scores
them); BM25 is :class:`~embedrank.retrieval.bm25.BM25Retriever` over the chunks' texts, scoring only the allowed
chunks; SPLADE scores are the exact dot products of a SPLADE model's sparse vectors (a chunk that shares no term
with the query is not found), as :class:`~embedrank.retrieval.sparse.SparseRetriever` scores them; a hybrid
fuses the runs of the stages it weighs, each :data:`HYBRID_DEPTH` deep, by min-max score fusion with their
weights, as :class:`~embedrank.retrieval.stages.HybridRetriever` does. A list of queries is searched query by
query and each chunk keeps its best score.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import scipy.sparse as sp

from embedrank.math.fusion import weighted_fusion
from embedrank.math.sparse import stacked, widened
from embedrank.retrieval.bm25 import BM25Retriever
from embedrank.retrieval.filters import AttributeColumns, Filter, allowed_rows
from embedrank.retrieval.index import AnyIndex, IndexConfig, build_index, load_index
from embedrank.types import Run

logger = logging.getLogger("embedrank.retrieval")

StoreIndexKind = Literal["auto", "flat", "hnsw", "ivf", "pq", "binary"]
MIN_ANN_CHUNKS = 1000
"""Fewer chunks than this are searched exactly whatever the store's index (an exact search is then as fast)."""
AUTO_ANN_CHUNKS = 1_000_000
"""From how many chunks ``auto`` searches through HNSW rather than exactly: exact search of 200,000 chunks
takes about 13 ms a query on 2 cores (``eval/benchmarks/store_index.py``), where HNSW takes a few ms but finds only
part of the exact top 10 on real text embeddings (how much depends on the data) and takes about two minutes to
build, so ``auto`` stays exact up to the default ``max_vector_store_chunks``."""
RETRAIN_GROWTH = 2
"""An approximate index that learns from its first vectors (IVF and PQ centroids, the int8 ranges of a binary
index's rescoring) is built again rather than grown once the store holds this many times the chunks it learnt
from."""
REMOVED_SHARE = 0.25
"""A saved approximate index whose vectors are more than this share of removed chunks is built again; below it,
it is grown and searched with the removed ones skipped (FAISS's ID selector)."""
SAVE_PREFIX = "ann-"
"""Saved approximate indexes are folders named ``ann-<version>-<token>`` in the store's folder."""
SAVED_FILE = "store-index.json"
"""Beside a saved index: how many vectors it learnt from and a SHA-256 of each of its files."""
STALE_SAVE_SECONDS = 3600
"""A save left unfinished by a process of another host (or an earlier version) is removed after this long; one
of this host's is removed as soon as its process is gone."""
HYBRID_DEPTH = 1000
"""How deep each stage of a hybrid is read before fusing (the library's default)."""
FirstStageName = Literal["dense", "bm25", "splade", "hybrid"]
Stage = Literal["dense", "bm25", "splade"]
STAGES: tuple[Stage, ...] = ("dense", "bm25", "splade")
"""The stages a hybrid may fuse."""


def hybrid_weights(dense_weight: float, weights: Mapping[Stage, float] | None = None) -> dict[Stage, float]:
    """The stages a hybrid fuses, each with its weight (those above 0): ``weights`` where given, else dense
    ``dense_weight`` and BM25 the rest.

    >>> hybrid_weights(0.7), hybrid_weights(0.5, {"dense": 0.5, "bm25": 0.0, "splade": 0.25})
    ({'dense': 0.7, 'bm25': 0.30000000000000004}, {'dense': 0.5, 'splade': 0.25})
    """
    given = weights if weights is not None else {"dense": dense_weight, "bm25": 1.0 - dense_weight}
    return {stage: float(given[stage]) for stage in STAGES if given.get(stage, 0.0) > 0}


def _best(scores: np.ndarray, k: int) -> Run:
    """Each query's ``k`` best rows (ids: row numbers as strings) of ``scores`` ``(Q, N)``, those not ``-inf``."""
    run: Run = {}
    for q, row in enumerate(scores):
        best = np.argpartition(-row, k - 1)[:k] if k < len(row) else np.arange(len(row))
        run[str(q)] = {str(int(i)): float(row[i]) for i in best if np.isfinite(row[i])}
    return run


def sparse_bytes(indices: np.ndarray, values: np.ndarray) -> bytes:
    """A sparse vector as stored: its indices as little-endian int32, then its values as float32."""
    return np.ascontiguousarray(indices, dtype="<i4").tobytes() + np.ascontiguousarray(values, dtype="<f4").tobytes()


def sparse_rows(blobs: list[bytes]) -> sp.csr_matrix:
    """``(N, V)`` float32 rows of stored sparse vectors (:func:`sparse_bytes`), ``V`` one past their largest
    index (a search widens the narrower of its queries and these to the other's width)."""
    indptr = np.zeros(len(blobs) + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(b) // 8 for b in blobs])
    indices = np.empty(int(indptr[-1]), dtype=np.int32)
    values = np.empty(int(indptr[-1]), dtype=np.float32)
    for i, blob in enumerate(blobs):
        n = len(blob) // 8
        indices[indptr[i] : indptr[i + 1]] = np.frombuffer(blob, dtype="<i4", count=n)
        values[indptr[i] : indptr[i + 1]] = np.frombuffer(blob, dtype="<f4", offset=4 * n)
    width = int(indices.max()) + 1 if len(indices) else 1
    return sp.csr_matrix((values, indices, indptr), shape=(len(blobs), width))


@dataclasses.dataclass(frozen=True)
class Chunks:
    """Every chunk of a store at ``version``: ``(N,)`` file ids, file names, texts and attributes, their
    ``(N, D)`` float32 vectors, and for a store with a SPLADE model their ``(N, V)`` sparse vectors; ``parts``:
    the rows ``[start, stop)`` of each part they were read in (a file, as the database's reader names it: the
    next version keeps the rows of the parts it still has), ``read``: how many rows were read from the database
    for this version (the others were kept from the version before); ``keys``: ``(N,)`` a name of each chunk's
    vector that every version holding the chunk gives it (an approximate index saved at one version is grown at
    the next by the chunks whose keys it lacks; empty: the row numbers, and nothing is carried over)."""

    version: int
    file_ids: list[str]
    filenames: list[str]
    texts: list[str]
    attributes: list[Mapping[str, str | int | float | bool]]
    vectors: np.ndarray
    sparse: sp.csr_matrix | None = None
    parts: Mapping[Hashable, tuple[int, int]] = dataclasses.field(default_factory=dict)
    read: int = 0
    keys: Sequence[str] = ()

    @staticmethod
    def stacked_sparse(parts: Sequence[sp.csr_matrix]) -> sp.csr_matrix:
        """The sparse vectors of chunks read part by part ``(N_i, V_i)``, one under the other: ``(N, V)``, ``V``
        the widest part's (a search widens the narrower of its queries and these to the other's width)."""
        return stacked(parts)


@dataclasses.dataclass
class StoreIndex:
    """One store's chunks at one version, its BM25 index and its sparse vectors by term (each built on the first
    search that needs it) and, for a ``kind`` other than ``flat``, its approximate dense index (``auto``: HNSW
    from :data:`AUTO_ANN_CHUNKS` chunks), built in a thread of its own from the first dense search on: until it
    is ready, and for a filtered search or a store of fewer than :data:`MIN_ANN_CHUNKS` chunks, the dense
    search is exact.

    With a ``folder``, the approximate index is saved there once built (written beside, synced, then renamed
    into place: a save stopped midway is never read) and the next build, at a later version, in this process
    or another one sharing the folder, starts from the newest saved index it can trust: one of the same
    configuration whose files match their recorded SHA-256, that learnt from at least 1/:data:`RETRAIN_GROWTH`
    of the chunks now (HNSW learns nothing) and whose vectors are at most :data:`REMOVED_SHARE` of chunks the
    store no longer has (by :attr:`Chunks.keys`); it adds only the chunks that index lacks, and its searches
    skip the removed ones. A corrupt or foreign save: built from all the chunks again."""

    data: Chunks
    kind: StoreIndexKind = "flat"
    folder: Path | None = None
    reused: int = 0
    """How many vectors the approximate index took from a saved one (0: built from the chunks alone)."""
    _bm25: BM25Retriever | None = None
    _columns: AttributeColumns | None = None
    _by_term: sp.csr_matrix | None = None
    _ann: AnyIndex | None = None
    _row_of: dict[str, int] = dataclasses.field(default_factory=dict)
    _skip: np.ndarray | None = None  # (M,) the approximate index's vectors of removed chunks
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

    @property
    def _config(self) -> IndexConfig:
        return IndexConfig(kind=self.dense_kind, metric="dot")  # type: ignore[arg-type]

    @property
    def _learns(self) -> bool:
        """Whether the approximate index learns from its first vectors (and is built again past their growth)."""
        return self.dense_kind != "hnsw"

    def _build(self) -> None:
        keys = list(self.data.keys) or [str(i) for i in range(len(self))]
        row_of = {key: row for row, key in enumerate(keys)}
        saved = self._saved(row_of) if self.folder is not None else None
        if saved is None:
            saved = build_index(self.data.vectors.shape[1], self._config), 0, np.empty(0, dtype=np.int64)
        ann, learnt, rows = saved
        present = np.zeros(len(keys), dtype=bool)
        present[rows[rows >= 0]] = True
        new = np.flatnonzero(~present)
        if len(new):
            ann.add([keys[row] for row in new], self.data.vectors[new])
        removed = np.concatenate([rows < 0, np.zeros(len(new), dtype=bool)])  # the index's rows, the new last
        self._skip = removed if removed.any() else None
        self.reused, self._row_of = int(present.sum()), row_of
        self._ann = ann
        if self.folder is not None and len(new):
            self._save(ann, learnt or len(new))

    def _saved(self, row_of: Mapping[str, int]) -> tuple[AnyIndex, int, np.ndarray] | None:
        """The newest index saved in :attr:`folder` this build can start from, how many vectors it learnt from,
        and the store's row of each of its vectors ``(len(index),)`` (-1: a removed chunk's); None when there is
        none."""
        assert self.folder is not None
        for path in sorted(self.folder.glob(SAVE_PREFIX + "*"), reverse=True):
            try:
                record = json.loads((path / SAVED_FILE).read_text())
                for name, digest in record["sha256"].items():
                    if _sha256(path / name) != digest:
                        raise ValueError(f"{name} does not match its recorded SHA-256")
                ann = load_index(path, dimension=self.data.vectors.shape[1])
            except Exception as exc:  # corrupt, another format, removed while read: not trusted
                logger.warning("vector store index %s not reused: %s", path, exc)
                continue
            if ann.config != self._config:
                continue
            if self._learns and len(row_of) > RETRAIN_GROWTH * int(record["learnt"]):
                continue
            rows = np.fromiter((row_of.get(key, -1) for key in ann.ids), dtype=np.int64, count=len(ann))
            if int((rows < 0).sum()) > REMOVED_SHARE * len(ann):
                continue  # too many vectors of removed chunks: a search would walk past them
            return ann, int(record["learnt"]), rows
        return None

    def _save(self, ann: AnyIndex, learnt: int) -> None:
        """Write ``ann`` into :attr:`folder` beside, sync it, rename it into place, then remove the older saves
        and the unfinished ones abandoned (:func:`_abandoned`); a failure only logs (the index still serves)."""
        assert self.folder is not None
        token = uuid.uuid4().hex[:12]
        part = self.folder / f".{SAVE_PREFIX}{token}-{_WRITER}.part"
        final = self.folder / f"{SAVE_PREFIX}{self.data.version:012d}-{token}"
        try:
            ann.save(part)
            names = sorted(p.name for p in part.iterdir())
            (part / SAVED_FILE).write_text(
                json.dumps({"learnt": learnt, "sha256": {name: _sha256(part / name) for name in names}})
            )
            for path in part.iterdir():
                _sync(path)
            _sync(part)
            part.rename(final)
            _sync(self.folder)
        except Exception as exc:  # a full disk, FAISS's own write errors: the index still serves, unsaved
            logger.warning("vector store index not saved in %s: %s", self.folder, exc)
            shutil.rmtree(part, ignore_errors=True)
            return
        for path in self.folder.iterdir():
            if (path.name.startswith(SAVE_PREFIX) and path.name < final.name) or _abandoned(path):
                shutil.rmtree(path, ignore_errors=True)

    def allowed(self, where: Filter | None) -> np.ndarray | None:
        """``(N,)`` bool: the chunks whose attributes pass ``where`` (None: all), evaluated over the chunks'
        attribute columns (built on the first filtered search)."""
        if where is None:
            return None
        with self._lock:
            if self._columns is None:
                self._columns = AttributeColumns.of(self.data.attributes)
        return allowed_rows(where, self._columns)

    def dense(self, queries: np.ndarray, allowed: np.ndarray | None, depth: int) -> Run:
        """Top ``depth`` chunks (ids: row numbers as strings) by inner product, per query row of ``(Q, D)``:
        through the approximate index when it is ready and there is no filter, else exactly."""
        k = min(depth, len(self))
        ann = self.approximate() if allowed is None and self.dense_kind != "flat" else None
        if ann is not None:
            found = ann.search(queries.astype(np.float32), k, skip=self._skip)
            return {
                str(q): {str(self._row_of[i]): float(s) for i, s in zip(ids, scores, strict=True)}
                for q, (scores, ids) in enumerate(zip(found[0], found[1], strict=True))
            }
        scores = queries.astype(np.float32) @ self.data.vectors.T  # (Q, N)
        if allowed is not None:
            scores[:, ~allowed] = -np.inf
        return _best(scores, k)

    def lexical(self, queries: Sequence[str], allowed: np.ndarray | None, depth: int) -> Run:
        """Top ``depth`` chunks by BM25 among the ``allowed`` ones ``(N,)`` (None: all), per query."""
        with self._lock:
            if self._bm25 is None:
                self._bm25 = BM25Retriever([str(i) for i in range(len(self))], self.data.texts)
        return self._bm25.retrieve({str(q): text for q, text in enumerate(queries)}, depth, allowed=allowed)

    def splade(self, queries: sp.csr_matrix, allowed: np.ndarray | None, depth: int) -> Run:
        """Top ``depth`` chunks by the dot product of sparse vectors (score > 0), per query row of ``(Q, V)``:
        through the chunks' vectors by term ``(V, N)``, built on the first SPLADE search, so that a search reads
        only its terms' rows (about 1 ms for 200,000 chunks, where a product with the chunks' rows, transposed
        at each search, takes 0.5 s)."""
        with self._lock:
            if self._by_term is None:
                if self.data.sparse is None:
                    raise ValueError("this store's chunks have no sparse vectors")
                self._by_term = self.data.sparse.T.tocsr()
        k = min(depth, len(self))
        width = self._by_term.shape[0]  # the chunks' largest index + 1: a query's terms past it match nothing
        if queries.shape[1] < width:
            queries = widened(queries, width)
        scores = np.asarray((queries[:, :width] @ self._by_term).toarray(), dtype=np.float32)  # (Q, N)
        scores[scores <= 0] = -np.inf  # a chunk that shares no term with the query is not found
        if allowed is not None:
            scores[:, ~allowed] = -np.inf
        return _best(scores, k)

    def search(
        self,
        stage: FirstStageName,
        queries: Sequence[str],
        vectors: np.ndarray | None,
        where: Filter | None,
        depth: int,
        *,
        sparse: sp.csr_matrix | None = None,
        weights: Mapping[Stage, float] | None = None,
    ) -> list[tuple[int, float]]:
        """The ``depth`` best chunks (row, score) for ``queries`` by ``stage``, among those that pass ``where``,
        best first: a dense stage needs the queries' vectors ``(Q, D)``, a SPLADE stage their ``sparse`` vectors
        ``(Q, V)``; a hybrid fuses the stages ``weights`` gives a weight above 0 (default: dense and BM25
        equally)."""
        if not len(self):
            return []
        allowed = self.allowed(where)

        def run_of(name: Stage, deep: int) -> Run:
            if name == "dense":
                assert vectors is not None
                return self.dense(vectors, allowed, deep)
            if name == "splade":
                assert sparse is not None
                return self.splade(sparse, allowed, deep)
            return self.lexical(queries, allowed, deep)

        if stage != "hybrid":
            run = run_of(stage, depth)
        else:
            weighed = hybrid_weights(0.5, weights)
            deep = max(depth, HYBRID_DEPTH)
            fused = weighted_fusion([run_of(name, deep) for name in weighed], list(weighed.values()))
            run = {q: fused.get(q, {}) for q in map(str, range(len(queries)))}
        best: dict[int, float] = {}
        for docs in run.values():  # several queries: each chunk's best score
            for doc, score in docs.items():
                row = int(doc)
                best[row] = max(best.get(row, -np.inf), score)
        return sorted(best.items(), key=lambda item: (-item[1], item[0]))[:depth]


_WRITER = f"{socket.gethostname()}-{os.getpid()}"
"""Who writes an unfinished save: this host and process (a save's folder is ``.ann-<token>-<host>-<pid>.part``)."""


def _abandoned(path: Path) -> bool:
    """Whether ``path`` is an unfinished save that no one will finish: its writer on this host is no longer
    running (it was killed while saving), or, from another host or an earlier version, it is older than
    :data:`STALE_SAVE_SECONDS`."""
    if not (path.name.startswith(".") and path.name.endswith(".part")):
        return False
    host, _, pid = path.name.removesuffix(".part").rpartition("-")
    if host.endswith("-" + socket.gethostname()) and pid.isdigit() and int(pid) != os.getpid():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # another user's live process
            return False
    try:
        return time.time() - path.stat().st_mtime > STALE_SAVE_SECONDS
    except FileNotFoundError:
        return False


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _sync(path: Path) -> None:
    """Flush ``path`` (a file or a folder's entries) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
