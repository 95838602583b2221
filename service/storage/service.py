"""The storage as the app holds it: opened once, on first use (SQLite's database is created by the first upload or
vector store, a PostgreSQL server is reached at start and again until it answers), shared by files, batches and
vector stores."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from service.settings import Settings
from service.storage.database import Connection, PostgresDatabase
from service.storage.storage import DATABASE_FILE, Storage

logger = logging.getLogger("embedrank.service")

RETRY_SECONDS = 5.0
"""How long the service waits before it tries again to use a database that failed (unreachable, a disk full)."""


@dataclasses.dataclass(eq=False)
class StorageService:
    """The storage of ``settings.batches`` (its folder, ``batch_dir``, and its database, ``batch_database``), with
    the tables of every domain that uses it (:meth:`register`), all created when it opens: one domain's rows may
    be checked in another's transaction (a file is not deleted while a batch reads it)."""

    settings: Settings
    schemas: list[tuple[str, Callable[[Connection], None] | None]] = dataclasses.field(default_factory=list)
    _storage: Storage | None = None
    _opening: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def root(self) -> Path:
        return self.settings.batches.folder()

    @property
    def opened(self) -> Storage | None:
        """The storage if it is open, else None (:meth:`open` opens it)."""
        return self._storage

    def register(self, schema: str, migrate: Callable[[Connection], None] | None = None) -> None:
        """A domain's tables (:meth:`Storage.create`), created when the storage opens."""
        self.schemas.append((schema, migrate))

    def open(self) -> Storage:
        """The storage, opened on first use (blocking: a PostgreSQL server is reached over the network).

        Raises:
            DatabaseUnavailableError: the database cannot be reached now.
        """
        with self._opening:
            if self._storage is None:
                url = self.settings.batches.batch_database
                storage = Storage(self.root, PostgresDatabase(url) if url else None)
                for schema, migrate in self.schemas:
                    storage.create(schema, migrate)
                self._storage = storage
        return self._storage

    async def reached(self) -> Storage:
        """The storage, once it exists (SQLite's is created by the first upload or vector store; a PostgreSQL
        server is reached at start, and again every :data:`RETRY_SECONDS` until it answers)."""
        while (
            not self.settings.batches.batch_database
            and self._storage is None
            and not (self.root / DATABASE_FILE).is_file()
        ):
            await asyncio.sleep(0.5)
        while True:
            try:
                return await asyncio.to_thread(self.open)
            except Exception as exc:  # the server is not reachable (yet): the APIs answer 503 meanwhile
                logger.warning(
                    "the service's database is not reachable: %s; trying again in %.0f s", exc, RETRY_SECONDS
                )
                await asyncio.sleep(RETRY_SECONDS)

    def close(self) -> None:
        if self._storage is not None:
            self._storage.close()
