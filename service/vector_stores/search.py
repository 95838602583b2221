"""This replica's search indexes of vector stores: each store's chunks held in memory
(:class:`~embedrank.retrieval.store.StoreIndex`), read from the database and brought up to date when the store's
``version`` moves (a file completed or removed on any replica, attributes changed): the chunks of the files
it still has, unchanged, are kept; only the others are read. A store's approximate index is saved in its folder
under ``folder`` (the batch folder's ``vector_stores/<store id>/``, which replicas share) and grown from there
at the next version, by this replica or another.

In a replica of front processes (:mod:`service.replica`) the engine process holds the indexes and runs the searches
for every front (:class:`SearchCall`): a store's index is in memory once per replica, and one API key's share of
the search threads holds across the fronts."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from embedrank.retrieval.store import FirstStageName, Stage, StoreIndex
from service.auth import key_owner
from service.errors import NotFoundError
from service.storage.database import PostgresDatabase
from service.storage.storage import Storage
from service.vector_stores.store import StoreRow, VectorStoreTables

T = TypeVar("T")

CACHED_STORES = 64
"""Stores whose index a replica keeps in memory, at most (the least recently searched dropped past it)."""
CACHED_CHUNKS = 2_000_000
"""Chunks the indexes a replica keeps in memory hold together, at most (the store searched now is kept)."""


class SearchCall(msgspec.Struct, array_like=True):
    """A store's search as a front asks the engine process for it: the store's row as the front read it (its
    ``version`` says which index), the width of its dense vectors, the stage and its weights, the queries with
    their dense ``(Q, D)`` and SPLADE ``(Q, V)`` vectors where the stages need them, the request's ``filters`` as
    sent (checked by the front), and how many chunks to return."""

    store: StoreRow
    dimension: int
    stage: FirstStageName
    weights: dict[Stage, float]
    queries: list[str]
    vectors: Any  # (Q, D) float32, or None
    sparse: Any  # (Q, V) CSR, or None
    filters: dict[str, Any] | None
    depth: int


class SearchThreads:
    """The threads a replica searches its stores in, apart from those that talk to the database and answer
    requests: ``threads`` of them (the usable CPUs, at least 2), of which one API key's searches hold
    at most ``per_key`` at once (the key's other searches wait their turn, holding no thread), so that no key's
    searches can take every thread.

    >>> import asyncio
    >>> threads = SearchThreads(per_key=1, threads=2)
    >>> asyncio.run(threads.run("key", sum, [1, 2, 3]))
    6
    >>> threads.close()
    """

    def __init__(self, per_key: int, threads: int) -> None:
        count = max(2, threads)
        self.per_key = max(1, min(per_key, count - 1))
        self._pool = ThreadPoolExecutor(count, thread_name_prefix="embedrank-search")
        self._keys: dict[str, asyncio.Semaphore] = {}
        self._waiting: dict[str, int] = {}

    async def run(self, owner: str, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``work(*args, **kwargs)`` in a search thread, once ``owner`` holds fewer than ``per_key`` of them."""
        slots = self._keys.setdefault(owner, asyncio.Semaphore(self.per_key))
        self._waiting[owner] = self._waiting.get(owner, 0) + 1
        try:
            async with slots:
                return await asyncio.get_running_loop().run_in_executor(self._pool, partial(work, *args, **kwargs))
        finally:
            self._waiting[owner] -= 1
            if not self._waiting[owner]:  # nobody of this key waits or runs: forget it (keys are not kept)
                del self._waiting[owner], self._keys[owner]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class IndexCache:
    """The stores' indexes this replica holds, each at the version it read (bounded: :data:`CACHED_STORES`
    stores, :data:`CACHED_CHUNKS` chunks)."""

    def __init__(
        self,
        tables: VectorStoreTables,
        capacity: int = CACHED_STORES,
        chunks: int = CACHED_CHUNKS,
        folder: Path | None = None,
    ) -> None:
        self.tables = tables
        self.folder = folder
        self.capacity, self.chunks = capacity, chunks
        self._held: OrderedDict[str, StoreIndex] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self.held = (0, 0)
        """(stores, chunks) whose indexes this cache holds now (for ``/metrics``, read from any thread)."""
        self._changing = threading.Lock()  # the event loop reads indexes in, a worker thread forgets them

    async def index(self, store: StoreRow, dimension: int) -> StoreIndex:
        """``store``'s index at the version its row (just read) has: the one held, or read again."""
        held = self._held.get(store.id)
        if held is not None and held.data.version == store.version:
            with self._changing:
                self._held.move_to_end(store.id)
            return held
        lock = self._locks.setdefault(store.id, asyncio.Lock())
        async with lock:  # concurrent searches of a changed store read it once
            held = self._held.get(store.id)
            if held is None or held.data.version < store.version:
                chunks = await asyncio.to_thread(
                    self.tables.searchable, store, dimension, held.data if held is not None else None
                )
                held = StoreIndex(chunks, kind=store.index_kind, folder=self.saved(store.id))
                with self._changing:
                    self._held[store.id] = held
                    self._held.move_to_end(store.id)
                    while len(self._held) > 1 and (
                        len(self._held) > self.capacity or sum(map(len, self._held.values())) > self.chunks
                    ):
                        dropped, _ = self._held.popitem(last=False)
                        self._locks.pop(dropped, None)
                    self._count()
        return held

    def _count(self) -> None:
        self.held = (len(self._held), sum(map(len, self._held.values())))

    def saved(self, store_id: str) -> Path | None:
        """The folder of ``store_id``'s saved approximate indexes."""
        return self.folder / store_id if self.folder is not None else None

    def forget(self, *store_ids: str) -> None:
        """Drop the indexes of deleted (or emptied) stores, and their saved ones."""
        for store_id in store_ids:
            with self._changing:
                self._held.pop(store_id, None)
                self._count()
            if self.folder is not None:
                shutil.rmtree(self.folder / store_id, ignore_errors=True)

    def sweep(self, stores: Iterable[str]) -> None:
        """Remove the saved indexes of stores not among ``stores`` (deleted while no replica held them)."""
        known = set(stores)
        if self.folder is not None and self.folder.is_dir():
            for path in self.folder.iterdir():
                if path.name not in known:
                    shutil.rmtree(path, ignore_errors=True)


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


def open_index(folder: str | Path, store_id: str, api_key: str | None, *, database: str | None = None) -> StoreIndex:
    """A vector store's chunks as the served search holds them now, to search in this process (a notebook, an
    evaluation) with :meth:`StoreIndex.search <embedrank.retrieval.store.StoreIndex.search>`: the same chunks,
    stages and scores as ``POST /v1/vector_stores/{id}/search``. ``folder`` is the service's ``batch_dir``,
    ``database`` its ``batch_database`` (None: the folder's SQLite), ``api_key`` the key that owns the store
    (None: a server without authentication). The store's rows are only read (no index is saved).

    Raises:
        NotFoundError: no such store for this key.
    """
    storage = Storage(folder, PostgresDatabase(database) if database else None)
    try:
        tables = VectorStoreTables(storage)
        store = tables.get_store(key_owner(api_key), store_id)
        if store is None:
            raise NotFoundError("vector store", store_id)
        return StoreIndex(tables.searchable(store, None), kind=store.index_kind)
    finally:
        storage.close()
