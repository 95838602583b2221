"""Uploaded files and the files the service writes (a batch's output and errors): their rows in the storage's
database, their bytes in its ``files/`` folder.

A file is written and synced before its row exists, and removed if the row cannot be written; a file without a
row, or a row without a file, is removed once it is older than any upload or finalizing in progress could be
(:meth:`FileStore.remove_orphans`). Every row carries its owner (a digest of the API key that made it); every
read and change names it, so another key's files are never found.

Other domains hold files (a batch reads its input file): each is a :class:`FileUser` of the store, asked in the
transaction that deletes a file whether it may go.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol

import msgspec

from service.errors import StoreError
from service.storage.database import Connection
from service.storage.disk import check_room, write_synced
from service.storage.ids import new_id
from service.storage.paging import Order, Page, page
from service.storage.storage import Storage

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq {serial},
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER
);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner, seq);
"""

ORPHAN_GRACE_SECONDS = 600.0
"""How old a file without a row (or a row without a file) must be before it counts as left behind."""


class FileInUseError(StoreError):
    """A file cannot be deleted while another object uses it (a batch not finished reads it): 409 ``file_in_use``."""

    status = 409
    type = "invalid_request_error"
    code = "file_in_use"
    param = "file_id"


class FileRow(msgspec.Struct, frozen=True, kw_only=True):
    """A file: an upload (``purpose`` ``batch``, ``assistants``, ``user_data``), or a batch's output or error file
    (``batch_output``)."""

    id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None = None


class FileStorageExceededError(StoreError):
    """An API key's files would take more of the disk than it may: 429 ``file_storage_exceeded``."""

    status = 429
    type = "rate_limit_error"
    code = "file_storage_exceeded"
    param = "file"


class FileUser(Protocol):
    """A domain whose objects hold files: asked whether a file may be deleted, then told it is."""

    def holding(self, db: Connection, owner: str, file_id: str) -> str | None:
        """Why ``owner``'s file ``file_id`` cannot be deleted now (read in the deleting transaction), or None."""
        ...

    def removing(self, db: Connection, owner: str, file_id: str) -> None:
        """Drop ``owner``'s file ``file_id`` from the domain's objects, in the deleting transaction."""
        ...

    def removed(self, owner: str, file_id: str) -> None:
        """The deletion of ``owner``'s file ``file_id`` is committed (stop what still uses it)."""
        ...


def _file(row: object) -> FileRow:
    found = dict(row)  # type: ignore[call-overload]
    found.pop("seq", None)
    return msgspec.convert(found, FileRow)


class FileStore:
    """The files of ``storage`` (its ``files/`` folder and the ``files`` table), and the domains whose objects hold
    them (``users``). Blocking: the service calls it from worker threads."""

    def __init__(self, storage: Storage, users: Sequence[FileUser] = ()) -> None:
        self.storage = storage
        self.folder = storage.folder("files")
        self.users = users
        storage.create(SCHEMA)

    def file_path(self, file_id: str) -> Path:
        return self.folder / file_id

    def add_file(
        self, owner: str, filename: str, purpose: str, content: bytes, *, max_owner_bytes: int | None = None
    ) -> FileRow:
        """Store ``content`` as a file of ``owner`` (written and synced before its row exists, removed if the row
        cannot be written). Returns its row.

        Raises:
            InsufficientStorageError: the disk has no room for it (and :data:`RESERVE`).
            FileStorageExceededError: ``owner``'s files would take more than ``max_owner_bytes`` together.
        """
        file_id = new_id("file-")
        check_room(self.folder, len(content))
        write_synced(self.file_path(file_id), [content])
        try:
            with self.storage.write() as db:
                if max_owner_bytes is not None:
                    if self.storage.db.words["owner_lock"]:  # two uploads of one key are summed one after the other
                        db.execute(self.storage.db.words["owner_lock"], (owner,))
                    held = db.execute(
                        "SELECT coalesce(sum(bytes), 0) AS n FROM files WHERE owner = ?", (owner,)
                    ).fetchone()["n"]
                    if held + len(content) > max_owner_bytes:
                        raise FileStorageExceededError(
                            f"this API key's files take {held:,} bytes; with this one's {len(content):,} they would "
                            f"pass max_file_storage_per_key={max_owner_bytes:,}: delete files you no longer need"
                        )
                row = FileRow(
                    id=file_id,
                    owner=owner,
                    filename=filename,
                    purpose=purpose,
                    bytes=len(content),
                    created_at=self.storage.stamp(db),
                )
                db.execute(
                    "INSERT INTO files (id, owner, filename, purpose, bytes, created_at, expires_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    msgspec.structs.astuple(row),
                )
        except BaseException:  # no row: the file would be one nothing can list or delete
            self.file_path(file_id).unlink(missing_ok=True)
            raise
        return row

    def add_result_file(
        self, owner: str, batch_id: str, which: Literal["output", "errors"], parts: Sequence[Path | bytes]
    ) -> str | None:
        """Batch ``batch_id``'s output or error file (a ``batch_output`` file of ``owner``) made of ``parts``
        (part files, or bytes) in order, streamed into place. Its id follows from the batch's, so writing it
        again replaces it (finalizing twice writes the same file). None, and no file, when the parts hold
        nothing."""
        file_id = f"file-{batch_id.removeprefix('batch_')}-{which}"
        size = write_synced(self.file_path(file_id), parts, keep_empty=False)
        if not size:
            return None
        with self.storage.write() as db:
            db.execute(  # finalizing again replaces the file it wrote before, in the same place of the list
                "INSERT INTO files (id, owner, filename, purpose, bytes, created_at, expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET bytes = excluded.bytes",
                (file_id, owner, f"{batch_id}_{which}.jsonl", "batch_output", size, self.storage.stamp(db), None),
            )
        return file_id

    def get_file(self, owner: str, file_id: str) -> FileRow | None:
        row = self.storage.read().execute("SELECT * FROM files WHERE id = ? AND owner = ?", (file_id, owner)).fetchone()
        return _file(row) if row is not None else None

    def list_files(
        self,
        owner: str,
        *,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = 10000,
        order: Order = "desc",
    ) -> Page[FileRow]:
        """``owner``'s files (of ``purpose``), newest first (``order="asc"``: oldest first), those after the file
        ``after`` in that order, at most ``limit``."""
        return page(
            self.storage.read(),
            "files",
            "owner = ?",
            (owner,),
            _file,
            limit=limit,
            after=after,
            order=order,
            where="purpose = ?" if purpose is not None else "",
            where_args=(purpose,) if purpose is not None else (),
        )

    def delete_file(self, owner: str, file_id: str) -> bool:
        """Delete ``owner``'s file, and remove it from its users' objects (every vector store it is attached to,
        its chunks with it); False when there is none.

        Raises:
            FileInUseError: a user of the store holds it (the input of a batch that is not finished).
        """
        with self.storage.write() as db:
            for user in self.users:
                reason = user.holding(db, owner, file_id)
                if reason is not None:
                    raise FileInUseError(reason)
            if db.execute("SELECT id FROM files WHERE id = ? AND owner = ?", (file_id, owner)).fetchone() is None:
                return False
            for user in self.users:  # a vector store's chunks of it go with it
                user.removing(db, owner, file_id)
            # its space first: on a full disk the database may need it to delete the row (its journal)
            self.file_path(file_id).unlink(missing_ok=True)
            db.execute("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner))
        for user in self.users:
            user.removed(owner, file_id)
        return True

    def remove_orphans(self, grace_seconds: float = ORPHAN_GRACE_SECONDS) -> int:
        """Remove what no row and no file accounts for, once older than ``grace_seconds`` (a file is written before
        its row, so a younger one may be an upload or a finalizing in progress, here or on another replica): files
        (temporary ones included) with no row, and file rows whose file is gone. Returns how many."""
        cutoff = time.time() - grace_seconds  # files' times are the file system's
        on_disk = {path.name: path for path in self.folder.iterdir() if path.is_file()}
        db = self.storage.read()
        rows = db.execute("SELECT id, created_at FROM files").fetchall()
        row_cutoff = self.storage.now(db) - grace_seconds  # rows' are the database's
        known = {row["id"] for row in rows}
        removed = 0
        for name, path in on_disk.items():
            if name in known:
                continue
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:  # removed meanwhile (its batch deleted it, or another replica did)
                pass
        gone = [row["id"] for row in rows if row["id"] not in on_disk and row["created_at"] < row_cutoff]
        if gone:
            with self.storage.write() as db:
                for file_id in gone:
                    removed += db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount
        return removed
