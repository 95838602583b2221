"""The durable state of batches, in the service's storage (:mod:`service.storage`): their rows and chunks in its
database, the parts of their output in its ``parts/`` folder, their input, output and error files in its file
store (:mod:`service.files.store`).

A batch's lines are cut into chunks. A worker claims a chunk (a lease it renews while it works), runs its
lines, writes the chunk's output and error lines to part files of its own (``parts/<batch>/<chunk>.<worker>.<attempt>``),
then records the chunk as done, with its part name, in one transaction that succeeds only while its claim
holds. A chunk is therefore recorded done exactly once, with exactly one set of parts; a worker that died
or lost its lease has its parts ignored and the chunk is run again. When every chunk is done (or the batch
is cancelled or expires), the batch is finalized by the worker that claims that too: the recorded parts are
joined, in line order, into its output and error files. Finalizing is idempotent: file ids are derived
from the batch id, so a crash while finalizing is mended by finalizing again once the claim runs out.

Every row carries its owner (a digest of the API key that made it); every read and change names the
owner, so another key's batches are never found. Time is Unix seconds on the database's clock
(:meth:`~service.storage.storage.Storage.now`): every timestamp, expiry and lease, whichever replica writes it.
"""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path
from typing import Any, Literal

import msgspec

from service.errors import StoreError
from service.files.store import FileStore
from service.storage.database import Connection, Database
from service.storage.disk import write_synced
from service.storage.ids import new_id
from service.storage.leases import Leases, free
from service.storage.paging import Page, page
from service.storage.storage import Storage

SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    seq {serial},
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    metadata TEXT,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    in_progress_at INTEGER,
    finalizing_at INTEGER,
    completed_at INTEGER,
    failed_at INTEGER,
    expired_at INTEGER,
    cancelling_at INTEGER,
    cancelled_at INTEGER,
    total INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    output_file_id TEXT,
    error_file_id TEXT,
    errors TEXT,
    ending TEXT,
    claimed_by TEXT,
    lease_until {real}
);
CREATE INDEX IF NOT EXISTS batches_by_owner ON batches (owner, seq);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status);
CREATE TABLE IF NOT EXISTS chunks (
    batch_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    first_line INTEGER NOT NULL,
    lines INTEGER NOT NULL,
    start_byte INTEGER NOT NULL,
    end_byte INTEGER NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    claimed_by TEXT,
    lease_until {real},
    part TEXT,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, number)
);
"""

Ending = Literal["completed", "cancelled", "expired"]
"""How a finalized batch ends."""
BatchStatus = Literal[
    "validating", "in_progress", "finalizing", "cancelling", "failed", "completed", "expired", "cancelled"
]


RENAMED_COLUMNS = (("finalizer", "claimed_by"), ("finalize_until", "lease_until"))
"""Columns of ``batches`` that databases of version 0.2 and earlier name otherwise (the claim on finalizing
was a lease of its own shape): renamed when the store opens one."""

ACTIVE: tuple[BatchStatus, ...] = ("validating", "in_progress", "finalizing", "cancelling")
"""Statuses of a batch that is not finished: it counts against its key's batches in flight."""
FINISHED: tuple[BatchStatus, ...] = ("failed", "completed", "expired", "cancelled")


class TooManyBatchesError(StoreError):
    """The owner has as many unfinished batches as it may have: 429 ``too_many_batches``."""

    status = 429
    type = "rate_limit_error"
    code = "too_many_batches"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this API key has {limit} unfinished batches, the limit (max_batches_in_flight); wait for one to finish"
        )
        self.limit = limit


OBJECT_ERRORS = 10
"""The errors a failed batch's object lists at most (OpenAI's list a few); the rest are in its error file."""


class BatchRow(msgspec.Struct, frozen=True, kw_only=True):
    """A batch: OpenAI's batch object's fields, its owner, and the claim on finalizing it (``claimed_by`` until
    ``lease_until``, the lease every chunk has too)."""

    seq: int
    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None
    status: BatchStatus
    created_at: int
    expires_at: int
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    total: int
    completed: int
    failed: int
    output_file_id: str | None
    error_file_id: str | None
    errors: list[dict[str, Any]] | None
    ending: Ending | None
    claimed_by: str | None
    lease_until: float | None


class Chunk(msgspec.Struct, frozen=True):
    """A chunk of a batch: its request lines ``first_line`` to ``first_line + lines - 1`` (0-based, counting
    request lines only), bytes ``start_byte`` to ``end_byte`` of the input file."""

    batch_id: str
    number: int
    first_line: int
    lines: int
    start_byte: int
    end_byte: int


class ChunkRow(Chunk, frozen=True, kw_only=True):
    """A chunk's row: the chunk, its state, its claim (``claimed_by`` until ``lease_until``) and, once done, its
    part files' name and counts."""

    state: Literal["pending", "claimed", "done"]
    claimed_by: str | None
    lease_until: float | None
    part: str | None
    completed: int
    failed: int


def _batch(row: Any) -> BatchRow:
    found = dict(row)  # metadata and errors are JSON text in the database
    for name in ("metadata", "errors"):
        found[name] = json.loads(found[name]) if found[name] else None
    return msgspec.convert(found, BatchRow)


def renamed_columns(db: Connection) -> None:
    """Rename the columns of ``batches`` that a database made by version 0.2 or earlier names otherwise
    (:data:`RENAMED_COLUMNS`)."""
    columns = {column[0] for column in db.execute("SELECT * FROM batches LIMIT 0").description}
    for old, new in RENAMED_COLUMNS:
        if old in columns:
            db.execute(f"ALTER TABLE batches RENAME COLUMN {old} TO {new}")


class InputFiles:
    """The batches as users of the file store (:class:`~service.files.store.FileUser`): a batch that is not
    finished holds its input file."""

    def holding(self, db: Connection, owner: str, file_id: str) -> str | None:
        marks = ", ".join("?" * len(ACTIVE))
        using = db.execute(
            f"SELECT id FROM batches WHERE input_file_id = ? AND owner = ? AND status IN ({marks}) LIMIT 1",
            (file_id, owner, *ACTIVE),
        ).fetchone()
        if using is None:
            return None
        return (
            f"file {file_id!r} is the input of batch {using['id']!r}, which is not finished; cancel it or wait for it "
            "to finish"
        )

    def removing(self, db: Connection, owner: str, file_id: str) -> None:
        """A finished batch keeps its input file's id; nothing else refers to it."""

    def removed(self, owner: str, file_id: str) -> None:
        """Nothing to stop: no batch reads a file it does not hold."""


class BatchStore:
    """The batches of ``storage`` (their rows, and the parts of their output in its ``parts/`` folder), reading
    and writing their files in ``files``.

    The methods are blocking (the database and the file system); the service calls them from worker
    threads. Every change is one transaction of :meth:`Storage.write`, so two processes on one database
    never interleave a claim (SQLite: one host; PostgreSQL: any number, each with the storage's root on a
    folder they all reach).
    """

    def __init__(self, storage: Storage, files: FileStore) -> None:
        self.storage = storage
        self.files = files
        self.parts = storage.folder("parts")
        storage.create(SCHEMA, renamed_columns)
        self.chunk_leases = Leases(storage, "chunks", claimed="state = 'claimed'", released="state = 'pending'")
        self.finalizing_leases = Leases(storage, "batches")

    @classmethod
    def at(cls, root: str | Path, database: Database | None = None) -> BatchStore:
        """A store on a storage of its own: ``root`` and ``database`` (default: SQLite in ``root``), with its file
        store (as the service opens them, :class:`~service.batches.service.BatchService`)."""
        storage = Storage(root, database)
        return cls(storage, FileStore(storage, [InputFiles()]))

    # -- batches ------------------------------------------------------------------------------------
    def create_batch(
        self,
        owner: str,
        *,
        endpoint: str,
        input_file_id: str,
        completion_window: str,
        window_seconds: int,
        metadata: dict[str, str] | None,
        max_active: int | None = None,
    ) -> BatchRow:
        """A new batch of ``owner`` in status ``validating``. Returns its row.

        Raises:
            TooManyBatchesError: ``owner`` has ``max_active`` unfinished batches (counted in the transaction
                that inserts, so that creates at once, on any replica, cannot pass the limit together).
        """
        batch_id = new_id("batch_")
        with self.storage.write() as db:
            now = self.storage.stamp(db)
            row = {
                "id": batch_id,
                "owner": owner,
                "endpoint": endpoint,
                "input_file_id": input_file_id,
                "completion_window": completion_window,
                "metadata": json.dumps(metadata) if metadata is not None else None,
                "status": "validating",
                "created_at": now,
                "expires_at": now + window_seconds,
            }
            if max_active is not None:
                if self.storage.db.words["owner_lock"]:
                    db.execute(self.storage.db.words["owner_lock"], (owner,))
                if self._active(db, owner) >= max_active:
                    raise TooManyBatchesError(max_active)
            db.execute(
                "INSERT INTO batches (id, owner, endpoint, input_file_id, completion_window, metadata, status, "
                "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                tuple(row.values()),
            )
        found = self.get_batch(owner, batch_id)
        assert found is not None
        return found

    def get_batch(self, owner: str | None, batch_id: str) -> BatchRow | None:
        """The batch ``batch_id`` if ``owner`` made it (``owner=None``: whoever did; for the worker)."""
        if owner is None:
            row = self.storage.read().execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
        else:
            row = (
                self.storage.read()
                .execute("SELECT * FROM batches WHERE id = ? AND owner = ?", (batch_id, owner))
                .fetchone()
            )
        return _batch(row) if row is not None else None

    def list_batches(self, owner: str, *, after: str | None = None, limit: int = 20) -> Page[BatchRow]:
        """``owner``'s batches, newest first, those after the batch ``after``, at most ``limit``."""
        return page(self.storage.read(), "batches", "owner = ?", (owner,), _batch, limit=limit, after=after)

    def active_batches(self, owner: str) -> int:
        """How many of ``owner``'s batches are not finished."""
        return self._active(self.storage.read(), owner)

    @staticmethod
    def _active(db: Connection, owner: str) -> int:
        marks = ", ".join("?" * len(ACTIVE))
        query = f"SELECT COUNT(*) AS n FROM batches WHERE owner = ? AND status IN ({marks})"
        return int(db.execute(query, (owner, *ACTIVE)).fetchone()["n"])

    def batches_in(self, *statuses: BatchStatus) -> list[BatchRow]:
        """Every batch in one of ``statuses``, oldest first (for the worker)."""
        marks = ", ".join("?" * len(statuses))
        query = f"SELECT * FROM batches WHERE status IN ({marks}) ORDER BY seq"
        return [_batch(r) for r in self.storage.read().execute(query, statuses)]

    def start(self, batch_id: str, chunks: list[Chunk]) -> bool:
        """A validated batch cut into ``chunks``: status ``in_progress`` (``finalizing`` at once when it has no
        line). False when it is no longer ``validating`` (cancelled meanwhile)."""
        total = sum(c.lines for c in chunks)
        with self.storage.write() as db:
            now = self.storage.stamp(db)
            status = "in_progress" if total else "finalizing"
            changed = db.execute(
                "UPDATE batches SET status = ?, total = ?, in_progress_at = ?, finalizing_at = ? "
                "WHERE id = ? AND status = 'validating'",
                (status, total, now, now if not total else None, batch_id),
            ).rowcount
            if changed:
                db.executemany(
                    "INSERT INTO chunks (batch_id, number, first_line, lines, start_byte, end_byte) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    [(batch_id, c.number, c.first_line, c.lines, c.start_byte, c.end_byte) for c in chunks],
                )
        return bool(changed)

    def fail(self, batch_id: str, errors: list[dict[str, Any]]) -> None:
        """A batch whose input cannot run: status ``failed`` with OpenAI's ``errors`` list, its first
        :data:`OBJECT_ERRORS` (the batch object stays small: it is returned by every retrieve and list); with more,
        every one is a line of its error file (``{"id", "custom_id": null, "response": null, "error": {"code",
        "message", "line"}}``)."""
        error_file_id = None
        if len(errors) > OBJECT_ERRORS:
            row = self.storage.read().execute("SELECT owner FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is not None:
                lines = b"".join(
                    json.dumps(
                        {
                            "id": new_id("batch_req_"),
                            "custom_id": None,
                            "response": None,
                            "error": {"code": e["code"], "message": e["message"], "line": e.get("line")},
                        }
                    ).encode()
                    + b"\n"
                    for e in errors
                )
                error_file_id = self.files.add_result_file(row["owner"], batch_id, "errors", [lines])
        with self.storage.write() as db:
            failed = db.execute(
                "UPDATE batches SET status = 'failed', failed_at = ?, errors = ?, error_file_id = ? "
                "WHERE id = ? AND status = 'validating'",
                (self.storage.stamp(db), json.dumps(errors[:OBJECT_ERRORS]), error_file_id, batch_id),
            ).rowcount
        if not failed and error_file_id is not None:  # cancelled meanwhile: its error file is nobody's
            self.files.delete_file(row["owner"], error_file_id)

    def cancel(self, owner: str, batch_id: str) -> BatchRow | None:
        """Ask ``owner``'s batch to stop: ``cancelling`` until the chunks in flight are done (a batch still
        validating is cancelled at once); a finished batch is left as it is. None when there is no such batch."""
        with self.storage.write() as db:
            now = self.storage.stamp(db)
            db.execute(
                "UPDATE batches SET status = 'cancelled', cancelling_at = ?, cancelled_at = ? "
                "WHERE id = ? AND owner = ? AND status = 'validating'",
                (now, now, batch_id, owner),
            )
            db.execute(
                "UPDATE batches SET status = 'cancelling', cancelling_at = ? "
                "WHERE id = ? AND owner = ? AND status = 'in_progress'",
                (now, batch_id, owner),
            )
        return self.get_batch(owner, batch_id)

    # -- chunks -------------------------------------------------------------------------------------
    def claim(self, worker: str, lease_seconds: float) -> Chunk | None:
        """The next chunk that needs a worker, not done and not claimed (or its claim's lease has run out), fairly
        between keys: of the owner with the fewest chunks being run now (on every replica), then the one with
        the oldest batch in progress; within an owner, of its oldest batch. So one key's small batch runs
        beside another key's many large ones instead of after them. Claimed for ``worker`` until
        ``lease_seconds`` from now (the database's clock, as every lease)."""
        with self.storage.write() as db:
            now = self.storage.now(db)
            running = {
                found["owner"]: found["running"]
                for found in db.execute(
                    "SELECT b.owner AS owner, COUNT(*) AS running FROM chunks c JOIN batches b ON b.id = c.batch_id "
                    "WHERE c.state = 'claimed' AND c.lease_until >= ? GROUP BY b.owner",
                    (now,),
                ).fetchall()
            }
            waiting = db.execute(
                "SELECT owner, MIN(seq) AS first FROM batches WHERE status = 'in_progress' AND expires_at > ? "
                "GROUP BY owner",
                (int(now),),
            ).fetchall()
            row = None
            for found in sorted(waiting, key=lambda f: (running.get(f["owner"], 0), f["first"])):
                row = db.execute(
                    "SELECT c.batch_id, c.number, c.first_line, c.lines, c.start_byte, c.end_byte FROM chunks c "
                    "JOIN batches b ON b.id = c.batch_id "
                    "WHERE b.owner = ? AND b.status = 'in_progress' AND b.expires_at > ? AND c.state != 'done' "
                    f"AND {free('c.')} ORDER BY b.seq, c.number LIMIT 1 " + self.storage.db.words["skip_locked"],
                    (found["owner"], int(now), now),
                ).fetchone()
                if row is not None:
                    break
            if row is None:
                return None
            self.chunk_leases.take(
                db, worker, lease_seconds, now, "batch_id = ? AND number = ?", (row["batch_id"], row["number"])
            )
        return Chunk(*(row[k] for k in ("batch_id", "number", "first_line", "lines", "start_byte", "end_byte")))

    def renew(self, worker: str, chunk: Chunk, lease_seconds: float) -> bool:
        """Extend ``worker``'s claim on ``chunk``; False when it has lost it."""
        return self.chunk_leases.renew(
            worker, lease_seconds, "batch_id = ? AND number = ? AND state = 'claimed'", (chunk.batch_id, chunk.number)
        )

    def release(self, worker: str, chunk: Chunk) -> None:
        """Give ``chunk`` back unfinished (``worker`` holds it no more)."""
        self.chunk_leases.release(
            worker, "batch_id = ? AND number = ? AND state = 'claimed'", (chunk.batch_id, chunk.number)
        )

    def release_claims(self) -> None:
        """Forget every claim, on chunks and on finalizing (a single server starting: nothing else can hold one;
        a batch whose finalizing a crash interrupted is finalized again at once, not after its claim runs out)."""
        self.chunk_leases.release_all("state = 'claimed'")
        self.finalizing_leases.release_all("status = 'finalizing'")

    def leftover_parts(self) -> list[Path]:
        """Part folders no unfinished batch needs: a crash after a batch closed but before its parts were removed
        leaves them (its output and error files are whole by then)."""
        folders = [p for p in self.parts.iterdir() if p.is_dir()]
        if not folders:
            return []
        marks = ", ".join("?" for _ in ACTIVE)
        rows = self.storage.read().execute(f"SELECT id FROM batches WHERE status IN ({marks})", ACTIVE).fetchall()
        unfinished = {row["id"] for row in rows}
        return [p for p in folders if p.name not in unfinished]

    def part_path(self, batch_id: str, part: str, kind: str) -> Path:
        """A chunk's part file: ``kind`` ``out`` (output lines) or ``err`` (error lines)."""
        return self.parts / batch_id / f"{part}.{kind}"

    def finish(self, worker: str, chunk: Chunk, output: bytes, errors: bytes, completed: int, failed: int) -> bool:
        """Record ``chunk`` done with its output and error lines, if ``worker`` still holds it: the parts are
        written and synced first, then the chunk and the batch's counts change in one transaction. False (and
        the parts are removed) when the claim was lost (another worker runs the chunk) or the batch is being
        finalized (its output is being written without this chunk)."""
        part = (
            f"{chunk.number}.{worker}.{secrets.token_hex(4)}"  # this attempt's own: a failed one removes only its own
        )
        out_path, err_path = (self.part_path(chunk.batch_id, part, k) for k in ("out", "err"))
        out_path.parent.mkdir(parents=True, exist_ok=True)
        write_synced(out_path, [output])
        write_synced(err_path, [errors])
        with self.storage.write() as db:
            batch = db.execute(  # the batch's row held: a finalizer's claim waits, or this waits for it
                "SELECT status FROM batches WHERE id = ? " + self.storage.db.words["lock_row"], (chunk.batch_id,)
            ).fetchone()
            changed = 0
            if batch is not None and batch["status"] in ("in_progress", "cancelling"):
                changed = db.execute(
                    "UPDATE chunks SET state = 'done', part = ?, completed = ?, failed = ?, lease_until = NULL "
                    "WHERE batch_id = ? AND number = ? AND claimed_by = ? AND state = 'claimed'",
                    (part, completed, failed, chunk.batch_id, chunk.number, worker),
                ).rowcount
            if changed:
                db.execute(
                    "UPDATE batches SET completed = completed + ?, failed = failed + ? WHERE id = ?",
                    (completed, failed, chunk.batch_id),
                )
        if not changed:
            out_path.unlink(missing_ok=True)
            err_path.unlink(missing_ok=True)
        return bool(changed)

    def chunks(self, batch_id: str) -> list[ChunkRow]:
        """``batch_id``'s chunks, in line order."""
        rows = self.storage.read().execute("SELECT * FROM chunks WHERE batch_id = ? ORDER BY number", (batch_id,))
        return [msgspec.convert(dict(r), ChunkRow) for r in rows]

    def ready_to_finalize(self, now: float | None = None) -> list[tuple[BatchRow, Ending]]:
        """Batches to finalize, each with the status it ends in: ``completed`` (every chunk done),
        ``cancelled`` (cancelling, and no chunk claimed under a live lease), ``expired`` (past its window),
        or a batch left ``finalizing`` by a crash."""
        db = self.storage.read()
        now = self.storage.now(db) if now is None else now
        rows = db.execute(  # one pass over the chunks of every batch that may be done
            "SELECT b.*, COUNT(CASE WHEN c.state <> 'done' THEN 1 END) AS unfinished, "
            "COUNT(CASE WHEN c.state = 'claimed' AND c.lease_until >= ? THEN 1 END) AS live "
            "FROM batches b LEFT JOIN chunks c ON c.batch_id = b.id "
            "WHERE b.status IN ('in_progress', 'cancelling', 'finalizing') "
            f"AND {free('b.')} GROUP BY b.seq ORDER BY b.seq",
            (now, now),
        )
        out: list[tuple[BatchRow, Ending]] = []
        for row in rows:
            found = dict(row)
            unfinished, live = found.pop("unfinished"), found.pop("live")
            batch = _batch(found)
            if batch.status == "finalizing":
                out.append((batch, batch.ending or "completed"))
            elif not unfinished:
                out.append((batch, "completed" if batch.status == "in_progress" else "cancelled"))
            elif batch.status == "cancelling" and not live:
                out.append((batch, "cancelled"))
            elif batch.expires_at <= now and not live:
                out.append((batch, "expired"))
        return out

    def claim_finalizing(self, worker: str, batch: BatchRow, final: Ending, lease_seconds: float) -> bool:
        """Claim the finalizing of ``batch`` (a row of :meth:`ready_to_finalize`) for ``worker``, for
        ``lease_seconds``: status ``finalizing``, remembering the status it ends in (a crash while finalizing
        ends the same, once the claim runs out). False when its status changed since it was read, or
        another worker holds the claim."""
        with self.storage.write() as db:
            now = self.storage.now(db)
            changed = db.execute(
                "UPDATE batches SET status = 'finalizing', finalizing_at = COALESCE(finalizing_at, ?), "
                "ending = COALESCE(ending, ?), claimed_by = ?, lease_until = ? "
                f"WHERE id = ? AND status = ? AND {free()}",
                (int(now), final, worker, now + lease_seconds, batch.id, batch.status, now),
            ).rowcount
        return bool(changed)

    def renew_finalizing(self, worker: str, batch_id: str, lease_seconds: float) -> bool:
        """Extend ``worker``'s claim on finalizing ``batch_id`` by ``lease_seconds`` from now; False when the
        claim is no longer its own (it ran out and another worker took it)."""
        return self.finalizing_leases.renew(worker, lease_seconds, "id = ? AND status = 'finalizing'", (batch_id,))

    def close_batch(
        self, worker: str, batch_id: str, final: Ending, output_file_id: str | None, error_file_id: str | None
    ) -> bool:
        """The end of finalizing: the files written, the status ``final`` with its timestamp, the batch's parts
        removed. Only by the ``worker`` that holds the finalizing claim: False (nothing changed) when another
        worker took it over, so that one batch is closed once, with one pair of files."""
        stamp = {"completed": "completed_at", "cancelled": "cancelled_at", "expired": "expired_at"}[final]
        with self.storage.write() as db:
            closed = db.execute(
                f"UPDATE batches SET status = ?, {stamp} = ?, output_file_id = ?, error_file_id = ?, "
                "claimed_by = NULL, lease_until = NULL WHERE id = ? AND status = 'finalizing' AND claimed_by = ?",
                (final, self.storage.stamp(db), output_file_id, error_file_id, batch_id, worker),
            ).rowcount
        if closed:
            shutil.rmtree(self.parts / batch_id, ignore_errors=True)
        return bool(closed)

    def close(self) -> None:
        self.storage.close()
