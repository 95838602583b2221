"""Document ids of an index, in row order, stored compactly.

A Python list of ``str`` and a ``dict`` from id to row cost about 120 bytes per id (the string objects,
the list's pointers, the dict's entries): 12 GB for 100M documents before a single vector. :class:`IdTable`
keeps the ids' UTF-8 bytes in one buffer with int64 offsets, and finds an id's row through sorted runs of
64-bit hashes (pandas' ``hash_array``, SipHash with a fixed key), merged like a log-structured tree so
that adding in batches costs O(N log N) in all: about 24 bytes per id besides its characters. A hash shared
by two different ids is resolved by comparing the ids themselves, so lookups are exact.

It saves as ``ids.utf8`` (the bytes) and ``ids.offsets.npy`` (``N + 1`` int64 offsets); an index saved with
``ids.json`` (a JSON list) still loads.
"""

from __future__ import annotations

import array
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import overload

import numpy as np


def hash_ids(ids: Sequence[str]) -> np.ndarray:
    """64-bit hashes of ``ids``, ``(N,)`` uint64; the same id always gets the same hash.

    >>> h = hash_ids(["a", "b", "a"]); bool(h[0] == h[2]), bool(h[0] != h[1]), h.dtype
    (True, True, dtype('uint64'))
    """
    import pandas as pd

    if not len(ids):
        return np.zeros(0, dtype=np.uint64)
    return pd.util.hash_array(np.asarray(ids, dtype=object), categorize=False)


def _sorted_run(ids: Sequence[str], start: int) -> tuple[np.ndarray, np.ndarray]:
    """The hashes of ``ids`` sorted ``(N,)`` uint64, and the row of each ``(N,)`` int64 (``start`` onwards)."""
    hashes = hash_ids(ids)
    order = np.argsort(hashes, kind="stable")
    return hashes[order], (order + start).astype(np.int64)


class IdTable(Sequence[str]):
    """Ids in row order: ``table[i]`` is row ``i``'s id, :meth:`rows` finds rows by id (module docstring)."""

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self._bytes = bytearray()
        self._offsets = array.array("q", [0])
        # sorted runs of (hash, row), sizes decreasing, merged when a run is not at least twice the next
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []
        self.extend(list(ids))

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"row {i} of {n}")
        i %= n
        return self._bytes[self._offsets[i] : self._offsets[i + 1]].decode()

    def __iter__(self) -> Iterator[str]:
        data, offsets = bytes(self._bytes), self._offsets
        for i in range(len(self)):
            yield data[offsets[i] : offsets[i + 1]].decode()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdTable):
            return self._bytes == other._bytes and self._offsets == other._offsets
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"IdTable({len(self)} ids)"

    def __contains__(self, doc_id: object) -> bool:
        return isinstance(doc_id, str) and self._find(doc_id, hash_ids([doc_id])[0]) >= 0

    @property
    def nbytes(self) -> int:
        """Bytes held: the ids' UTF-8, their offsets, and the runs' hashes and rows."""
        runs = sum(h.nbytes + r.nbytes for h, r in self._runs)
        return len(self._bytes) + self._offsets.itemsize * len(self._offsets) + runs

    def _find(self, doc_id: str, h: np.uint64) -> int:
        """The row of ``doc_id`` (whose hash is ``h``), or -1."""
        for hashes, rows in self._runs:
            at = int(np.searchsorted(hashes, h, side="left"))
            while at < len(hashes) and hashes[at] == h:  # more than one only when two ids share a hash
                if self[int(rows[at])] == doc_id:
                    return int(rows[at])
                at += 1
        return -1

    def rows(self, ids: Sequence[str]) -> list[int]:
        """The row of each id (``KeyError`` for an id the table does not hold)."""
        found = [self._find(d, h) for d, h in zip(ids, hash_ids(ids), strict=True)]
        for doc_id, row in zip(ids, found, strict=True):
            if row < 0:
                raise KeyError(doc_id)
        return found

    def first_duplicate(self, ids: Sequence[str]) -> str | None:
        """An id of ``ids`` the table holds already or that ``ids`` holds twice, else None."""
        hashes = hash_ids(ids)
        for hashes_run, _ in self._runs:
            hits = np.flatnonzero(np.isin(hashes, hashes_run))
            for i in hits:  # a shared hash: the same id, or (rarely) two ids with one hash
                if self._find(ids[int(i)], hashes[int(i)]) >= 0:
                    return ids[int(i)]
        order = np.argsort(hashes, kind="stable")
        ordered = hashes[order]
        for at in np.flatnonzero(ordered[1:] == ordered[:-1]):  # ids sharing a hash within ``ids``
            group = order[np.searchsorted(ordered, ordered[at]) : np.searchsorted(ordered, ordered[at], side="right")]
            seen: set[str] = set()
            for j in group:
                if ids[int(j)] in seen:
                    return ids[int(j)]
                seen.add(ids[int(j)])
        return None

    def extend(self, ids: Sequence[str]) -> None:
        """Append ``ids`` as the next rows (the caller checks for duplicates: :meth:`first_duplicate`)."""
        if not len(ids):
            return
        start = len(self)
        for doc_id in ids:
            self._bytes += doc_id.encode()
            self._offsets.append(len(self._bytes))
        self._runs.append(_sorted_run(ids, start))
        while len(self._runs) > 1 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
            (h1, r1), (h2, r2) = self._runs.pop(), self._runs.pop()
            hashes_all, rows_all = np.concatenate([h2, h1]), np.concatenate([r2, r1])
            merged = np.argsort(hashes_all, kind="stable")  # two sorted runs: a linear merge
            self._runs.append((hashes_all[merged], rows_all[merged]))

    def save(self, directory: Path) -> None:
        """Write ``ids.utf8`` and ``ids.offsets.npy`` into ``directory``."""
        (directory / "ids.utf8").write_bytes(bytes(self._bytes))
        np.save(directory / "ids.offsets.npy", np.frombuffer(self._offsets, dtype=np.int64))

    @classmethod
    def load(cls, directory: Path) -> IdTable:
        """Read what :meth:`save` wrote, or an older index's ``ids.json``."""
        if not (directory / "ids.utf8").is_file() and (directory / "ids.json").is_file():
            return cls(json.loads((directory / "ids.json").read_text()))
        data = (directory / "ids.utf8").read_bytes()
        offsets = np.load(directory / "ids.offsets.npy")
        table = cls()
        table._bytes = bytearray(data)
        table._offsets = array.array("q", offsets.astype(np.int64).tobytes())
        ids = [data[offsets[i] : offsets[i + 1]].decode() for i in range(len(offsets) - 1)]
        table._runs = [_sorted_run(ids, 0)] if ids else []
        return table
