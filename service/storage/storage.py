"""The storage that files, batches and vector stores share: one root folder and one database beside it, on the
database's clock.

Each domain keeps its own tables and folders in it: it creates them (:meth:`Storage.create`) when its store
opens, in a transaction that replicas starting together take one after the other. Time is Unix seconds on the
database's clock (:meth:`Storage.now`): every timestamp, expiry and lease, whichever replica writes it, so
replicas whose own clocks differ never take a live claim from each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from service.storage.database import Connection, Database, SqliteDatabase

DATABASE_FILE = "batches.db"
"""SQLite's database in the root folder (named when the Batch API was its only user: existing folders open as
they are)."""


class Storage:
    """``root`` (created if missing) and ``database`` (default: SQLite's :data:`DATABASE_FILE` in ``root``).

    Blocking (the database and the file system): the service calls it from worker threads. Every change is one
    transaction of :meth:`write`, so two processes on one database never interleave a claim (SQLite: one host;
    PostgreSQL: any number, each with ``root`` on a folder they all reach).
    """

    def __init__(self, root: str | Path, database: Database | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.db: Database = database if database is not None else SqliteDatabase(self.root / DATABASE_FILE)
        self._created: set[str] = set()

    @property
    def shared(self) -> bool:
        """Whether other hosts may use the same database (:attr:`Database.shared`): a claim left by a crash may
        then be another replica's live one, never released at start."""
        return self.db.shared

    def folder(self, name: str) -> Path:
        """The folder ``name`` of the root, created if missing."""
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def create(self, schema: str, migrate: Callable[[Connection], None] | None = None) -> None:
        """Create the tables and indexes of ``schema`` (statements separated by ``;``, the dialect's words in braces,
        :attr:`Database.words`, each ``IF NOT EXISTS``), then ``migrate`` what an earlier version made, in one
        transaction that replicas starting together take one after the other. Once per schema: a second call
        with the same one does nothing."""
        if schema in self._created:
            return
        with self.write() as db:
            if self.db.words["schema_lock"]:
                db.execute(self.db.words["schema_lock"])
            for statement in schema.format(**self.db.words).split(";"):
                if statement.strip():
                    db.execute(statement)
            if migrate is not None:
                migrate(db)
        self._created.add(schema)

    def read(self) -> Connection:
        """This thread's connection, for reads (each statement its own transaction)."""
        return self.db.connection()

    def write(self) -> contextlib.AbstractContextManager[Connection]:
        """One write transaction: committed when the block ends, rolled back when it raises."""
        return self.db.write()

    def now(self, db: Connection | None = None) -> float:
        """The database's clock (seconds since the epoch), read on ``db`` (default: this thread's connection)."""
        return float((db or self.read()).execute(self.db.words["now"]).fetchone()["now"])

    def stamp(self, db: Connection | None = None) -> int:
        """A row's timestamp (``created_at``, ``completed_at``, ...): the database's clock in whole seconds, the clock
        its expiry and every lease are read on."""
        return int(self.now(db))

    def close(self) -> None:
        self.db.close()
