"""Claims on rows, as every job kind of the storage takes them: a batch's chunk, a batch's finalizing, a vector
store's file being read.

A claimed row names its worker (``claimed_by``) and holds the claim until ``lease_until``, on the database's clock
(:meth:`~service.storage.storage.Storage.now`). The worker renews the lease while it works; a worker that died
stops renewing, the lease runs out and another worker claims the row. A claim is free when the row was never
claimed or its lease ran out (:func:`free`), so one row is worked on by one worker at a time, on any replica.
"""

from __future__ import annotations

from typing import Any

from service.storage.database import Connection
from service.storage.storage import Storage


def free(alias: str = "") -> str:
    """The SQL condition (one parameter: now) of a row whose claim is free, the row of ``alias`` (a table's alias
    with its dot, ``c.``) in a join: never claimed, or its lease ran out."""
    return f"({alias}lease_until IS NULL OR {alias}lease_until < ?)"


class Leases:
    """The claims on the rows of ``table`` (its columns ``claimed_by`` and ``lease_until``); ``claimed`` and
    ``released`` are what else a claim taken and a claim given back set (SQL assignments: ``state = 'claimed'``,
    ``state = 'pending'``, a batch's chunk running and waiting again)."""

    def __init__(self, storage: Storage, table: str, *, claimed: str = "", released: str = "") -> None:
        self.storage = storage
        self.table = table
        self._claimed = f", {claimed}" if claimed else ""
        self._released = f", {released}" if released else ""

    def take(self, db: Connection, worker: str, seconds: float, now: float, where: str, key: tuple[Any, ...]) -> int:
        """Claim the rows ``where`` (SQL, its parameters ``key``) finds for ``worker``, for ``seconds`` from ``now``,
        in ``db``'s transaction (the one that chose them, so no other claim comes between). Returns how many."""
        return int(
            db.execute(
                f"UPDATE {self.table} SET claimed_by = ?, lease_until = ?{self._claimed} WHERE {where}",
                (worker, now + seconds, *key),
            ).rowcount
        )

    def renew(self, worker: str, seconds: float, held: str, key: tuple[Any, ...]) -> bool:
        """Extend ``worker``'s lease on the row ``held`` (SQL, its parameters ``key``) finds, to ``seconds`` from
        now, while its claim is the worker's; False when it holds no more (the lease ran out and another worker
        took it, or ``held`` no longer finds the row)."""
        with self.storage.write() as db:
            changed = db.execute(
                f"UPDATE {self.table} SET lease_until = ? WHERE {held} AND claimed_by = ?",
                (self.storage.now(db) + seconds, *key, worker),
            ).rowcount
        return bool(changed)

    def release(self, worker: str, held: str, key: tuple[Any, ...]) -> None:
        """Give back ``worker``'s claim on the row ``held`` (SQL, its parameters ``key``) finds, unfinished."""
        with self.storage.write() as db:
            db.execute(
                f"UPDATE {self.table} SET claimed_by = NULL, lease_until = NULL{self._released} "
                f"WHERE {held} AND claimed_by = ?",
                (*key, worker),
            )

    def release_all(self, held: str = "claimed_by IS NOT NULL") -> None:
        """Give back every claim on the rows ``held`` finds (one host on its own database, starting: a claim a
        crash left cannot be live)."""
        with self.storage.write() as db:
            db.execute(f"UPDATE {self.table} SET claimed_by = NULL, lease_until = NULL{self._released} WHERE {held}")
