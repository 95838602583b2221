"""Files from strangers read where a runaway can be killed: each file's documents
(:func:`~embedrank.retrieval.documents.stream_documents`) are read in a process of its own, forked from a small
server process that holds only the readers (``multiprocessing``'s forkserver: no model, no thread of the
service), which writes them to a spool on disk as it reads them (:mod:`~embedrank.serving.spool`: pieces of
about a megabyte of text, so that neither it nor the service holds a long text whole), and bounded while it
runs:

- **wall clock**: the process is killed once :attr:`ReadLimits.seconds` have passed;
- **CPU**: ``RLIMIT_CPU`` ends it after :attr:`ReadLimits.cpu_seconds` of computing;
- **memory**: ``RLIMIT_AS`` refuses it more than :attr:`ReadLimits.memory_bytes` of address space beyond what it
  started with (an allocation past it fails, and the file with it);
- **pages and characters**: a PDF with more than ``max_pages`` pages is refused before any is read, and the
  text stops being extracted, page by page, once it holds more than ``max_chars`` characters;
- **priority**: it runs at a lower priority (``nice`` +10) than the threads that answer requests.

A read that is cancelled (its file removed, its batch cancelled, the server stopping) kills its process at
once. Whatever ends a read early is an :class:`~embedrank.retrieval.documents.InvalidFileError` naming the
bound, the same on every run (the caller marks the file ``failed`` instead of reading it again). The spool and the
process's answer are MessagePack, never a pickle: a reader that a hostile file took over cannot send code to run.

>>> import asyncio, tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> _ = (folder / "f").write_bytes(b"<html><p>Hello <b>world</b></p></html>")
>>> readers = FileReaders(slots=1)
>>> asyncio.run(readers.read(folder / "f", "page.html", folder / "spool"))
1
>>> [piece.text for piece in spooled_pieces(folder / "spool")]
['Hello world']
>>> readers.close()
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import multiprocessing
import os
import resource
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec

from embedrank.retrieval.documents import (
    PIECE_CHARS,
    InvalidFileError,
    Piece,
    UnsupportedFileError,
    stream_documents,
)
from embedrank.serving.spool import SpoolWriter, read_frames

Frame = list[Piece]
"""A frame of a reading process's spool: the pieces of about :data:`PIECE_CHARS` characters (or
:data:`FRAME_PIECES` pieces) of text, in order."""
FRAME_PIECES = 1024

# what the reading processes' server imports once, so that each fork starts with the readers loaded
PRELOAD = ["__main__", "embedrank.retrieval.documents", "embedrank.serving.spool", "msgspec", "pypdf", "lxml.html"]
NICENESS = 10
"""How much lower than the service's threads the reading processes run."""


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """What reading one file may take (see the module's docstring for how each is enforced)."""

    seconds: float = 120.0
    cpu_seconds: int = 120
    memory_bytes: int = 1 << 30
    max_pages: int = 2000
    max_chars: int = 100_000_000


class _Read(msgspec.Struct, tag="read"):
    documents: int


class _Refused(msgspec.Struct, tag="refused"):
    code: str  # an error's code, or "no_room" (the spool's disk is full)
    message: str


_Outcome = _Read | _Refused


def _megabytes(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def _confine(limits: ReadLimits) -> None:
    """In the reading process, before it touches the file: lower priority, no core dump, the CPU and memory
    limits (address space counted from what the process holds now, its interpreter and readers)."""
    os.nice(NICENESS)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
    with open("/proc/self/statm", encoding="ascii") as statm:
        held = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (held + limits.memory_bytes, held + limits.memory_bytes))


def _read_in_process(path: str, filename: str, limits: ReadLimits, spool: str, send: Connection) -> None:
    """The reading process's work: one file's documents written to ``spool`` as they are read, then how many there
    are, or why the file is refused, sent back once."""
    name = repr(filename[:100])
    _confine(limits)
    outcome: _Outcome
    try:
        with open(path, "rb") as source, SpoolWriter(Path(spool)) as out:
            pieces = stream_documents(filename, source, max_pages=limits.max_pages, max_chars=limits.max_chars)
            outcome = _Read(_spooled(pieces, out))
    except (UnsupportedFileError, InvalidFileError) as exc:
        outcome = _Refused(exc.code, str(exc))
    except FileNotFoundError:
        outcome = _Refused("invalid_file", f"{name} was deleted before it was read")
    except MemoryError:
        outcome = _Refused(
            "invalid_file",
            f"{name} needs more than {_megabytes(limits.memory_bytes)} of memory to read (limit file_read_memory)",
        )
    except RecursionError:
        outcome = _Refused("invalid_file", f"{name} nests too deeply to be read")
    except OSError as exc:  # the spool cannot be written: the server's disk, not the file
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        outcome = _Refused("no_room", f"no room on the server's disk to read {name}: {exc.strerror}")
    send.send_bytes(msgspec.msgpack.encode(outcome))
    send.close()


def _spooled(pieces: Iterator[Piece], out: SpoolWriter) -> int:
    """Write ``pieces`` to ``out`` in frames of about :data:`PIECE_CHARS` characters; the documents they make."""
    frame: list[Piece] = []
    chars = documents = 0
    for piece in pieces:
        frame.append(piece)
        chars += len(piece.text)
        documents += piece.last
        if chars >= PIECE_CHARS or len(frame) >= FRAME_PIECES:
            out.write(frame)
            frame, chars = [], 0
    if frame:
        out.write(frame)
    return documents


def spooled_pieces(spool: Path) -> Iterator[Piece]:
    """The pieces a reading process wrote to ``spool``, in order, a frame in memory at a time.

    Raises:
        SpoolError: a spool that is not frames of pieces (a reader that wrote anything else).
    """
    for frame in read_frames(spool, Frame):
        yield from frame


def _ended(process: Any, filename: str, limits: ReadLimits) -> InvalidFileError:
    """Why a reading process ended without an answer: which bound its signal stands for."""
    name = repr(filename[:100])
    process.join()
    code = process.exitcode
    if code == -signal.SIGXCPU:
        return InvalidFileError(
            f"{name} took more than {limits.cpu_seconds} s of CPU to read (limit file_read_cpu_seconds)"
        )
    if code in (-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS):
        return InvalidFileError(
            f"{name} could not be read: its reader crashed ({signal.Signals(-code).name}), most often past the "
            f"memory limit of {_megabytes(limits.memory_bytes)} (file_read_memory)"
        )
    return InvalidFileError(f"{name} could not be read: its reader ended with exit code {code}")


def _wait(receive: Connection, process: Any, filename: str, limits: ReadLimits) -> int:
    """In a waiting thread: the reading process's answer (how many documents it spooled), within the wall-clock
    limit. The thread owns ``receive`` (a cancelled read kills the process, which ends the wait here)."""
    with receive:
        if not receive.poll(limits.seconds):
            process.kill()
            process.join()
            raise InvalidFileError(
                f"{filename[:100]!r} took more than {limits.seconds:g} s to read (limit file_read_seconds)"
            )
        try:
            data = receive.recv_bytes()
        except (EOFError, OSError):
            raise _ended(process, filename, limits) from None
    process.join()
    outcome = msgspec.msgpack.decode(data, type=_Outcome)
    if isinstance(outcome, _Refused):
        if outcome.code == "no_room":
            raise OSError(errno.ENOSPC, outcome.message)
        error = UnsupportedFileError if outcome.code == UnsupportedFileError.code else InvalidFileError
        raise error(outcome.message)
    return outcome.documents


class FileReaders:
    """Reads files, ``slots`` at a time at most, each in a killable process bounded by ``limits``. Its threads
    only wait for the processes: they are its own, never the event loop's default executor (which serves the
    database calls of every request)."""

    def __init__(self, slots: int, limits: ReadLimits = ReadLimits()) -> None:
        self.limits = limits
        self.slots = asyncio.Semaphore(slots)
        self._threads = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="embedrank-file-read")
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(PRELOAD)

    async def read(self, path: Path, filename: str, spool: Path) -> int:
        """Read the documents of the file at ``path``, uploaded as ``filename``, into ``spool`` (frames of
        :data:`Frame`, :func:`~embedrank.serving.spool.read_frames` reads them); how many documents it holds.

        Raises:
            UnsupportedFileError: a type that is not read.
            InvalidFileError: content that is not of its type, or past a bound of :class:`ReadLimits` (named).
            OSError: ``ENOSPC``, no room on the disk for the spool.
        """
        loop = asyncio.get_running_loop()
        async with self.slots:
            receive, send = self._context.Pipe(duplex=False)
            process = self._context.Process(
                target=_read_in_process, args=(str(path), filename, self.limits, str(spool), send), daemon=True
            )
            try:
                await loop.run_in_executor(self._threads, process.start)
            except BaseException:
                receive.close()
                raise
            finally:
                send.close()
            try:
                return await loop.run_in_executor(self._threads, _wait, receive, process, filename, self.limits)
            except BaseException:
                # Cancelled (or the waiting thread failed): nothing of the read outlives it. Only the waiting thread
                # reaps the process: a second thread asking for its exit code could take the one report the
                # forkserver sends, and the other would read 255.
                process.kill()
                raise

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
