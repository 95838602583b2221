"""The Files API's lifecycle: its store over the app's storage, opened on first use, and the domains whose
objects hold files."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from litestar.datastructures import State

from service.files.store import SCHEMA, FileStore, FileUser
from service.settings import Settings
from service.storage.service import StorageService


@dataclasses.dataclass(eq=False)
class FileService:
    """The files of ``storage``; ``users`` (a batch reading its input) are asked before a file is deleted."""

    storage: StorageService
    users: list[FileUser] = dataclasses.field(default_factory=list)
    _store: FileStore | None = None
    _opening: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.storage.register(SCHEMA)

    @property
    def settings(self) -> Settings:
        return self.storage.settings

    def store(self) -> FileStore:
        """The store, opened on first use (blocking).

        Raises:
            DatabaseUnavailableError: the database cannot be reached now.
        """
        with self._opening:
            if self._store is None:
                self._store = FileStore(self.storage.open(), self.users)
        return self._store

    async def opened(self) -> FileStore:
        """The store, opened in a worker thread the first time."""
        return self._store if self._store is not None else await asyncio.to_thread(self.store)


def files_of(state: State) -> FileService:
    """The app's :class:`FileService` (put in its state by :func:`service.app.create_app`)."""
    return state.files  # type: ignore[no-any-return]
