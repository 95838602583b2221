"""Reading the files attached to vector stores: the worker that claims each ``in_progress`` file (no API key
holding more than ``max_file_reads_per_key`` reads at once), reads its documents
(:mod:`embedrank.retrieval.documents`) in a bounded process that is killed when the file is removed or its
batch cancelled (:class:`~embedrank.serving.file_readers.FileReaders`), cuts them into chunks of the store model's tokens
(:func:`~embedrank.serving.chunking.chunk_documents`, the library's long-document windows) and counts them against
the store's room before any is embedded, then embeds the chunks through the model's engine behind every direct
request (the batch lines' priority, with the embedding cache: attaching an unchanged file again computes no
vector), and through the store's SPLADE model if it has one (cached too), writing them a part at a time while its
claim holds (:meth:`~service.vector_stores.store.VectorStoreTables.write_chunks`), and marks the file
``completed``.

A file's text and chunks wait on disk between these steps, in spools of the worker's scratch folder (removed when
the file is done; a folder left by a killed process is removed when the next one on its host starts), so that the
memory a file takes is that of a frame of text or chunks, whatever the file's length.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
import shutil
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from embedrank.errors import InputTooLongError, ModelUnavailableError, NotReadyError, OverloadedError
from embedrank.retrieval.documents import InvalidFileError, UnsupportedFileError
from embedrank.serving.chunking import TooManyChunksError, chunk_documents, window_of
from embedrank.serving.file_readers import FileReaders, ReadLimits, spooled_pieces
from embedrank.serving.hosting import HostedModel
from embedrank.serving.options import EmbedOptions
from embedrank.serving.pool import ModelPool
from embedrank.serving.spool import SpoolWriter, read_frames
from service.context import BACKGROUND_PRIORITY
from service.errors import InsufficientStorageError
from service.settings import Settings
from service.vector_stores.store import ChunkData, ErrorCode, FileRow, StoreRow, VectorStoreTables

logger = logging.getLogger("embedrank.service")

SLICE = 256
"""Chunks one embedding call holds (a frame of the chunks' spool), and one write to the database."""
FILES_IN_FLIGHT = 8
"""Files one replica reads at once: the chunks of small files share the engine's forward passes."""
IN_FLIGHT = 2
"""Embedding calls of one file in the engine's queue at once: the next is queued while one runs, so the engine
never waits between them."""
IDLE_SECONDS = 2.0
"""How long the worker waits for a new file before it looks again (files attached on another replica)."""
RETRY_SECONDS = 5.0
T = TypeVar("T")
SparseVector = tuple[np.ndarray, np.ndarray]
ChunkFrame = list[tuple[str, dict[str, Any]]]


class _ClaimLost(Exception):
    """The worker no longer holds the file (removed, cancelled, its store deleted, or its lease taken)."""


def scratch_folder(root: Path) -> Path:
    """This process's folder for spools, under ``root``'s ``reading/`` (named by host and process), created
    empty; the folders of this host's processes that are no longer running are removed."""
    reading = root / "reading"
    host = socket.gethostname()
    for folder in reading.glob(f"{host}-*"):
        pid = folder.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    own = reading / f"{host}-{os.getpid()}"
    shutil.rmtree(own, ignore_errors=True)
    own.mkdir(parents=True)
    return own


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Ingestor:
    """The worker that reads attached files, one at a time, on every replica (claims keep two from reading one)."""

    def __init__(
        self,
        tables: VectorStoreTables,
        file_path: Callable[[str], Path],
        pool_of: Callable[[], ModelPool],
        settings: Settings,
        scratch: Path,
    ) -> None:
        self.tables = tables
        self.file_path = file_path
        self.scratch = scratch
        self.pool_of = pool_of
        self.settings = settings
        self.lease_seconds = settings.batches.batch_lease_seconds
        self.worker_id = f"vs-{secrets.token_hex(6)}"
        self._wake = asyncio.Event()
        self._recheck = asyncio.Event()
        self.files_read = 0
        limits = settings.limits
        self.readers = FileReaders(
            FILES_IN_FLIGHT,
            ReadLimits(
                seconds=limits.file_read_seconds,
                cpu_seconds=limits.file_read_cpu_seconds,
                memory_bytes=limits.file_read_memory,
                max_pages=limits.max_file_pages,
                max_chars=limits.max_file_bytes,
            ),
        )

    def wake(self) -> None:
        self._wake.set()

    def recheck(self) -> None:
        """Check every claim now (a file was removed, a store deleted, a batch cancelled): a read whose file
        left ``in_progress`` is stopped at once rather than at the next renewal."""
        self._recheck.set()
        self._recheck = asyncio.Event()

    async def run(self) -> None:
        """Read files, :data:`FILES_IN_FLIGHT` at a time, until cancelled."""
        slots = asyncio.Semaphore(FILES_IN_FLIGHT)
        reading: set[asyncio.Task[None]] = set()
        try:
            while True:
                await slots.acquire()
                try:
                    claimed = await asyncio.to_thread(
                        self.tables.claim,
                        self.worker_id,
                        self.lease_seconds,
                        per_owner=self.settings.limits.max_file_reads_per_key,
                    )
                except Exception as exc:  # the database is unreachable now: try again
                    slots.release()
                    logger.warning("vector stores: cannot claim a file: %s", exc)
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
                if claimed is None:
                    slots.release()
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), IDLE_SECONDS)
                    continue
                task = asyncio.create_task(self._held(*claimed))
                reading.add(task)
                task.add_done_callback(reading.discard)
                task.add_done_callback(_logged)
                task.add_done_callback(lambda _: slots.release())
        finally:
            for task in reading:
                task.cancel()
            await asyncio.gather(*reading, return_exceptions=True)
            self.readers.close()

    async def _held(self, file: FileRow, store: StoreRow) -> None:
        """Read ``file`` while renewing its claim; stop when the claim is lost (cancelled, removed, expired)."""
        work = asyncio.create_task(self.ingest(file, store))
        while not work.done():
            recheck = asyncio.create_task(self._recheck.wait())
            done, _ = await asyncio.wait({work, recheck}, timeout=self.lease_seconds / 3, return_when="FIRST_COMPLETED")
            recheck.cancel()
            if work in done:
                break
            try:
                held = await asyncio.to_thread(self.tables.renew, self.worker_id, file, self.lease_seconds)
            except Exception as exc:
                logger.warning("vector stores: cannot renew the claim on %s: %s", file.file_id, exc)
                held = True  # the lease still runs; the final write checks it
            if not held:
                work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work

    async def ingest(self, file: FileRow, store: StoreRow) -> None:
        """Read, chunk and embed ``file`` and write its chunks; a file that cannot be read is ``failed`` with
        the reason, a model that is busy or not ready has the file read again later."""
        read = f"{file.seq}-{secrets.token_hex(4)}"  # a read of its own (one of the file cancelled may still end)
        text, chunks = self.scratch / f"{read}.text", self.scratch / f"{read}.chunks"
        try:
            await self._ingest(file, store, text, chunks)
        except (UnsupportedFileError, InvalidFileError) as exc:
            await self._failed(file, exc.code, str(exc))  # type: ignore[arg-type]
        except (OverloadedError, NotReadyError, ModelUnavailableError) as exc:
            logger.info("vector stores: %s waits: %s", file.file_id, exc)
            await asyncio.sleep(RETRY_SECONDS)
            await asyncio.to_thread(self.tables.release, self.worker_id, file)  # read again at the next claim
        except _ClaimLost:
            pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, InsufficientStorageError) or getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
                message = (
                    "the server had no room on its disk to read the file or store its chunks; attach the file again "
                    "once there is room (delete files or stores you no longer need)"
                )
            else:
                logger.exception("vector stores: reading %s failed", file.file_id)
                message = f"{type(exc).__name__}: {exc}"
            await self._failed(file, "server_error", message)
        finally:
            text.unlink(missing_ok=True)
            chunks.unlink(missing_ok=True)

    async def _ingest(self, file: FileRow, store: StoreRow, text: Path, chunks: Path) -> None:
        """The steps of :meth:`ingest`: the file's documents read into the spool ``text``, its chunks cut into the
        spool ``chunks`` and counted, then embedded and written a part at a time, and the file completed."""
        limits = self.settings.limits
        await self.readers.read(self.file_path(file.file_id), file.filename, text)
        served = self.pool_of().get(store.model, "embeddings")
        stored = await asyncio.to_thread(self.tables.chunks_beside, None, file)
        room = max(0, limits.max_vector_store_chunks - stored)
        try:
            count = await self._chunked(served, file, text, chunks, room)
        except TooManyChunksError as exc:  # stopped as soon as they passed: the rest is neither cut nor kept
            raise InvalidFileError(
                f"the file has more than {exc.limit} chunks, and the vector store, holding {stored}, may hold "
                f"max_vector_store_chunks={limits.max_vector_store_chunks}"
            ) from None
        text.unlink()
        if not count:
            raise InvalidFileError(
                f"{file.filename[:100]!r} holds no text to search (a scanned PDF's pages have no text layer)"
            )
        refused = await asyncio.to_thread(
            self.tables.too_many_chunks, None, file, count, limits.max_vector_store_chunks
        )
        if refused is not None:  # before any chunk is embedded
            raise InvalidFileError(refused)
        used = await self._written(served, store, file, chunks)
        done = await asyncio.to_thread(
            self.tables.complete, self.worker_id, file, count, used, max_chunks=limits.max_vector_store_chunks
        )
        if done:
            self.files_read += 1

    async def _chunked(self, served: HostedModel, file: FileRow, text: Path, chunks: Path, room: int) -> int:
        """Cut the documents spooled in ``text`` into ``file``'s chunks, spooled in ``chunks`` in frames of
        :data:`SLICE`; how many there are (at most ``room``: past it, :class:`TooManyChunksError` at once)."""
        count = 0
        frame: ChunkFrame = []
        with SpoolWriter(chunks) as out:
            pieces = _in_thread(spooled_pieces(text))
            async for chunk_text, attributes in chunk_documents(
                served, pieces, file.chunk_size, file.chunk_overlap, max_chunks=room
            ):
                frame.append((chunk_text, dict(attributes)))
                count += 1
                if len(frame) == SLICE:
                    await asyncio.to_thread(out.write, frame)
                    frame = []
            if frame:
                await asyncio.to_thread(out.write, frame)
        return count

    async def _written(self, served: HostedModel, store: StoreRow, file: FileRow, chunks: Path) -> int:
        """Embed the chunks spooled in ``chunks`` a frame at a time, :data:`IN_FLIGHT` frames in the engine at once,
        and write each frame as it is embedded, in order; the bytes they take.

        Raises:
            _ClaimLost: the worker no longer holds the file (nothing more is written).
        """
        pending: deque[asyncio.Task[list[ChunkData]]] = deque()
        written = used = 0

        async def write_next() -> None:
            nonlocal written, used
            part = await pending.popleft()
            if not await asyncio.to_thread(self.tables.write_chunks, self.worker_id, file, written, part):
                raise _ClaimLost
            written += len(part)
            used += sum(c.size for c in part)

        try:
            async for frame in _in_thread(read_frames(chunks, ChunkFrame)):
                pending.append(asyncio.create_task(self._computed(served, store, frame)))
                if len(pending) == IN_FLIGHT:
                    await write_next()
            while pending:
                await write_next()
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return used

    async def _computed(self, served: HostedModel, store: StoreRow, frame: ChunkFrame) -> list[ChunkData]:
        """The chunks of ``frame`` with their vectors (and sparse vectors, in a store with a SPLADE model)."""
        texts = [text for text, _ in frame]
        vectors = await self._embed(served, texts, store.adapter)
        sparse = await self._sparse(store.sparse_model, texts) if store.sparse_model else None
        return [
            ChunkData(text, attributes or None, vector, sparse[i] if sparse is not None else None)
            for i, ((text, attributes), vector) in enumerate(zip(frame, vectors, strict=True))
        ]

    async def _failed(self, file: FileRow, code: ErrorCode, message: str) -> None:
        """Mark ``file`` ``failed`` with the reason, once (a failed file is not read again); when even that cannot
        be written now (the database is unreachable, its disk full), its claim lapses and it is read again later."""
        try:
            await asyncio.to_thread(self.tables.fail, self.worker_id, file, code, message)
        except Exception as exc:
            logger.warning("vector stores: cannot record that %s failed (%s): %s", file.file_id, message, exc)

    async def _embed(self, served: HostedModel, texts: list[str], adapter: str | None = None) -> np.ndarray:
        """``(N, D)`` float32 vectors of the chunks (by the store's LoRA ``adapter``, if it names one)."""
        options = EmbedOptions(
            input_type="document",
            adapter=adapter,
            priority=BACKGROUND_PRIORITY,
            cached=True,
            budget=self.settings.limits.max_request_tokens,
        )

        vectors = (await served.embed(texts, options)).output.embeddings
        return np.asarray(vectors, dtype=np.float32)

    async def _sparse(self, model: str, texts: list[str]) -> list[SparseVector]:
        """Each chunk's sparse vector by the SPLADE model ``model``, as (int32 indices, float32 values); a chunk
        longer than the model reads fails the file (a smaller chunk size reads it)."""
        served = self.pool_of().get(model, "embeddings")
        options = EmbedOptions(
            input_type="document",
            priority=BACKGROUND_PRIORITY,
            truncate=False,
            cached=True,
            budget=self.settings.limits.max_request_tokens,
        )

        try:
            return (await served.sparse(texts, options)).sparse_arrays()  # type: ignore[no-any-return]
        except InputTooLongError:
            raise InvalidFileError(
                f"a chunk is longer than the store's SPLADE model {model!r} reads at once ({await window_of(served)} "
                "tokens of its own); attach the file with a smaller static chunk size"
            ) from None


async def _in_thread(items: Iterator[T]) -> AsyncIterator[T]:
    """``items``, each taken in a worker thread (reading and decoding a spool's frame), never on the event loop."""
    done = object()
    while (item := await asyncio.to_thread(next, items, done)) is not done:
        yield item  # type: ignore[misc]


def _logged(task: asyncio.Task[None]) -> None:
    """Log the error a read's task ended with (every error is handled within it; this is the backstop that keeps
    one from passing unseen, as "Task exception was never retrieved")."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.error("vector stores: a file's read ended with an error", exc_info=exc)
