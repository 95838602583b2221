"""Writing to the storage's disk: whole files or none, and room kept for the database."""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path

from service.errors import InsufficientStorageError

RESERVE = 4 * 2**20
"""Bytes an upload leaves free on the storage's disk (:func:`check_room`)."""


def write_synced(path: Path, parts: Sequence[Path | bytes], *, keep_empty: bool = True) -> int:
    """``parts`` (bytes, or files streamed in) one after the other in ``path``, whole or not at all: written to
    a temporary file, synced, then renamed into place; a failure removes the temporary file. Returns the size;
    with ``keep_empty=False`` nothing is written when it is 0.

    Raises:
        InsufficientStorageError: the disk is full (or the quota reached).
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                if isinstance(part, bytes):
                    out.write(part)
                else:
                    with open(part, "rb") as f:
                        shutil.copyfileobj(f, out)
            out.flush()
            os.fsync(out.fileno())
            size = out.tell()
        if size or keep_empty:
            os.replace(tmp, path)
        else:
            tmp.unlink()
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientStorageError(f"{path.parent}: {exc.strerror}") from exc
        raise
    return size


def check_room(folder: Path, size: int) -> None:
    """Refuse to write ``size`` bytes in ``folder`` unless its disk has that much free and :data:`RESERVE` more
    (room for the database's journal, and for deleting: a full disk could not delete a row).

    Raises:
        InsufficientStorageError: it has not.
    """
    free = shutil.disk_usage(folder).free
    if free < size + RESERVE:
        raise InsufficientStorageError(f"{folder}: {free} bytes free, {size} to write and {RESERVE} kept in reserve")
