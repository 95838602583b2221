"""The SQL databases the service's storage runs on: an embedded SQLite file (one host) or a PostgreSQL server (any
number of replicas sharing one queue).

The store writes one dialect of SQL: positional ``?`` parameters, and a few words that differ between the
two filled in from :attr:`Database.words` (``{serial}``, ``{real}``, ``{skip_locked}``). A write is one
transaction that holds what it changes: SQLite takes its database-wide write lock at the start
(``BEGIN IMMEDIATE``); PostgreSQL locks the rows a claim selects (``FOR UPDATE SKIP LOCKED``), so two
replicas never claim the same chunk, and neither waits on the other's.

Connections are per thread (the store is called from worker threads). A PostgreSQL connection that broke
(the server restarted, the network failed) is replaced at the next call; the call that met the break raises.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

from service.database_urls import redacted
from service.errors import InsufficientStorageError, NulCharacterError, UnavailableError


class DatabaseUnavailableError(UnavailableError):
    """The database cannot be reached or used now (the server is down or restarting, the network failed, a
    lock was held too long, an I/O error); the same call may succeed later: 503 ``batch_database_unavailable``
    with ``Retry-After``. A full disk is :class:`~service.errors.InsufficientStorageError` (507)."""

    code = "batch_database_unavailable"
    public_message = "the service's database (files, batches, vector stores) is not available now; try again shortly"


class Cursor(Protocol):
    rowcount: int
    description: Any  # the columns of a SELECT: each a sequence whose first item is the column's name

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """What the store uses of a connection: statements with ``?`` parameters, rows readable by column name."""

    def execute(self, sql: str, args: Any = (), /) -> Cursor: ...

    def executemany(self, sql: str, rows: Any, /) -> object: ...


class Database(Protocol):
    words: ClassVar[dict[str, str]]
    """The dialect's words for the store's SQL: ``serial`` (an auto-numbered primary key), ``real`` (a float
    column), ``blob`` (a bytes column), ``skip_locked`` (what makes a claim skip rows another transaction holds), ``lock_row`` (what
makes a read hold its row until the transaction ends), ``now`` (the database's clock, in seconds since the
    epoch: every replica's leases are read on one clock), ``owner_lock`` (what serializes one owner's
    writes that check a count before they insert; one ``?``, the owner) and ``schema_lock``
    (a statement that serializes creating the tables; empty where writes are serialized anyway)."""
    shared: bool
    """True when other hosts may use the same database: claims are then never released at start (a claim
    runs out with its lease), and the files folder must be one every replica reaches."""

    def connection(self) -> Connection:
        """This thread's connection, for reads (each statement its own transaction)."""
        ...

    def write(self) -> contextlib.AbstractContextManager[Connection]:
        """One write transaction: committed when the block ends, rolled back when it raises."""
        ...

    def close(self) -> None: ...


class SqliteDatabase:
    """``batches.db`` in a folder: WAL journal, synced commits, the write lock taken at each write's start."""

    words: ClassVar[dict[str, str]] = {
        "serial": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "real": "REAL",
        "blob": "BLOB",
        "skip_locked": "",
        "lock_row": "",
        "owner_lock": "",  # every write holds the database's write lock already (BEGIN IMMEDIATE)
        "schema_lock": "",
        "now": "SELECT (julianday('now') - 2440587.5) * 86400.0 AS now",
    }
    shared = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []  # every thread's connection, for close()
        self._lock = threading.Lock()

    def connection(self) -> Connection:
        return _Connection(self._connection(), self._unavailable)

    def _connection(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            # each connection is used by its own thread only; close() may come from another
            with self._unavailable():
                db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0, check_same_thread=False)
                db.row_factory = sqlite3.Row
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")
            self._local.db = db
            with self._lock:
                self._all.append(db)
        return db

    @contextlib.contextmanager
    def _unavailable(self) -> Iterator[None]:
        """SQLite's errors of a database that cannot be used now (its write lock held past the timeout, an I/O
        error) as :class:`DatabaseUnavailableError`, a full disk as :class:`~service.errors.InsufficientStorageError`."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                raise InsufficientStorageError(f"{self.path}: {exc}") from exc
            raise DatabaseUnavailableError(f"{self.path}: {exc}") from exc

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        db = self._connection()
        with self._unavailable():
            db.execute("BEGIN IMMEDIATE")
        try:
            yield _Connection(db, self._unavailable)
            with self._unavailable():
                db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for db in conns:
            db.close()
        self._local = threading.local()


class _Connection:
    """A driver's connection (sqlite3's, psycopg's) as the store uses it: the store's SQL in the driver's
    ``placeholders``, and the driver's errors of a database that cannot be used now raised as
    :class:`DatabaseUnavailableError` (by ``unavailable``)."""

    def __init__(self, conn: Any, unavailable: Any, placeholders: Callable[[str], str] = str) -> None:
        self.conn = conn
        self.unavailable = unavailable
        self.placeholders = placeholders

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        _check_text(args)
        with self.unavailable():
            return self.conn.execute(self.placeholders(sql), args)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        for row in rows:
            _check_text(row)
        with self.unavailable(), contextlib.closing(self.conn.cursor()) as cur:
            cur.executemany(self.placeholders(sql), rows)


def _check_text(args: Sequence[Any]) -> None:
    """Refuse a NUL character in any text parameter, on every database alike (PostgreSQL's text cannot hold one,
    SQLite's can): :class:`NulCharacterError`."""
    if any(isinstance(arg, str) and "\x00" in arg for arg in args):
        raise NulCharacterError()


@functools.lru_cache(maxsize=256)
def psycopg_sql(sql: str) -> str:
    r"""The store's SQL with psycopg's placeholders: each ``?`` parameter becomes ``%s`` and each literal ``%`` is
    doubled (psycopg reads ``%`` everywhere in a query that has parameters); a ``?`` inside a quoted string or
    identifier stays as it is.

    >>> psycopg_sql("SELECT '?', \"a?\" FROM t WHERE name LIKE 'x%' AND id = ? AND n = ?")
    'SELECT \'?\', "a?" FROM t WHERE name LIKE \'x%%\' AND id = %s AND n = %s'
    >>> psycopg_sql("SELECT 'it''s ?' WHERE a = ?")
    "SELECT 'it''s ?' WHERE a = %s"
    """
    out: list[str] = []
    quote = ""  # the quote character of the string or identifier being read, "" outside one
    for char in sql:
        if char == "%":
            out.append("%%")
            continue
        if quote:
            quote = "" if char == quote else quote  # a doubled quote closes and opens again: the same output
        elif char in "'\"":
            quote = char
        elif char == "?":
            out.append("%s")
            continue
        out.append(char)
    return "".join(out)


class PostgresDatabase:
    """A PostgreSQL server named by a ``postgresql://`` URL (libpq's form: user, password, host, port,
    database, and query options such as ``sslmode``). Needs psycopg (``pip install "embedrank[postgres]"``)."""

    words: ClassVar[dict[str, str]] = {
        "serial": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "real": "DOUBLE PRECISION",
        "blob": "BYTEA",
        "skip_locked": "FOR UPDATE OF c SKIP LOCKED",
        "lock_row": "FOR UPDATE",
        "owner_lock": "SELECT pg_advisory_xact_lock(4243, hashtext(?))",
        "schema_lock": "SELECT pg_advisory_xact_lock(4242)",  # replicas starting together: one creates the tables
        "now": "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8 AS now",
    }
    shared = True

    def __init__(self, url: str) -> None:
        import psycopg  # an optional dependency: checked when the settings are read

        self.url = url
        self._psycopg = psycopg
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _unavailable(self) -> Iterator[None]:
        """psycopg's errors of a server or network that fails, as :class:`DatabaseUnavailableError`."""
        try:
            yield
        except self._psycopg.errors.DiskFull as exc:  # the server's disk: its own to free, the same answer here
            raise InsufficientStorageError(f"PostgreSQL at {redacted(self.url)}: {exc}") from exc
        except self._psycopg.OperationalError as exc:
            raise DatabaseUnavailableError(f"PostgreSQL at {redacted(self.url)}: {exc}") from exc

    def _conn(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            from psycopg.rows import dict_row

            with self._unavailable():
                conn = self._psycopg.connect(self.url, autocommit=True, row_factory=dict_row, connect_timeout=10)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def connection(self) -> Connection:
        return _Connection(self._conn(), self._unavailable, psycopg_sql)

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        conn = self._conn()
        with self._unavailable(), conn.transaction():
            yield _Connection(conn, self._unavailable, psycopg_sql)

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()
