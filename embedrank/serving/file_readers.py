"""Files from strangers read where a runaway can be killed: each file's documents
(:func:`~embedrank.retrieval.documents.read_documents`) are read in a process of its own, forked from a small
server process that holds only the readers (``multiprocessing``'s forkserver: no model, no thread of the
service), and bounded while it runs:

- **wall clock**: the process is killed once :attr:`ReadLimits.seconds` have passed;
- **CPU**: ``RLIMIT_CPU`` ends it after :attr:`ReadLimits.cpu_seconds` of computing;
- **memory**: ``RLIMIT_AS`` refuses it more than :attr:`ReadLimits.memory_bytes` of address space beyond what it
  started with (an allocation past it fails, and the file with it);
- **pages and characters**: a PDF with more than ``max_pages`` pages is refused before any is read, and the
  text stops being extracted, page by page, once it holds more than ``max_chars`` characters;
- **priority**: it runs at a lower priority (``nice`` +10) than the threads that answer requests.

A read that is cancelled (its file removed, its batch cancelled, the server stopping) kills its process at
once. Whatever ends a read early is an :class:`~embedrank.retrieval.documents.InvalidFileError` naming the
bound, the same on every run (the caller marks the file ``failed`` instead of reading it again). The process
sends its documents back as MessagePack, never as a pickle: a reader that a hostile file took over cannot send
code to run.

>>> import asyncio, tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> _ = (folder / "f").write_bytes(b"<html><p>Hello <b>world</b></p></html>")
>>> readers = FileReaders(slots=1)
>>> [d.text for d in asyncio.run(readers.read(folder / "f", "page.html"))]
['Hello world']
>>> readers.close()
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import resource
import signal
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec

from embedrank.retrieval.documents import Document, InvalidFileError, UnsupportedFileError, read_documents

# what the reading processes' server imports once, so that each fork starts with the readers loaded
PRELOAD = ["__main__", "embedrank.retrieval.documents", "msgspec", "pypdf", "lxml.html"]
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
    docs: list[tuple[str, dict[str, str | int | float | bool]]]


class _Refused(msgspec.Struct, tag="refused"):
    code: str
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


def _read_in_process(path: str, filename: str, limits: ReadLimits, send: Connection) -> None:
    """The reading process's work: one file's documents, or why it is refused, sent back once."""
    name = repr(filename[:100])
    _confine(limits)
    outcome: _Outcome
    try:
        docs = read_documents(filename, Path(path).read_bytes(), max_pages=limits.max_pages, max_chars=limits.max_chars)
        outcome = _Read([(d.text, dict(d.attributes)) for d in docs])
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
    send.send_bytes(msgspec.msgpack.encode(outcome))
    send.close()


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


def _wait(receive: Connection, process: Any, filename: str, limits: ReadLimits) -> list[Document]:
    """In a waiting thread: the reading process's answer, within the wall-clock limit. The thread owns
    ``receive`` (a cancelled read kills the process, which ends the wait here)."""
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
        error = UnsupportedFileError if outcome.code == UnsupportedFileError.code else InvalidFileError
        raise error(outcome.message)
    return [Document(text, attributes) for text, attributes in outcome.docs]


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

    async def read(self, path: Path, filename: str) -> list[Document]:
        """The documents of the file at ``path``, uploaded as ``filename``.

        Raises:
            UnsupportedFileError: a type that is not read.
            InvalidFileError: content that is not of its type, or past a bound of :class:`ReadLimits` (named).
        """
        loop = asyncio.get_running_loop()
        async with self.slots:
            receive, send = self._context.Pipe(duplex=False)
            process = self._context.Process(
                target=_read_in_process, args=(str(path), filename, self.limits, send), daemon=True
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
