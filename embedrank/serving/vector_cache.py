"""A content-addressed cache of computed embeddings: a text embedded once is never computed again by the same
model with the same prompt and truncation.

An entry's key is a digest of what the vector depends on: the model's embedding signature
(:meth:`~embedrank.models.signature.EmbeddingSignature.cache_key`: model, weights fingerprint, pooling,
window, precision; and the branch of a Router model), the prompt put before the text, the side an over-long
text is cut at, and the exact text. The text itself is never stored or logged, only its digest. A model
whose weights change on disk gets another fingerprint, so another signature: its vectors are never mixed
with the old ones.

The value is the model's pooled vector before normalization and dimension truncation (those are applied
after, per request), as float32 bytes (a SPLADE model's sparse vector as its int32 indices then its float32
values: :func:`packed_sparse`), with the text's token count and whether it was cut at the window
(so that a cached text need not be tokenized again). The cache is one SQLite file, bounded by ``max_bytes`` of vectors and
keys: past it, the least recently used entries are evicted. Processes on one host may share the file. A
cache that fails (a locked or full disk) counts as a miss and never fails a request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

logger = logging.getLogger("embedrank.serving")

ENTRY_OVERHEAD = 48
"""Bytes an entry costs beyond its vector and key (SQLite's row and index), counted against ``max_bytes``."""
TOUCH_SECONDS = 60.0
"""An entry found is marked used again only when its mark is older than this (recency to the minute: a
lookup of entries used a moment ago writes nothing), and marks wait at most this long to be written."""
TOUCH_BATCH = 1024
"""Marks of use written in one transaction (rather than one write per lookup)."""
EVICT_TO = 0.9
"""Eviction brings the cache down to this share of ``max_bytes``, so that it does not evict at every write."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS vectors (
    key BLOB PRIMARY KEY,
    vector BLOB NOT NULL,
    tokens INTEGER NOT NULL,
    truncated INTEGER NOT NULL,
    used REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS vectors_by_use ON vectors (used);
CREATE TABLE IF NOT EXISTS held (
    one INTEGER PRIMARY KEY CHECK (one = 0),
    entries INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
INSERT OR IGNORE INTO held VALUES (0, 0, 0);
"""


class CachedVector(NamedTuple):
    """A text's computed vector ``(D,)`` float32 (pooled, before normalization and dimension truncation), the
    tokens the model processed for it and whether it was cut at the window."""

    vector: np.ndarray
    tokens: int
    truncated: bool


def packed_sparse(indices: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A sparse vector (``(n,)`` indices, ``(n,)`` values) as one ``(2n,)`` float32 array to cache: the indices'
    int32 bytes, then the values (:func:`unpacked_sparse` reads it back bit for bit).

    >>> i, v = unpacked_sparse(packed_sparse(np.array([3, 70000]), np.array([0.5, 1.25])))
    >>> i.tolist(), v.tolist()
    ([3, 70000], [0.5, 1.25])
    """
    return np.concatenate([np.asarray(indices, dtype="<i4").view("<f4"), np.asarray(values, dtype="<f4")])


def unpacked_sparse(vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, values)``, int32 and float32, of a :func:`packed_sparse` array."""
    n = len(vector) // 2
    return np.ascontiguousarray(vector[:n]).view(np.int32), np.asarray(vector[n:], dtype=np.float32)


def missing(keys: Sequence[bytes], found: Mapping[bytes, object]) -> dict[bytes, int]:
    """Each of ``keys`` that ``found`` lacks, at the first position that has it (a text repeated in a request is
    computed once).

    >>> missing([b"a", b"b", b"a", b"c"], {b"b": None})
    {b'a': 0, b'c': 3}
    """
    todo: dict[bytes, int] = {}
    for i, key in enumerate(keys):
        if key not in found:
            todo.setdefault(key, i)
    return todo


def would_fail(seen: Sequence[tuple[int, bool]], budget: int | None, truncate: bool) -> bool:
    """Whether a request whose texts have these (token count, cut) would be refused: over ``budget`` tokens, or
    a text cut with ``truncate`` off (it then runs uncached, to fail with the error it would get).

    >>> would_fail([(3, False), (4, True)], 10, True), would_fail([(3, False), (4, True)], 10, False)
    (False, True)
    """
    return (budget is not None and sum(t for t, _ in seen) > budget) or (not truncate and any(c for _, c in seen))


def cache_key(signature: str, prompt: str, truncation_side: str, text: str) -> bytes:
    """The digest that addresses ``text``'s vector: a model's ``signature``, the ``prompt`` put before the
    text and the ``truncation_side`` an over-long text loses (32 bytes, SHA-256).

    >>> cache_key("m", "", "right", "a text").hex()[:16] == cache_key("m", "", "right", "a text").hex()[:16]
    True
    >>> cache_key("m", "query: ", "right", "a text") == cache_key("m", "", "right", "query: a text")
    False
    """
    digest = hashlib.sha256()
    for part in (signature, prompt, truncation_side, text):
        encoded = part.encode("utf-8", "surrogatepass")
        digest.update(len(encoded).to_bytes(8, "little"))  # lengths first: no two splits of one string collide
        digest.update(encoded)
    return digest.digest()


class VectorCache:
    """Vectors by :func:`cache_key` in the SQLite file ``path`` (created, with its folder, on first use), at
    most ``max_bytes`` of vectors and keys (each entry counted with :data:`ENTRY_OVERHEAD`). Blocking: call
    it from a worker thread.

    ``hits``, ``misses``, ``evictions`` and ``failures`` count this process's lookups, evicted entries and
    operations that failed (a failed lookup counts as misses).
    """

    def __init__(self, path: str | Path, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.hits = self.misses = self.evictions = self.failures = 0
        self._local = threading.local()
        self._lock = threading.Lock()  # the counters and the marks: several threads look up at once
        self._touched: dict[bytes, float] = {}  # entries found, their use not yet written
        self._touched_since = time.time()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, timeout=5.0)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # a cache: an entry lost in a power cut is a miss
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'held'").fetchone() is None:
                db.executescript(SCHEMA)  # the first connection ever: a write, once
            self._local.db = db
        return db

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, CachedVector]:
        """The cached entries of ``keys``, those found; marks them used now (to the minute:
        :data:`TOUCH_SECONDS`; the marks are written by :meth:`put_many`). Reads only: a few keys are looked up
        faster here than a thread hop costs."""
        unique = list(dict.fromkeys(keys))
        found: dict[bytes, CachedVector] = {}
        stale: list[bytes] = []
        now = time.time()
        try:
            db = self._db()
            for start in range(0, len(unique), 500):  # SQLite's bound on parameters per statement
                part = unique[start : start + 500]
                marks = ",".join("?" * len(part))
                query = f"SELECT key, vector, tokens, truncated, used FROM vectors WHERE key IN ({marks})"
                for key, vector, tokens, truncated, used in db.execute(query, part):
                    found[key] = CachedVector(
                        np.frombuffer(vector, dtype="<f4").astype(np.float32, copy=False), tokens, bool(truncated)
                    )
                    if used < now - TOUCH_SECONDS:
                        stale.append(key)
            if stale:
                with self._lock:
                    self._touched.update(dict.fromkeys(stale, now))
        except (sqlite3.Error, OSError) as exc:
            self._failed("lookup", exc)
            found = {}
        hits = sum(1 for k in keys if k in found)
        with self._lock:
            self.hits += hits
            self.misses += len(keys) - hits
        return found

    async def keep(self, items: Sequence[tuple[bytes, CachedVector]]) -> None:
        """:meth:`put_many` in a worker thread, when there are ``items`` or marks of use are due."""
        if items or self.marks_due():
            await asyncio.to_thread(self.put_many, items)

    def marks_due(self) -> bool:
        """Whether marks of use are waiting to be written: :data:`TOUCH_BATCH` of them, or the oldest for
        :data:`TOUCH_SECONDS` (:meth:`put_many` writes them, with or without items)."""
        with self._lock:
            return len(self._touched) >= TOUCH_BATCH or (
                bool(self._touched) and time.time() - self._touched_since >= TOUCH_SECONDS
            )

    def put_many(self, items: Sequence[tuple[bytes, CachedVector]]) -> None:
        """Store each ``(key, entry)`` (a key already there is kept) and the marks of use waiting; evict the
        least recently used entries past ``max_bytes``."""
        if not items and not self._touched:
            return
        now = time.time()
        try:
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                entries = size = 0
                for key, entry in items:
                    blob = np.ascontiguousarray(entry.vector, dtype="<f4").tobytes()
                    changed = db.execute(
                        "INSERT OR IGNORE INTO vectors (key, vector, tokens, truncated, used) VALUES (?, ?, ?, ?, ?)",
                        (key, blob, int(entry.tokens), int(entry.truncated), now),
                    ).rowcount
                    entries += changed
                    size += changed * (len(key) + len(blob) + ENTRY_OVERHEAD)
                db.execute("UPDATE held SET entries = entries + ?, bytes = bytes + ?", (entries, size))
                with self._lock:  # marks of use waiting: written now, before anything is evicted by age
                    marks, self._touched, self._touched_since = self._touched, {}, now
                db.executemany("UPDATE vectors SET used = ? WHERE key = ?", [(t, k) for k, t in marks.items()])
                (held,) = db.execute("SELECT bytes FROM held").fetchone()
                if held > self.max_bytes:
                    self._evict(db, held)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except (sqlite3.Error, OSError) as exc:
            self._failed("store", exc)

    def _evict(self, db: sqlite3.Connection, held: int) -> None:
        """In the write transaction: delete the least recently used entries until the cache holds
        :data:`EVICT_TO` of ``max_bytes``."""
        entries = db.execute("SELECT entries FROM held").fetchone()[0]
        per_entry = held / max(entries, 1)
        drop = min(entries, int((held - EVICT_TO * self.max_bytes) / per_entry) + 1)
        gone, size = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(key) + LENGTH(vector)), 0) FROM "
            "(SELECT key, vector FROM vectors ORDER BY used LIMIT ?)",
            (drop,),
        ).fetchone()
        db.execute("DELETE FROM vectors WHERE key IN (SELECT key FROM vectors ORDER BY used LIMIT ?)", (drop,))
        db.execute("UPDATE held SET entries = entries - ?, bytes = bytes - ?", (gone, size + gone * ENTRY_OVERHEAD))
        with self._lock:
            self.evictions += gone

    def stats(self) -> tuple[int, int]:
        """``(entries, bytes)`` held now, by every process that shares the file (which this does not create)."""
        if getattr(self._local, "db", None) is None and not self.path.is_file():
            return 0, 0
        try:
            entries, size = self._db().execute("SELECT entries, bytes FROM held").fetchone()
            return int(entries), int(size)
        except (sqlite3.Error, OSError) as exc:
            self._failed("read", exc)
            return 0, 0

    def _failed(self, what: str, exc: Exception) -> None:
        with self._lock:
            self.failures += 1
            failures = self.failures
        if failures == 1 or failures % 1000 == 0:
            logger.warning("embedding cache %s: %s failed (%s); counted as a miss", self.path, what, exc)

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
