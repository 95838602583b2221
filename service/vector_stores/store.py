"""The durable state of vector stores: their rows, their files' rows, each file's chunks (text and vector) and
the file batches, in the service's storage (:mod:`service.storage`: SQLite's database by default, or the
PostgreSQL server that replicas share), on the database's clock.

A file attached to a store is ``in_progress`` until a worker has read, chunked and embedded it. The worker
claims the file (a lease it renews while it works, as batch chunks are claimed) and writes its chunks in parts as
they are embedded (:meth:`VectorStoreTables.write_chunks`), each in a transaction that succeeds only while its claim
holds and the file is still ``in_progress`` (not cancelled nor removed meanwhile); the first part removes what an
earlier read of the file left. Searches read only the chunks of ``completed`` files, so a file's chunks are seen
all at once, when :meth:`VectorStoreTables.complete` marks it ``completed``, or never: a worker killed midway
leaves a part no search sees, which the next read of the file replaces (it is claimed again when its lease runs
out, at once on a single host's SQLite, whose claims are released at start), and a file that fails, is cancelled
or removed has its chunks removed.

Every write that changes what a search sees (a file completed or removed, a file's attributes changed) bumps
the store's ``version``: each replica's search index (:mod:`service.vector_stores.search`) is rebuilt when the
version it holds is not the database's.

A store with ``expires_after_days`` expires that many days after its ``last_active_at`` (its creation, or its last
search). An expired store answers no search and takes no file; :meth:`VectorStoreTables.expire` empties it (its
files not read yet are cancelled, its chunks removed): its object and its files' rows stay, status ``expired``, until
deleted, and no longer count against its owner's ``max_vector_stores``.

Every row carries its owner (a digest of the API key); every read and change names it, so another key's stores
are never found.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import msgspec
import numpy as np
import scipy.sparse as sp

from embedrank.retrieval.store import Chunks, FirstStageName, Stage, StoreIndexKind, sparse_bytes, sparse_rows
from service.errors import StoreError
from service.storage.database import Connection
from service.storage.ids import new_id
from service.storage.leases import Leases, free
from service.storage.paging import Order, Page, page
from service.storage.storage import Storage

SCHEMA = """
CREATE TABLE IF NOT EXISTS vector_stores (
    seq {serial},
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    name TEXT,
    description TEXT,
    metadata TEXT,
    model TEXT NOT NULL,
    first_stage TEXT NOT NULL,
    hybrid_weight {real} NOT NULL,
    hybrid_weights TEXT,
    sparse_model TEXT,
    adapter TEXT,
    index_kind TEXT NOT NULL DEFAULT 'auto',
    chunk_size INTEGER NOT NULL,
    chunk_overlap INTEGER NOT NULL,
    expires_after_days INTEGER,
    created_at INTEGER NOT NULL,
    last_active_at INTEGER NOT NULL,
    version INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS vector_stores_by_owner ON vector_stores (owner, seq);
CREATE TABLE IF NOT EXISTS vector_store_files (
    seq {serial},
    vector_store_id TEXT NOT NULL,
    file_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    batch_id TEXT,
    filename TEXT NOT NULL,
    attributes TEXT,
    chunk_size INTEGER NOT NULL,
    chunk_overlap INTEGER NOT NULL,
    status TEXT NOT NULL,
    last_error TEXT,
    usage_bytes INTEGER NOT NULL DEFAULT 0,
    chunks INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    claimed_by TEXT,
    lease_until {real},
    UNIQUE (vector_store_id, file_id)
);
CREATE INDEX IF NOT EXISTS vector_store_files_by_status ON vector_store_files (status, seq);
CREATE TABLE IF NOT EXISTS vector_store_chunks (
    vector_store_id TEXT NOT NULL,
    file_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    text TEXT NOT NULL,
    attributes TEXT,
    vector {blob} NOT NULL,
    sparse {blob},
    PRIMARY KEY (vector_store_id, file_id, number)
);
CREATE TABLE IF NOT EXISTS vector_store_file_batches (
    seq {serial},
    id TEXT NOT NULL UNIQUE,
    vector_store_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    cancelled_at INTEGER
);
CREATE TABLE IF NOT EXISTS vector_store_batch_files (
    batch_id TEXT NOT NULL,
    vector_store_id TEXT NOT NULL,
    file_id TEXT NOT NULL,
    PRIMARY KEY (batch_id, file_id)
);
"""
"""A file's row names the attachment that made it (``batch_id``: attached again by a later batch, the later one);
each file batch keeps its own list of files in ``vector_store_batch_files``."""


def migrated(db: Connection) -> None:
    """What a database written by an earlier version lacks: the stores' ``adapter`` column (none: the base model),
    and each file batch's own list of files (:func:`listed_batches`)."""
    columns = {column[0] for column in db.execute("SELECT * FROM vector_stores LIMIT 0").description}
    if "adapter" not in columns:
        db.execute("ALTER TABLE vector_stores ADD COLUMN adapter TEXT")
    listed_batches(db)


def listed_batches(db: Connection) -> None:
    """Fill each file batch's list of files from its files' rows, once, in a database written before batches kept
    their own lists (then a file attached again by a later batch had left the earlier one's list)."""
    if db.execute("SELECT 1 FROM vector_store_batch_files LIMIT 1").fetchone() is None:
        db.execute(
            "INSERT INTO vector_store_batch_files (batch_id, vector_store_id, file_id) "
            "SELECT batch_id, vector_store_id, file_id FROM vector_store_files WHERE batch_id IS NOT NULL"
        )


FileStatus = Literal["in_progress", "completed", "cancelled", "failed"]
FILE_STATUSES: tuple[FileStatus, ...] = ("in_progress", "completed", "cancelled", "failed")
ErrorCode = Literal["server_error", "unsupported_file", "invalid_file"]
Attributes = dict[str, str | int | float | bool]
EXPIRED = "expires_after_days IS NOT NULL AND last_active_at + expires_after_days * 86400 <= ?"
"""The stores expired at a time (the one parameter, in seconds), as SQL."""
ACTIVE_SECONDS = 60
"""How often, at most, a store's ``last_active_at`` is written by its searches."""


class TooManyStoresError(StoreError):
    """The owner has as many vector stores as it may have: 429 ``too_many_vector_stores``."""

    status = 429
    type = "rate_limit_error"
    code = "too_many_vector_stores"


class TooManyFilesError(StoreError):
    """A store would hold more files than it may: 400 ``too_many_files``."""

    status = 400
    type = "invalid_request_error"
    code = "too_many_files"
    param = "file_ids"


class StoreRow(msgspec.Struct, frozen=True, kw_only=True):
    """A vector store: OpenAI's fields, its owner, how it searches (the embedding ``model`` and the LoRA ``adapter``
    its chunks and queries run with, if any, the SPLADE ``sparse_model`` if it has one, the ``first_stage``, the weights of a hybrid — ``hybrid_weights``, or dense
    ``hybrid_weight`` and BM25 the rest — and the dense stage's ``index_kind``), its default chunking, and the
    ``version`` of what a search sees."""

    seq: int
    id: str
    owner: str
    name: str | None
    description: str | None
    metadata: dict[str, str] | None
    model: str
    sparse_model: str | None = None
    adapter: str | None = None
    first_stage: FirstStageName
    hybrid_weight: float
    hybrid_weights: dict[Stage, float] | None = None
    index_kind: StoreIndexKind
    chunk_size: int
    chunk_overlap: int
    expires_after_days: int | None
    created_at: int
    last_active_at: int
    version: int

    @property
    def expires_at(self) -> int | None:
        """When the store expires (seconds), if it does: ``expires_after_days`` after its last activity."""
        return self.last_active_at + self.expires_after_days * 86_400 if self.expires_after_days else None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now


class FileCounts(msgspec.Struct, frozen=True, kw_only=True):
    in_progress: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    total: int = 0


class StoreState(msgspec.Struct, frozen=True, kw_only=True):
    """A store with what its files add up to: their counts by status and their bytes."""

    row: StoreRow
    counts: FileCounts
    usage_bytes: int


class FileRow(msgspec.Struct, frozen=True, kw_only=True):
    """A file of a store: the uploaded file's id and name, its attributes and chunking, its status (and
    ``last_error`` once failed), its chunks' bytes and count, and the claim of the worker reading it."""

    seq: int
    vector_store_id: str
    file_id: str
    owner: str
    batch_id: str | None
    filename: str
    attributes: Attributes | None
    chunk_size: int
    chunk_overlap: int
    status: FileStatus
    last_error: dict[str, str] | None
    usage_bytes: int
    chunks: int
    created_at: int
    claimed_by: str | None
    lease_until: float | None


class BatchRow(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    id: str
    vector_store_id: str
    owner: str
    created_at: int
    cancelled_at: int | None


class ChunkData(msgspec.Struct, frozen=True):
    """A chunk as the worker writes it: its text, its own attributes (a JSON Lines line's), its vector ``(D,)``
    and, in a store with a SPLADE model, its sparse vector as ``(indices, values)``."""

    text: str
    attributes: Attributes | None
    vector: np.ndarray
    sparse: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def size(self) -> int:
        """What the chunk takes in the store, in bytes: its text, 4 a vector component, 8 a sparse weight."""
        weights = len(self.sparse[0]) if self.sparse is not None else 0
        return len(self.text.encode()) + 4 * self.vector.size + 8 * weights


def _json(value: Any) -> str | None:
    return json.dumps(value) if value is not None else None


def _decoded(row: Any, *names: str) -> dict[str, Any]:
    found = dict(row)
    for name in names:
        found[name] = json.loads(found[name]) if found[name] else None
    return found


def _store(row: Any) -> StoreRow:
    return msgspec.convert(_decoded(row, "metadata", "hybrid_weights"), StoreRow)


def _file(row: Any) -> FileRow:
    return msgspec.convert(_decoded(row, "attributes", "last_error"), FileRow)


def _batch(row: Any) -> BatchRow:
    return msgspec.convert(dict(row), BatchRow)


def detach(db: Connection, store_id: str, file_id: str) -> bool:
    """Remove ``file_id`` and its chunks from the store ``store_id`` (a new version of it), in ``db``'s
    transaction; False when it is not attached."""
    gone = db.execute(
        "DELETE FROM vector_store_files WHERE vector_store_id = ? AND file_id = ?", (store_id, file_id)
    ).rowcount
    if gone:
        db.execute("DELETE FROM vector_store_chunks WHERE vector_store_id = ? AND file_id = ?", (store_id, file_id))
        db.execute("UPDATE vector_stores SET version = version + 1 WHERE id = ?", (store_id,))
    return bool(gone)


def _drop_chunks(db: Connection, file: FileRow) -> None:
    """Remove ``file``'s chunks from its store, in ``db``'s transaction."""
    db.execute(
        "DELETE FROM vector_store_chunks WHERE vector_store_id = ? AND file_id = ?",
        (file.vector_store_id, file.file_id),
    )


def drop_file(db: Connection, owner: str, file_id: str) -> int:
    """Remove ``owner``'s file ``file_id`` from every store of ``owner`` it is attached to, its chunks with it,
    in ``db``'s transaction (the file is being deleted). Returns from how many stores."""
    stores = [
        r["vector_store_id"]
        for r in db.execute(
            "SELECT f.vector_store_id FROM vector_store_files f JOIN vector_stores s ON s.id = f.vector_store_id "
            "WHERE f.file_id = ? AND s.owner = ?",
            (file_id, owner),
        ).fetchall()
    ]
    return sum(detach(db, store_id, file_id) for store_id in stores)


class VectorStoreTables:
    """The vector stores' rows in ``storage``. Blocking: called from worker threads."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        storage.create(SCHEMA, migrated)
        self.leases = Leases(storage, "vector_store_files")

    # -- stores -------------------------------------------------------------------------------------
    def create_store(
        self,
        owner: str,
        *,
        name: str | None,
        description: str | None,
        metadata: dict[str, str] | None,
        model: str,
        sparse_model: str | None,
        first_stage: str,
        adapter: str | None = None,
        hybrid_weight: float,
        hybrid_weights: dict[Stage, float] | None,
        index_kind: str,
        chunk_size: int,
        chunk_overlap: int,
        expires_after_days: int | None,
        max_stores: int,
    ) -> StoreRow:
        store_id = new_id("vs_")
        with self.storage.write() as db:
            if self.storage.db.words["owner_lock"]:
                db.execute(self.storage.db.words["owner_lock"], (owner,))
            now = int(self.storage.now(db))
            held = db.execute(
                f"SELECT count(*) AS n FROM vector_stores WHERE owner = ? AND NOT ({EXPIRED})", (owner, now)
            ).fetchone()["n"]
            if held >= max_stores:
                raise TooManyStoresError(
                    f"this API key has {held} vector stores that have not expired, the limit "
                    f"(max_vector_stores={max_stores}); delete one first"
                )
            db.execute(
                "INSERT INTO vector_stores (id, owner, name, description, metadata, model, sparse_model, first_stage, "
                "hybrid_weight, hybrid_weights, index_kind, chunk_size, chunk_overlap, expires_after_days, created_at, "
                "last_active_at, adapter) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    store_id,
                    owner,
                    name,
                    description,
                    _json(metadata),
                    model,
                    sparse_model,
                    first_stage,
                    hybrid_weight,
                    _json(hybrid_weights),
                    index_kind,
                    chunk_size,
                    chunk_overlap,
                    expires_after_days,
                    now,
                    now,
                    adapter,
                ),
            )
            return _store(db.execute("SELECT * FROM vector_stores WHERE id = ?", (store_id,)).fetchone())

    def get_store(self, owner: str, store_id: str) -> StoreRow | None:
        row = (
            self.storage.read()
            .execute("SELECT * FROM vector_stores WHERE id = ? AND owner = ?", (store_id, owner))
            .fetchone()
        )
        return _store(row) if row is not None else None

    def state(self, store: StoreRow) -> StoreState:
        """``store`` with its files' counts by status and their bytes."""
        rows = self.storage.read().execute(
            "SELECT status, count(*) AS n, coalesce(sum(usage_bytes), 0) AS used FROM vector_store_files "
            "WHERE vector_store_id = ? GROUP BY status",
            (store.id,),
        )
        counts: dict[str, int] = {}
        used = 0
        for row in rows:
            counts[row["status"]] = int(row["n"])
            used += int(row["used"])
        return StoreState(row=store, counts=FileCounts(**counts, total=sum(counts.values())), usage_bytes=used)

    def list_stores(
        self, owner: str, *, after: str | None, before: str | None, limit: int, order: Order
    ) -> Page[StoreRow]:
        return page(
            self.storage.read(),
            "vector_stores",
            "owner = ?",
            (owner,),
            _store,
            limit=limit,
            after=after,
            before=before,
            order=order,
        )

    def update_store(self, owner: str, store_id: str, changes: dict[str, Any]) -> StoreRow | None:
        """Set ``changes`` (``name``, ``metadata``, ``expires_after_days``) of the store; None if it is not found."""
        if "metadata" in changes:
            changes = {**changes, "metadata": _json(changes["metadata"])}
        with self.storage.write() as db:
            if changes:
                sets = ", ".join(f"{name} = ?" for name in changes)
                db.execute(
                    f"UPDATE vector_stores SET {sets} WHERE id = ? AND owner = ?", (*changes.values(), store_id, owner)
                )
            row = db.execute("SELECT * FROM vector_stores WHERE id = ? AND owner = ?", (store_id, owner)).fetchone()
        return _store(row) if row is not None else None

    def store_ids(self) -> list[str]:
        """Every store's id, whoever owns it."""
        return [row["id"] for row in self.storage.read().execute("SELECT id FROM vector_stores").fetchall()]

    def delete_store(self, owner: str, store_id: str) -> bool:
        with self.storage.write() as db:
            gone = db.execute("DELETE FROM vector_stores WHERE id = ? AND owner = ?", (store_id, owner)).rowcount
            if gone:
                for table in (
                    "vector_store_chunks",
                    "vector_store_files",
                    "vector_store_file_batches",
                    "vector_store_batch_files",
                ):
                    db.execute(f"DELETE FROM {table} WHERE vector_store_id = ?", (store_id,))
        return bool(gone)

    def expire(self) -> list[str]:
        """Empty every store that has expired and still holds something, whoever owns it: its files not read yet
        are ``cancelled`` (a read under way stops at its next renewal) and its chunks removed, its files' bytes and
        chunk counts then 0. Returns the ids of the stores emptied now (their search indexes are dropped); a store
        emptied before is not looked at again."""
        holding = (
            f"SELECT id FROM vector_stores s WHERE {EXPIRED} AND EXISTS (SELECT 1 FROM vector_store_files f "
            "WHERE f.vector_store_id = s.id AND (f.chunks > 0 OR f.status = 'in_progress'))"
        )
        with self.storage.write() as db:
            now = int(self.storage.now(db))
            ids = [row["id"] for row in db.execute(holding, (now,)).fetchall()]
            if not ids:
                return []
            stores = f"vector_store_id IN ({','.join('?' * len(ids))})"
            db.execute(
                "UPDATE vector_store_files SET status = 'cancelled', claimed_by = NULL, lease_until = NULL "
                f"WHERE status = 'in_progress' AND {stores}",
                ids,
            )
            db.execute(f"DELETE FROM vector_store_chunks WHERE {stores}", ids)
            db.execute(f"UPDATE vector_store_files SET usage_bytes = 0, chunks = 0 WHERE chunks > 0 AND {stores}", ids)
            return ids

    def touch(self, store: StoreRow, now: int) -> None:
        """Record a search of ``store`` at ``now`` (its ``last_active_at``, from which it expires), if the last
        one recorded is more than :data:`ACTIVE_SECONDS` old: most searches write nothing."""
        if store.last_active_at >= now - ACTIVE_SECONDS:
            return
        with self.storage.write() as db:
            db.execute(
                "UPDATE vector_stores SET last_active_at = ? WHERE id = ? AND last_active_at < ?",
                (now, store.id, now - ACTIVE_SECONDS),
            )

    def now(self) -> int:
        return self.storage.stamp()

    # -- files --------------------------------------------------------------------------------------
    def attach(
        self,
        store: StoreRow,
        files: list[tuple[str, str, Attributes | None, int, int, dict[str, str] | None]],
        *,
        max_files: int,
        batch: bool = False,
    ) -> tuple[list[FileRow], BatchRow | None]:
        """Attach ``files`` (``(file id, filename, attributes, chunk size, chunk overlap, error)`` each; a file
        with an ``error`` is recorded ``failed`` with it) to ``store``, in one transaction, with a file batch
        when ``batch``. Attaching a file again replaces its row (its chunks are computed again). Returns the
        rows and the batch.

        Raises:
            TooManyFilesError: the store would hold more than ``max_files`` files.
        """
        with self.storage.write() as db:
            if self.storage.db.words["owner_lock"]:
                db.execute(self.storage.db.words["owner_lock"], (store.owner,))
            ids = [f[0] for f in files]
            held = db.execute(
                "SELECT count(*) AS n FROM vector_store_files WHERE vector_store_id = ?", (store.id,)
            ).fetchone()["n"]
            again = sum(
                1
                for file_id in set(ids)
                if db.execute(
                    "SELECT 1 FROM vector_store_files WHERE vector_store_id = ? AND file_id = ?", (store.id, file_id)
                ).fetchone()
            )
            if held - again + len(set(ids)) > max_files:
                raise TooManyFilesError(
                    f"the vector store would hold {held - again + len(set(ids))} files; the limit is "
                    f"max_vector_store_files={max_files}"
                )
            now = int(self.storage.now(db))
            made = None
            if batch:
                made = BatchRow(
                    seq=0,
                    id=new_id("vsfb_"),
                    vector_store_id=store.id,
                    owner=store.owner,
                    created_at=now,
                    cancelled_at=None,
                )
                db.execute(
                    "INSERT INTO vector_store_file_batches (id, vector_store_id, owner, created_at) VALUES (?, ?, ?, ?)",
                    (made.id, store.id, store.owner, now),
                )
            if made is not None:
                db.executemany(
                    "INSERT INTO vector_store_batch_files (batch_id, vector_store_id, file_id) VALUES (?, ?, ?)",
                    [(made.id, store.id, file_id) for file_id in dict.fromkeys(ids)],
                )
            changed = False
            for file_id, filename, attributes, size, overlap, error in files:
                changed |= bool(
                    db.execute(
                        "DELETE FROM vector_store_chunks WHERE vector_store_id = ? AND file_id = ?", (store.id, file_id)
                    ).rowcount
                )
                db.execute(
                    "DELETE FROM vector_store_files WHERE vector_store_id = ? AND file_id = ?", (store.id, file_id)
                )
                db.execute(
                    "INSERT INTO vector_store_files (vector_store_id, file_id, owner, batch_id, filename, attributes, "
                    "chunk_size, chunk_overlap, status, last_error, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        store.id,
                        file_id,
                        store.owner,
                        made.id if made else None,
                        filename,
                        _json(attributes),
                        size,
                        overlap,
                        "failed" if error else "in_progress",
                        _json(error),
                        now,
                    ),
                )
            if changed:
                db.execute("UPDATE vector_stores SET version = version + 1 WHERE id = ?", (store.id,))
            rows = [
                _file(
                    db.execute(
                        "SELECT * FROM vector_store_files WHERE vector_store_id = ? AND file_id = ?",
                        (store.id, file_id),
                    ).fetchone()
                )
                for file_id in dict.fromkeys(ids)
            ]
            if made is not None:
                made = _batch(db.execute("SELECT * FROM vector_store_file_batches WHERE id = ?", (made.id,)).fetchone())
        return rows, made

    def get_file(self, store: StoreRow, file_id: str) -> FileRow | None:
        row = (
            self.storage.read()
            .execute("SELECT * FROM vector_store_files WHERE vector_store_id = ? AND file_id = ?", (store.id, file_id))
            .fetchone()
        )
        return _file(row) if row is not None else None

    def list_files(
        self,
        store: StoreRow,
        *,
        status: str | None,
        batch_id: str | None = None,
        after: str | None,
        before: str | None,
        limit: int,
        order: Order,
    ) -> Page[FileRow]:
        """``store``'s files (of ``status``, of the file batch ``batch_id``), paged by their file ids."""
        where, args = [], []
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if batch_id is not None:  # the batch's own list: a file attached again since stays in it
            where.append("file_id IN (SELECT file_id FROM vector_store_batch_files WHERE batch_id = ?)")
            args.append(batch_id)
        return page(
            self.storage.read(),
            "vector_store_files",
            "vector_store_id = ? AND owner = ?",
            (store.id, store.owner),
            _file,
            limit=limit,
            after=after,
            before=before,
            order=order,
            cursor="file_id",
            where=" AND ".join(where),
            where_args=tuple(args),
        )

    def update_attributes(self, store: StoreRow, file_id: str, attributes: Attributes | None) -> FileRow | None:
        with self.storage.write() as db:
            changed = db.execute(
                "UPDATE vector_store_files SET attributes = ? WHERE vector_store_id = ? AND file_id = ?",
                (_json(attributes), store.id, file_id),
            ).rowcount
            if not changed:
                return None
            db.execute("UPDATE vector_stores SET version = version + 1 WHERE id = ?", (store.id,))
            return _file(
                db.execute(
                    "SELECT * FROM vector_store_files WHERE vector_store_id = ? AND file_id = ?", (store.id, file_id)
                ).fetchone()
            )

    def remove_file(self, store: StoreRow, file_id: str) -> bool:
        """Remove a file and its chunks from ``store`` (the uploaded file stays)."""
        with self.storage.write() as db:
            return detach(db, store.id, file_id)

    def file_chunks(self, store: StoreRow, file_id: str) -> list[str]:
        """The texts of a file's chunks, in order."""
        rows = self.storage.read().execute(
            "SELECT text FROM vector_store_chunks WHERE vector_store_id = ? AND file_id = ? ORDER BY number",
            (store.id, file_id),
        )
        return [r["text"] for r in rows]

    # -- file batches -------------------------------------------------------------------------------
    def get_batch(self, store: StoreRow, batch_id: str) -> BatchRow | None:
        row = (
            self.storage.read()
            .execute(
                "SELECT * FROM vector_store_file_batches WHERE id = ? AND vector_store_id = ?", (batch_id, store.id)
            )
            .fetchone()
        )
        return _batch(row) if row is not None else None

    def batch_counts(self, batch: BatchRow) -> FileCounts:
        rows = self.storage.read().execute(
            "SELECT f.status, count(*) AS n FROM vector_store_files f JOIN vector_store_batch_files b "
            "ON b.vector_store_id = f.vector_store_id AND b.file_id = f.file_id WHERE b.batch_id = ? GROUP BY f.status",
            (batch.id,),
        )
        counts = {r["status"]: int(r["n"]) for r in rows}
        return FileCounts(**counts, total=sum(counts.values()))

    def cancel_batch(self, store: StoreRow, batch_id: str) -> BatchRow | None:
        """Cancel a file batch: its files not yet read are ``cancelled``; those read stay."""
        with self.storage.write() as db:
            now = int(self.storage.now(db))
            found = db.execute(
                "UPDATE vector_store_file_batches SET cancelled_at = coalesce(cancelled_at, ?) "
                "WHERE id = ? AND vector_store_id = ?",
                (now, batch_id, store.id),
            ).rowcount
            if not found:
                return None
            db.execute(  # the parts of the files being read
                "DELETE FROM vector_store_chunks WHERE vector_store_id = ? AND file_id IN (SELECT file_id FROM "
                "vector_store_files WHERE batch_id = ? AND vector_store_id = ? AND status = 'in_progress')",
                (store.id, batch_id, store.id),
            )
            db.execute(
                "UPDATE vector_store_files SET status = 'cancelled', claimed_by = NULL, lease_until = NULL "
                "WHERE batch_id = ? AND status = 'in_progress'",
                (batch_id,),
            )
            return _batch(db.execute("SELECT * FROM vector_store_file_batches WHERE id = ?", (batch_id,)).fetchone())

    # -- the worker ---------------------------------------------------------------------------------
    def claim(
        self, worker: str, lease_seconds: float, *, per_owner: int | None = None
    ) -> tuple[FileRow, StoreRow] | None:
        """Claim an ``in_progress`` file whose claim is free, with its store: the oldest of the owner with the
        fewest files being read now (by any replica), never one of an owner already reading ``per_owner``
        files nor one of an expired store; None when there is none."""
        with self.storage.write() as db:
            now = self.storage.now(db)
            row = db.execute(
                "SELECT c.* FROM vector_store_files c LEFT JOIN (SELECT owner, count(*) AS n FROM vector_store_files "
                "WHERE status = 'in_progress' AND claimed_by IS NOT NULL AND lease_until >= ? GROUP BY owner) r "
                f"ON r.owner = c.owner WHERE c.status = 'in_progress' AND {free('c.')} "
                f"AND c.vector_store_id NOT IN (SELECT id FROM vector_stores WHERE {EXPIRED}) "
                "AND coalesce(r.n, 0) < ? ORDER BY coalesce(r.n, 0), c.seq LIMIT 1 "
                f"{self.storage.db.words['skip_locked']}",
                (now, now, int(now), per_owner if per_owner is not None else 2**31 - 1),
            ).fetchone()
            if row is None:
                return None
            self.leases.take(db, worker, lease_seconds, now, "seq = ?", (row["seq"],))
            store = db.execute("SELECT * FROM vector_stores WHERE id = ?", (row["vector_store_id"],)).fetchone()
            file = _file(db.execute("SELECT * FROM vector_store_files WHERE seq = ?", (row["seq"],)).fetchone())
        return (file, _store(store)) if store is not None else None

    def renew(self, worker: str, file: FileRow, lease_seconds: float) -> bool:
        """Extend ``worker``'s claim on ``file``; False when it no longer holds it (or the file left
        ``in_progress``: cancelled, removed, attached again)."""
        return self.leases.renew(worker, lease_seconds, "seq = ? AND status = 'in_progress'", (file.seq,))

    def release(self, worker: str, file: FileRow) -> None:
        """Free ``worker``'s claim on ``file`` (it stays ``in_progress``, to be claimed again)."""
        self.leases.release(worker, "seq = ?", (file.seq,))

    def release_claims(self) -> None:
        """Free every claim (one host on its own database, starting: none can be live)."""
        self.leases.release_all()

    def chunks_beside(self, db: Connection | None, file: FileRow) -> int:
        """The chunks of the completed files of ``file``'s store but ``file``; read on ``db`` (default: a read of
        its own)."""
        return int(
            (db or self.storage.read())
            .execute(
                "SELECT coalesce(sum(chunks), 0) AS n FROM vector_store_files WHERE vector_store_id = ? AND status = "
                "'completed' AND file_id <> ?",
                (file.vector_store_id, file.file_id),
            )
            .fetchone()["n"]
        )

    def too_many_chunks(self, db: Connection | None, file: FileRow, count: int, max_chunks: int) -> str | None:
        """Why ``count`` chunks of ``file`` do not fit its store (the chunks of its completed files and these past
        ``max_chunks``), or None when they do; read on ``db`` (default: a read of its own)."""
        stored = self.chunks_beside(db, file)
        if stored + count <= max_chunks:
            return None
        return (
            f"the file's {count} chunks would make the vector store hold {stored + count}; the limit is "
            f"max_vector_store_chunks={max_chunks}"
        )

    def _held(self, db: Connection, worker: str, file: FileRow) -> bool:
        """Whether ``worker`` still holds its claim on ``file`` and the file is still ``in_progress`` (its row locked
        for ``db``'s transaction)."""
        return (
            db.execute(
                f"SELECT seq FROM vector_store_files WHERE seq = ? AND claimed_by = ? AND status = 'in_progress' "
                f"{self.storage.db.words['lock_row']}",
                (file.seq, worker),
            ).fetchone()
            is not None
        )

    def write_chunks(self, worker: str, file: FileRow, first: int, chunks: Sequence[ChunkData]) -> bool:
        """Write a part of ``file``'s chunks, numbered from ``first``, if ``worker`` still holds its claim and it is
        still ``in_progress`` (the part ``first`` 0 removes whatever an earlier read left); no search sees them
        before :meth:`complete`. False when the claim was lost (nothing written)."""
        with self.storage.write() as db:
            if not self._held(db, worker, file):
                return False
            if first == 0:
                _drop_chunks(db, file)
            db.executemany(
                "INSERT INTO vector_store_chunks (vector_store_id, file_id, number, text, attributes, vector, sparse) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        file.vector_store_id,
                        file.file_id,
                        number,
                        chunk.text,
                        _json(chunk.attributes),
                        np.ascontiguousarray(chunk.vector, dtype="<f4").tobytes(),
                        sparse_bytes(*chunk.sparse) if chunk.sparse is not None else None,
                    )
                    for number, chunk in enumerate(chunks, start=first)
                ],
            )
        return True

    def complete(self, worker: str, file: FileRow, count: int, used: int, *, max_chunks: int) -> bool:
        """Mark ``file`` ``completed`` with the ``count`` chunks :meth:`write_chunks` wrote (``used`` bytes), so that
        searches see them, if ``worker`` still holds its claim and it is still ``in_progress``; a store that would
        hold more than ``max_chunks`` chunks has the file ``failed`` instead. False when the claim was lost."""
        with self.storage.write() as db:
            if not self._held(db, worker, file):
                return False
            refused = self.too_many_chunks(db, file, count, max_chunks)
            if refused is not None:
                self._fail(db, file, "invalid_file", refused)
                return True
            if count == 0:
                _drop_chunks(db, file)  # no part was written: none of an earlier read is kept
            db.execute(
                "UPDATE vector_store_files SET status = 'completed', chunks = ?, usage_bytes = ?, claimed_by = NULL, "
                "lease_until = NULL WHERE seq = ?",
                (count, used, file.seq),
            )
            db.execute("UPDATE vector_stores SET version = version + 1 WHERE id = ?", (file.vector_store_id,))
        return True

    def fail(self, worker: str, file: FileRow, code: ErrorCode, message: str) -> None:
        """Mark ``file`` ``failed`` with ``last_error``, if ``worker`` still holds it."""
        with self.storage.write() as db:
            if db.execute(
                "SELECT seq FROM vector_store_files WHERE seq = ? AND claimed_by = ? AND status = 'in_progress'",
                (file.seq, worker),
            ).fetchone():
                self._fail(db, file, code, message)

    @staticmethod
    def _fail(db: Connection, file: FileRow, code: ErrorCode, message: str) -> None:
        _drop_chunks(db, file)  # the parts written before it failed
        db.execute(
            "UPDATE vector_store_files SET status = 'failed', last_error = ?, claimed_by = NULL, lease_until = NULL "
            "WHERE seq = ?",
            (json.dumps({"code": code, "message": message[:1000]}), file.seq),
        )

    # -- searches -----------------------------------------------------------------------------------
    def searchable(self, store: StoreRow, dimension: int | None, held: Chunks | None = None) -> Chunks:
        """Every chunk of ``store``'s completed files as a search sees it (with their sparse vectors in a store
        with a SPLADE model), and the version they are at least at (read before them, so that a file completed
        meanwhile makes the next search read them again). The chunks of a file ``held`` has at the same
        attributes (an earlier version of the store) are taken from it; only the other files' are read.
        ``dimension``: the length of the store model's vectors (None: that of the vectors read)."""
        db = self.storage.read()  # the version first: rows newer than it are read again at the next search
        version = db.execute("SELECT version FROM vector_stores WHERE id = ?", (store.id,)).fetchone()["version"]
        files = db.execute(
            "SELECT seq, filename, attributes FROM vector_store_files WHERE vector_store_id = ? AND status = "
            "'completed' ORDER BY seq",
            (store.id,),
        ).fetchall()
        kept = held.parts if held is not None else {}
        keys = [(int(f["seq"]), f["attributes"]) for f in files]  # a file re-attached or re-labelled: read again
        fresh: dict[int, list[Any]] = {}
        wanted = [seq for seq, attributes in keys if (seq, attributes) not in kept]
        for first in range(0, len(wanted), 500):
            seqs = wanted[first : first + 500]
            for row in db.execute(
                "SELECT f.seq, c.number, c.file_id, c.text, c.attributes, c.vector, c.sparse FROM vector_store_chunks c "
                "JOIN vector_store_files f ON f.vector_store_id = c.vector_store_id AND f.file_id = c.file_id "
                f"WHERE c.vector_store_id = ? AND f.status = 'completed' AND f.seq IN ({','.join('?' * len(seqs))}) "
                "ORDER BY f.seq, c.number",
                (store.id, *seqs),
            ):
                fresh.setdefault(int(row["seq"]), []).append(row)
        file_ids: list[str] = []
        filenames: list[str] = []
        texts: list[str] = []
        names: list[str] = []  # each chunk's vector's key: its file's seq and its number there
        attributes: list[Any] = []
        if dimension is None:
            row = next((rows[0] for rows in fresh.values() if rows), None)
            dimension = len(row["vector"]) // 4 if row is not None else held.vectors.shape[1] if held else 0
        vectors: list[np.ndarray] = [np.empty((0, dimension), dtype=np.float32)]
        sparse: list[sp.csr_matrix] = []
        parts: dict[Any, tuple[int, int]] = {}
        for file, key in zip(files, keys, strict=True):
            start = len(texts)
            if key in kept:
                assert held is not None
                a, b = kept[key]
                file_ids += held.file_ids[a:b]
                filenames += held.filenames[a:b]
                texts += held.texts[a:b]
                names += held.keys[a:b]
                attributes += held.attributes[a:b]
                vectors.append(held.vectors[a:b])
                if held.sparse is not None:
                    sparse.append(held.sparse[a:b])
            else:
                rows = fresh.get(key[0], [])
                own = json.loads(file["attributes"] or "{}")
                file_ids += [r["file_id"] for r in rows]
                filenames += [file["filename"]] * len(rows)
                texts += [r["text"] for r in rows]
                names += [f"{key[0]}.{r['number']}" for r in rows]
                attributes += [{**own, **json.loads(r["attributes"] or "{}")} for r in rows]
                blob = b"".join(bytes(r["vector"]) for r in rows)
                vectors.append(np.frombuffer(blob, dtype="<f4").reshape(len(rows), dimension))
                sparse.append(sparse_rows([bytes(r["sparse"] or b"") for r in rows]))
            parts[key] = (start, len(texts))
        return Chunks(
            version=int(version),
            file_ids=file_ids,
            filenames=filenames,
            texts=texts,
            attributes=attributes,
            vectors=np.concatenate(vectors).astype(np.float32, copy=False),
            sparse=Chunks.stacked_sparse(sparse) if store.sparse_model else None,
            parts=parts,
            read=sum(map(len, fresh.values())),
            keys=names,
        )
