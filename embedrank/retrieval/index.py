"""Vector indexes behind one protocol: exact numpy (the test oracle) and FAISS backends.

Backends (``kind``): ``numpy`` (exact, pure numpy), ``flat`` (FAISS ``IndexFlatIP``/``IndexFlatL2``),
``ivf`` (IVF-Flat: ``nlist``, ``nprobe``), ``hnsw`` (``hnsw_m``, ``ef_construction``, ``ef_search``),
``pq`` (IVF-PQ: ``pq_m``, ``pq_nbits``), ``sq8`` (FAISS 8-bit scalar quantizer: per-dimension ranges
trained on the first add, 4x smaller than float32), ``binary`` (sign bits, Hamming search, rescored:
:mod:`embedrank.retrieval.binary_index`), and ``factory`` (any FAISS factory string). Indexes keep string
document ids, grow with :meth:`add`, train IVF/PQ automatically on the first add, and save to / load from
a directory together with metadata (model id, dimension, metric, normalization, count). The model id and
dimension are checked by :func:`load_index` and when a ``DenseRetriever`` is built on the index; every
search checks the queries' dimension. Searches may return fewer than ``k`` hits per query (approximate
kinds), never padding.

Scores are "higher is better": inner product for ``cosine`` and ``dot``, negative squared L2 for ``l2``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from embedrank.errors import IndexTrainingError, InvalidInputError
from embedrank.retrieval.binary_index import BinaryIndex
from embedrank.retrieval.index_base import (
    META_FILE,
    BaseIndex,
    IndexConfig,
    IndexKind,
    Metric,
    SearchResult,
    VectorIndex,
    faiss_selector,
    read_meta,
)

__all__ = [
    "AnyIndex",
    "BinaryIndex",
    "FaissIndex",
    "IndexConfig",
    "IndexKind",
    "Metric",
    "NumpyIndex",
    "SearchResult",
    "VectorIndex",
    "build_index",
    "is_index_dir",
    "load_index",
    "recall_at_k",
]


class NumpyIndex(BaseIndex):
    """Exact search in plain numpy; the oracle the FAISS backends are tested against."""

    kinds = frozenset({"numpy"})

    def __init__(self, dimension: int, config: IndexConfig | None = None, *, model_id: str | None = None) -> None:
        super().__init__(dimension, config or IndexConfig(kind="numpy"), model_id=model_id)
        self._vectors = np.empty((0, self.dimension), dtype=np.float32)

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        x = self._prepare(vectors, "vectors")
        ids = self._register(ids, x.shape[0])
        self._vectors = np.vstack([self._vectors, x])
        self._commit(ids)

    def search(self, queries: np.ndarray, k: int, *, skip: np.ndarray | None = None) -> SearchResult:
        """Top ``k`` per query: scores (one ``(k',)`` array per query, ``k' = min(k, len(self))``) and ids;
        ties break by insertion order. ``skip``: ``(N,)`` bool, rows never returned."""
        q = self._prepare(queries, "queries")  # (Q, D)
        skip = self._skipped(skip)
        if self.config.metric == "l2":
            scores = -((q[:, None, :] - self._vectors[None, :, :]) ** 2).sum(-1)  # (Q, N)
        else:
            scores = q @ self._vectors.T  # (Q, N)
        k = min(k, len(self) - (int(skip.sum()) if skip is not None else 0))
        if skip is not None:
            scores[:, skip] = -np.inf
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # (Q, k)
        return self._results(np.take_along_axis(scores, order, axis=1), order)

    def reconstruct(self, ids: Sequence[str]) -> np.ndarray:
        return self._vectors[self._rows(ids)]

    def save(self, directory: str | Path) -> Path:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / "vectors.npy", self._vectors)
        self._write_meta(out)
        return out

    def _read(self, directory: Path) -> None:
        self._vectors = np.load(directory / "vectors.npy")


class FaissIndex(BaseIndex):
    """A FAISS index (flat, IVF, HNSW, IVF-PQ or a factory string) with string ids and metadata."""

    kinds = frozenset({"flat", "ivf", "hnsw", "pq", "sq8", "factory"})

    def __init__(self, dimension: int, config: IndexConfig | None = None, *, model_id: str | None = None) -> None:
        super().__init__(dimension, config or IndexConfig(), model_id=model_id)
        if self.config.kind == "numpy":
            raise InvalidInputError("kind='numpy' is NumpyIndex; use build_index")
        self._index: Any = None
        self.device = "cpu"  # where the index searches: to_device
        self._on_gpu = False  # whether _index is in its GPU form
        if self.config.kind in ("flat", "hnsw"):
            self._index = self._build(n_train=0)

    @property
    def _faiss_metric(self) -> int:
        import faiss

        return faiss.METRIC_L2 if self.config.metric == "l2" else faiss.METRIC_INNER_PRODUCT

    def _build(self, n_train: int) -> Any:
        import faiss

        c, d = self.config, self.dimension
        if c.kind == "flat":
            return faiss.IndexFlatL2(d) if c.metric == "l2" else faiss.IndexFlatIP(d)
        if c.kind == "hnsw":
            index: Any = faiss.IndexHNSWFlat(d, c.hnsw_m, self._faiss_metric)
            index.hnsw.efConstruction = c.ef_construction
            index.hnsw.efSearch = c.ef_search
            return index
        if c.kind == "sq8":
            return faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_8bit, self._faiss_metric)
        if c.kind == "factory":
            if not c.factory:
                raise InvalidInputError("kind='factory' needs a FAISS factory string, e.g. 'IVF64,Flat'")
            return faiss.index_factory(d, c.factory, self._faiss_metric)
        nlist = c.nlist or max(1, min(round(math.sqrt(n_train)), 65536))
        if n_train < nlist:
            raise IndexTrainingError(
                f"{c.kind} index with nlist={nlist} needs at least {nlist} vectors to train, got {n_train}; "
                f"lower nlist or add more vectors in the first call to add()"
            )
        quantizer = faiss.IndexFlatL2(d) if c.metric == "l2" else faiss.IndexFlatIP(d)
        ivf: Any
        if c.kind == "ivf":
            ivf = faiss.IndexIVFFlat(quantizer, d, nlist, self._faiss_metric)
        elif c.kind == "pq":
            m = c.pq_m or max(1, d // 8)
            if d % m:
                raise InvalidInputError(f"pq_m={m} must divide the dimension {d}")
            # FAISS wants >= 39 training points per centroid; pick the largest code size the data supports.
            nbits = c.pq_nbits or max(4, min(8, int(math.log2(max(n_train, 1) / 39))))
            if n_train < 2**nbits:
                raise IndexTrainingError(
                    f"pq index with pq_nbits={nbits} needs at least {2**nbits} vectors to train, got {n_train}"
                )
            ivf = faiss.IndexIVFPQ(quantizer, d, nlist, m, nbits, self._faiss_metric)
        else:
            raise InvalidInputError(f"unknown index kind {c.kind!r}")
        ivf.nprobe = c.nprobe or min(nlist, max(16, nlist // 3))
        self._quantizer = quantizer  # keep the quantizer alive as long as the index
        return ivf

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        x = self._prepare(vectors, "vectors")
        ids = self._register(ids, x.shape[0])
        if self._index is None:
            self._index = self._build(n_train=x.shape[0])
            self._place()  # built on its first vectors on the CPU
        if not self._index.is_trained:
            self._index.train(x)
        self._index.add(x)
        self._commit(ids)

    def to_device(self, device: str) -> FaissIndex:
        """Search (and add) on ``device``: ``"cuda"`` / ``"cuda:<index>"`` copies the index to that GPU (FAISS's
        GPU indexes: flat, IVF, IVF-PQ and SQ8; an HNSW graph has none), ``"cpu"`` copies it back. Needs a GPU
        build of FAISS (conda's ``faiss-gpu``, or pip's community ``faiss-gpu-cu12``, in place of ``faiss-cpu``).
        Saving writes the CPU form either way. Returns the index.

        Raises:
            InvalidInputError: the FAISS installed has no GPU support or sees no such GPU, or the kind has no GPU
                index.
        """
        import faiss

        name = device.strip().lower()
        if name != "cpu":
            if not name.startswith("cuda"):
                raise InvalidInputError(
                    f"device must be 'cpu', 'cuda' or 'cuda:<index>', got {device!r}", param="device"
                )
            gpus = faiss.get_num_gpus() if hasattr(faiss, "StandardGpuResources") else 0
            if gpus == 0:
                raise InvalidInputError(
                    f"the FAISS installed ({getattr(faiss, '__version__', '?')}) has no GPU support or sees no GPU: "
                    "install a GPU build (conda's faiss-gpu, or pip's faiss-gpu-cu12 in place of faiss-cpu)",
                    param="device",
                )
            gpu = int(name.partition(":")[2] or 0)
            if gpu >= gpus:
                raise InvalidInputError(f"device {device!r}: FAISS sees {gpus} GPU(s)", param="device")
            if self.config.kind == "hnsw":
                raise InvalidInputError("an HNSW index has no FAISS GPU form; use flat, ivf, pq or sq8", param="device")
            name = f"cuda:{gpu}"
        self.device = name
        self._place()
        return self

    def _place(self) -> None:
        """Put the index where :attr:`device` says (an IVF or PQ index is built on the CPU, then placed)."""
        import faiss

        if self._index is None:
            return
        index = self._cpu_index()
        if self.device != "cpu":
            self._resources = faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(self._resources, int(self.device.partition(":")[2]), index)
        self._index, self._on_gpu = index, self.device != "cpu"

    def _cpu_index(self) -> Any:
        """The index in its CPU form (a copy when it lives on a GPU)."""
        import faiss

        return faiss.index_gpu_to_cpu(self._index) if self._on_gpu else self._index

    def set_search_params(self, *, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """Change search-time parameters (IVF ``nprobe``, HNSW ``efSearch``) without rebuilding."""
        import faiss

        if nprobe is not None:
            faiss.extract_index_ivf(self._index).nprobe = nprobe
        if ef_search is not None:
            hnsw: Any = faiss.downcast_index(self._index)
            hnsw.hnsw.efSearch = ef_search

    def search(self, queries: np.ndarray, k: int, *, skip: np.ndarray | None = None) -> SearchResult:
        """Top ``k`` per query: scores (one ``(k',)`` array per query, higher is better) and ids. Approximate
        kinds may return fewer than ``min(k, len(self))`` hits (a small ``nprobe``, an HNSW walk that stops
        early). ``skip``: ``(N,)`` bool, rows never returned (FAISS's ID selector, passed with the index's own
        ``nprobe`` or ``efSearch``)."""
        q = self._prepare(queries, "queries")
        skip = self._skipped(skip)
        if self._index is None or len(self) == 0:
            return [np.zeros(0, dtype=np.float32) for _ in range(q.shape[0])], [[] for _ in range(q.shape[0])]
        k = min(k, len(self) - (int(skip.sum()) if skip is not None else 0))
        if k <= 0:
            return [np.zeros(0, dtype=np.float32) for _ in range(q.shape[0])], [[] for _ in range(q.shape[0])]
        if skip is None:
            scores, positions = self._index.search(q, k)  # (Q, k), (Q, k)
        else:
            with faiss_selector(skip) as selector:
                scores, positions = self._index.search(q, k, params=self._params(selector))
        if self.config.metric == "l2":
            scores = -scores
        return self._results(scores, positions)

    def _params(self, selector: Any) -> Any:
        """Search parameters that keep the index's own ``efSearch`` or ``nprobe`` and add ``selector``."""
        import faiss

        lib: Any = faiss  # its stubs lack the parameters' keyword arguments
        index = faiss.downcast_index(self._index)
        if isinstance(index, faiss.IndexHNSW):
            return lib.SearchParametersHNSW(sel=selector, efSearch=index.hnsw.efSearch)
        ivf = faiss.try_extract_index_ivf(self._index)
        if ivf is not None:
            return lib.SearchParametersIVF(sel=selector, nprobe=ivf.nprobe)
        return lib.SearchParameters(sel=selector)

    @property
    def can_reconstruct(self) -> bool:
        return self._index is not None and not self._on_gpu and self.config.kind in ("flat", "hnsw", "ivf")  # PQ: lossy

    def reconstruct(self, ids: Sequence[str]) -> np.ndarray | None:
        import faiss

        if not self.can_reconstruct:
            return None
        keys = np.array(self._rows(ids), dtype=np.int64)
        ivf = faiss.try_extract_index_ivf(self._index)
        if ivf is not None:
            ivf.make_direct_map()  # positions -> inverted-list entries; idempotent
        return np.asarray(self._index.reconstruct_batch(keys), dtype=np.float32)

    @property
    def bytes_per_vector(self) -> float:
        """Serialized index size divided by the number of vectors (ids not counted)."""
        import faiss

        return float(faiss.serialize_index(self._cpu_index()).nbytes) / max(1, len(self))

    def save(self, directory: str | Path) -> Path:
        import faiss

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        if self._index is not None:
            faiss.write_index(self._cpu_index(), str(out / "index.faiss"))
        self._write_meta(out)
        return out

    def _read(self, directory: Path) -> None:
        import faiss

        if (directory / "index.faiss").is_file():  # absent when an empty IVF/PQ index was saved
            # an index merged on disk (sharded_index.merge_shards_on_disk) finds index.ivfdata next to it
            self._index = faiss.read_index(str(directory / "index.faiss"), faiss.IO_FLAG_ONDISK_SAME_DIR)


AnyIndex: TypeAlias = "NumpyIndex | FaissIndex | BinaryIndex"
INDEX_CLASSES: tuple[type[BaseIndex], ...] = (NumpyIndex, FaissIndex, BinaryIndex)


def index_class(kind: str) -> type[NumpyIndex | FaissIndex | BinaryIndex]:
    """The class that implements ``kind``."""
    for cls in INDEX_CLASSES:
        if kind in cls.kinds:
            return cls  # type: ignore[return-value]
    raise InvalidInputError(f"unknown index kind {kind!r}", param="kind")


def build_index(
    dimension: int, config: IndexConfig | None = None, *, model_id: str | None = None, **overrides: Any
) -> AnyIndex:
    """Make an empty index: ``build_index(384, kind="hnsw", metric="cosine", model_id=...)``."""
    cfg = dataclasses.replace(config or IndexConfig(), **overrides)
    return index_class(cfg.kind)(dimension, cfg, model_id=model_id)


def is_index_dir(directory: str | Path) -> bool:
    """Whether ``directory`` holds an index saved with ``save`` (rather than, say, embedding shards)."""
    return (Path(directory) / META_FILE).is_file()


def load_index(directory: str | Path, *, model_id: str | None = None, dimension: int | None = None) -> AnyIndex:
    """Load an index saved with ``save``, whatever its kind; refuse it if ``model_id``/``dimension`` differ
    from the saved ones (the index class's own :meth:`~embedrank.retrieval.index_base.BaseIndex.load`)."""
    kind = read_meta(directory)["config"]["kind"]
    return index_class(kind).load(directory, model_id=model_id, dimension=dimension)


def recall_at_k(approx: Sequence[Sequence[str]], exact: Sequence[Sequence[str]]) -> float:
    """Mean fraction of the exact top-k ids that the approximate search also returned.

    >>> recall_at_k([["a", "b"], ["c", "x"]], [["a", "b"], ["c", "d"]])
    0.75
    """
    if len(approx) != len(exact):
        raise InvalidInputError(f"{len(approx)} approximate result lists vs {len(exact)} exact ones")
    per_query = [len(set(a) & set(e)) / len(e) for a, e in zip(approx, exact, strict=True) if e]
    return float(sum(per_query) / len(per_query)) if per_query else 0.0
