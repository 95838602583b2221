"""What every vector index shares: its configuration, the protocol, and a base class that keeps string
ids, checks the model and dimension, and saves and loads the metadata. Each index class adds its own
storage (:mod:`embedrank.retrieval.index`, :mod:`embedrank.retrieval.binary_index`) and reads it back in
its own :meth:`BaseIndex._read`; :meth:`BaseIndex.load` does the rest for all of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

import numpy as np

from embedrank.errors import IndexMismatchError, InvalidInputError
from embedrank.math.similarity import l2_normalize
from embedrank.retrieval.ids import IdTable

Metric = Literal["cosine", "dot", "l2"]
IndexKind = Literal["numpy", "flat", "ivf", "hnsw", "pq", "sq8", "binary", "factory"]
META_FILE = "embedrank_index.json"
SearchResult = tuple[list[np.ndarray], list[list[str]]]
"""``(scores, ids)``: per query, a ``(k',)`` float32 array of scores, best first, and the matching doc ids."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexConfig:
    """How to build an index. ``None`` parameters are chosen from the data when training."""

    kind: IndexKind = "flat"
    metric: Metric = "cosine"
    nlist: int | None = None  # ivf/pq: number of clusters; default ~ sqrt(N)
    nprobe: int | None = None  # ivf/pq: clusters searched; default min(nlist, max(16, nlist // 3))
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    pq_m: int | None = None  # pq: sub-quantizers; default dim // 8
    pq_nbits: int | None = None  # pq: bits per code; default 8, fewer when there are < 39 * 256 vectors
    factory: str | None = None
    rescore: str = "int8"  # binary: rescore candidates with int8 codes, the sign bits ("bits"), or "none"
    rescore_multiplier: int = 4  # binary: Hamming candidates per result kept


@contextlib.contextmanager
def faiss_selector(skip: np.ndarray) -> Iterator[Any]:
    """A FAISS ID selector of the rows ``skip`` ``(N,)`` bool leaves out, for the block (its bitmap stays alive
    as long as FAISS may read it)."""
    import faiss

    bits = np.packbits(skip, bitorder="little")
    kept = faiss.IDSelectorBitmap(len(skip), faiss.swig_ptr(bits))  # the bitmap of the rows to leave out
    yield faiss.IDSelectorNot(kept)  # FAISS holds pointers to both: bits and kept stay alive until the block ends


@runtime_checkable
class VectorIndex(Protocol):
    """What every index backend offers."""

    config: IndexConfig
    dimension: int
    model_id: str | None

    def __len__(self) -> int: ...

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None: ...

    def search(self, queries: np.ndarray, k: int, *, skip: np.ndarray | None = None) -> SearchResult: ...

    def reconstruct(self, ids: Sequence[str]) -> np.ndarray | None: ...

    def save(self, directory: str | Path) -> Path: ...


def _as_matrix(vectors: np.ndarray, dimension: int, what: str) -> np.ndarray:
    x = np.ascontiguousarray(np.atleast_2d(np.asarray(vectors, dtype=np.float32)))
    if x.ndim != 2 or x.shape[1] != dimension:
        raise IndexMismatchError(f"{what} have dimension {x.shape[-1]}, but the index holds dimension {dimension}")
    return x


Index = TypeVar("Index", bound="BaseIndex")


def read_meta(directory: str | Path) -> dict[str, Any]:
    """The metadata an index saved next to its data (``IndexMismatchError`` if there is none)."""
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise IndexMismatchError(f"{directory} is not an embedrank index directory (no {META_FILE})")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


class BaseIndex:
    """String ids, model and dimension checks, metadata; subclasses store and search the vectors."""

    kinds: ClassVar[frozenset[str]] = frozenset()  # the IndexConfig kinds this class implements

    def __init__(self, dimension: int, config: IndexConfig, *, model_id: str | None = None) -> None:
        if dimension < 1:
            raise InvalidInputError(f"dimension must be >= 1, got {dimension}")
        self.dimension = int(dimension)
        self.config = config
        self.model_id = model_id
        # the vectors' embedding settings (EmbeddingSignature.to_dict()), recorded by the retrieval pipeline
        # and the sharded build; None for an index built by hand (then only model and dimension are known)
        self.signature: dict[str, Any] | None = None
        self.ids = IdTable()  # doc ids in row order, compact, with a hashed lookup (retrieval.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self.ids

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.config.kind}, metric={self.config.metric}, dim={self.dimension}, n={len(self)})"

    def _prepare(self, vectors: np.ndarray, what: str) -> np.ndarray:
        x = _as_matrix(vectors, self.dimension, what)
        return l2_normalize(x) if self.config.metric == "cosine" else x

    def _register(self, ids: Sequence[str], n: int) -> list[str]:
        ids = [str(i) for i in ids]
        if len(ids) != n:
            raise InvalidInputError(f"got {len(ids)} ids for {n} vectors")
        duplicate = self.ids.first_duplicate(ids)
        if duplicate is not None:
            raise InvalidInputError(f"duplicate document ids, e.g. {duplicate!r}")
        return ids

    def _commit(self, ids: Sequence[str]) -> None:
        self.ids.extend(ids)

    def _rows(self, ids: Sequence[str]) -> list[int]:
        """Index rows of ``ids`` (KeyError for an id the index does not hold)."""
        return self.ids.rows(ids)

    def check_compatible(self, *, model_id: str | None = None, dimension: int | None = None) -> None:
        """Refuse a model or dimension other than the one the index was built with."""
        if dimension is not None and dimension != self.dimension:
            raise IndexMismatchError(f"index holds {self.dimension}-d vectors, but the query model gives {dimension}-d")
        if model_id is not None and self.model_id is not None and model_id != self.model_id:
            raise IndexMismatchError(
                f"index was built with model {self.model_id!r}; searching it with {model_id!r} would compare "
                f"vectors from different spaces. Rebuild the index or use the same model."
            )

    def _skipped(self, skip: np.ndarray | None) -> np.ndarray | None:
        """``skip`` checked: ``(N,)`` bool over the index's rows, True for a row no search may return."""
        if skip is None:
            return None
        skip = np.asarray(skip)
        if skip.dtype != bool or skip.shape != (len(self),):
            raise InvalidInputError(
                f"skip must be ({len(self)},) booleans, got {skip.dtype} {skip.shape}", param="skip"
            )
        return skip

    def _results(self, scores: np.ndarray, positions: np.ndarray) -> SearchResult:
        """Per query, the scores and ids of the hits. FAISS marks missing hits (an IVF search that probed
        fewer than ``k`` vectors, an HNSW walk that found fewer) with position -1; they are left out of both
        the scores and the ids, so a row may be shorter than ``k``."""
        found = positions >= 0  # (Q, k)
        row_scores = [row[keep].astype(np.float32) for row, keep in zip(scores, found, strict=True)]
        row_ids = [[self.ids[int(p)] for p in row[keep]] for row, keep in zip(positions, found, strict=True)]
        return row_scores, row_ids

    @property
    def can_reconstruct(self) -> bool:
        """Whether :meth:`reconstruct` gives the stored vectors exactly."""
        return True

    def reconstruct(self, ids: Sequence[str]) -> np.ndarray | None:
        """The stored vectors ``(N, D)`` of ``ids`` as searched (normalized for cosine), or None when this
        index does not keep them exactly (IVF-PQ and other compressed codes)."""
        raise NotImplementedError

    def _meta(self) -> dict[str, Any]:
        return {
            "format": 1,
            "model_id": self.model_id,
            "dimension": self.dimension,
            "metric": self.config.metric,
            "normalized": self.config.metric == "cosine",
            "count": len(self),
            "config": dataclasses.asdict(self.config),
            "signature": self.signature,
        }

    def _write_meta(self, directory: Path) -> None:
        self.ids.save(directory)
        (directory / "ids.json").unlink(missing_ok=True)  # an older save's list, which would disagree
        (directory / META_FILE).write_text(json.dumps(self._meta(), indent=2))

    def _read(self, directory: Path) -> None:
        """Read back what :meth:`save` wrote besides the ids and metadata (each class its own)."""
        raise NotImplementedError

    @classmethod
    def load(
        cls: type[Index], directory: str | Path, *, model_id: str | None = None, dimension: int | None = None
    ) -> Index:
        """Load an index this class saved; refuse it if ``model_id``/``dimension`` differ from the saved ones,
        if it is another kind of index, or if its files disagree on the count."""
        root = Path(directory)
        meta = read_meta(root)
        config = IndexConfig(**meta["config"])
        if config.kind not in cls.kinds:
            raise IndexMismatchError(f"{root} holds a {config.kind!r} index, not one of {sorted(cls.kinds)}")
        index = cls(meta["dimension"], config, model_id=meta["model_id"])
        index.signature = meta.get("signature")
        index.check_compatible(model_id=model_id, dimension=dimension)
        index._read(root)
        index.ids = IdTable.load(root)
        if len(index) != meta["count"]:
            raise IndexMismatchError(f"{root}: metadata says {meta['count']} vectors, the ids file has {len(index)}")
        return index
