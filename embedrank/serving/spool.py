"""Frames of MessagePack in a file on disk: what one stage of reading a file writes and the next reads back in
order, one frame in memory at a time (a file's documents, as its reading process extracts them; then its chunks,
counted before any is embedded).

Each frame is a 4-byte little-endian length and that many bytes of MessagePack. A frame is decoded as the type the
reader names (never as a pickle: the process that wrote it read a stranger's file), and a frame longer than
:data:`MAX_FRAME` bytes, cut short or not of that type is refused as :class:`SpoolError`.

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "spool"
>>> with SpoolWriter(path) as out:
...     out.write(["a", "b"]); out.write(["c"])
>>> list(read_frames(path, list[str]))
[['a', 'b'], ['c']]
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")
HEADER = struct.Struct("<I")
MAX_FRAME = 256 << 20
"""Bytes one frame may hold (a frame holds about a megabyte of text)."""


class SpoolError(ValueError):
    """A spool that is not frames of the type asked for."""


class SpoolWriter:
    """Writes frames to a new file at ``path`` (a context manager: the file is closed on leaving)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "wb")  # noqa: SIM115 - closed by __exit__
        self._encoder = msgspec.msgpack.Encoder()
        self.frames = 0

    def write(self, item: Any) -> None:
        data = self._encoder.encode(item)
        self._file.write(HEADER.pack(len(data)))
        self._file.write(data)
        self.frames += 1

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._file.close()


def read_frames(path: Path, kind: type[T]) -> Iterator[T]:
    """The frames of the spool at ``path``, in order, each decoded as ``kind``.

    Raises:
        SpoolError: a frame past :data:`MAX_FRAME`, cut short, or not a ``kind``.
    """
    decoder = msgspec.msgpack.Decoder(kind)
    with open(path, "rb") as spool:
        while header := spool.read(HEADER.size):
            if len(header) < HEADER.size:
                raise SpoolError(f"{path.name}: a frame's header is cut short")
            (length,) = HEADER.unpack(header)
            if length > MAX_FRAME:
                raise SpoolError(f"{path.name}: a frame of {length} bytes; at most {MAX_FRAME} are read")
            data = spool.read(length)
            if len(data) < length:
                raise SpoolError(f"{path.name}: a frame is cut short")
            try:
                yield decoder.decode(data)
            except msgspec.DecodeError as exc:
                raise SpoolError(f"{path.name}: {exc}") from None
