"""Reading the files attached to vector stores: the worker that claims each ``in_progress`` file (no API key
holding more than ``max_file_reads_per_key`` reads at once), reads its documents
(:mod:`embedrank.retrieval.documents`) in a bounded process that is killed when the file is removed or its
batch cancelled (:class:`~embedrank.serving.file_readers.FileReaders`), cuts them into chunks of the store model's tokens
(:func:`~embedrank.models.chunking.split_windows`, the library's long-document windows), embeds the chunks through
the model's engine behind every direct request (the batch lines' priority, with the embedding cache: attaching
an unchanged file again computes no vector), and through the store's SPLADE model if it has one (cached too),
and writes them, all at once, while its claim holds
(:meth:`~service.vector_stores.store.VectorStoreTables.complete`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from embedrank.errors import InputTooLongError, ModelUnavailableError, NotReadyError, OverloadedError
from embedrank.retrieval.documents import InvalidFileError, UnsupportedFileError
from embedrank.serving.chunking import TooManyChunksError, chunk_documents, window_of
from embedrank.serving.file_readers import FileReaders, ReadLimits
from embedrank.serving.hosting import HostedModel
from embedrank.serving.options import EmbedOptions
from embedrank.serving.pool import ModelPool
from service.context import BACKGROUND_PRIORITY
from service.errors import InsufficientStorageError
from service.settings import Settings
from service.vector_stores.store import ChunkData, ErrorCode, FileRow, StoreRow, VectorStoreTables

logger = logging.getLogger("embedrank.service")

SLICE = 256
"""Chunks one embedding call holds."""
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


class Ingestor:
    """The worker that reads attached files, one at a time, on every replica (claims keep two from reading one)."""

    def __init__(
        self,
        tables: VectorStoreTables,
        file_path: Callable[[str], Path],
        pool_of: Callable[[], ModelPool],
        settings: Settings,
    ) -> None:
        self.tables = tables
        self.file_path = file_path
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
        limits = self.settings.limits
        try:
            docs = await self.readers.read(self.file_path(file.file_id), file.filename)
            served = self.pool_of().get(store.model, "embeddings")
            stored = await asyncio.to_thread(self.tables.chunks_beside, None, file)
            room = max(0, limits.max_vector_store_chunks - stored)
            try:
                pieces = await chunk_documents(served, docs, file.chunk_size, file.chunk_overlap, max_chunks=room)
            except TooManyChunksError as exc:  # stopped as soon as they passed: the rest is neither cut nor kept
                raise InvalidFileError(
                    f"the file has more than {exc.limit} chunks, and the vector store, holding {stored}, may hold "
                    f"max_vector_store_chunks={limits.max_vector_store_chunks}"
                ) from None
            if not pieces:
                raise InvalidFileError(
                    f"{file.filename[:100]!r} holds no text to search (a scanned PDF's pages have no text layer)"
                )
            refused = await asyncio.to_thread(
                self.tables.too_many_chunks, None, file, len(pieces), limits.max_vector_store_chunks
            )
            if refused is not None:  # before any chunk is embedded
                raise InvalidFileError(refused)
            texts = [text for text, _ in pieces]
            vectors = await self._embed(served, texts, store.adapter)
            sparse = await self._sparse(store.sparse_model, texts) if store.sparse_model else None
        except (UnsupportedFileError, InvalidFileError) as exc:
            await self._failed(file, exc.code, str(exc))  # type: ignore[arg-type]
            return
        except (OverloadedError, NotReadyError, ModelUnavailableError) as exc:
            logger.info("vector stores: %s waits: %s", file.file_id, exc)
            await asyncio.sleep(RETRY_SECONDS)
            await asyncio.to_thread(self.tables.release, self.worker_id, file)  # read again at the next claim
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("vector stores: reading %s failed", file.file_id)
            await self._failed(file, "server_error", f"{type(exc).__name__}: {exc}")
            return
        chunks = [
            ChunkData(text, dict(docs[owner].attributes) or None, vector, sparse[i] if sparse is not None else None)
            for i, ((text, owner), vector) in enumerate(zip(pieces, vectors, strict=True))
        ]
        try:
            written = await asyncio.to_thread(
                self.tables.complete, self.worker_id, file, chunks, max_chunks=limits.max_vector_store_chunks
            )
        except InsufficientStorageError:
            await self._failed(
                file,
                "server_error",
                "the server had no room on its disk to store the file's chunks; attach the file again once there is "
                "room (delete files or stores you no longer need)",
            )
            return
        if written:
            self.files_read += 1

    async def _failed(self, file: FileRow, code: ErrorCode, message: str) -> None:
        """Mark ``file`` ``failed`` with the reason, once (a failed file is not read again); when even that cannot
        be written now (the database is unreachable, its disk full), its claim lapses and it is read again later."""
        try:
            await asyncio.to_thread(self.tables.fail, self.worker_id, file, code, message)
        except Exception as exc:
            logger.warning("vector stores: cannot record that %s failed (%s): %s", file.file_id, message, exc)

    @staticmethod
    async def _sliced(texts: list[str], compute: Callable[[list[str]], Awaitable[T]]) -> list[T]:
        """``compute`` of each slice of :data:`SLICE` texts, :data:`IN_FLIGHT` at once, in order."""
        in_flight = asyncio.Semaphore(IN_FLIGHT)

        async def part(first: int) -> T:
            async with in_flight:
                return await compute(texts[first : first + SLICE])

        return await asyncio.gather(*(part(first) for first in range(0, len(texts), SLICE)))

    async def _embed(self, served: HostedModel, texts: list[str], adapter: str | None = None) -> np.ndarray:
        """``(N, D)`` float32 vectors of the chunks (by the store's LoRA ``adapter``, if it names one)."""
        options = EmbedOptions(
            input_type="document",
            adapter=adapter,
            priority=BACKGROUND_PRIORITY,
            cached=True,
            budget=self.settings.limits.max_request_tokens,
        )

        async def dense(part: list[str]) -> np.ndarray:
            return (await served.embed(part, options)).output.embeddings  # type: ignore[no-any-return]

        parts = await self._sliced(texts, dense)
        return np.concatenate(parts).astype(np.float32) if parts else np.empty((0, 0), dtype=np.float32)

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

        async def sparse(part: list[str]) -> list[SparseVector]:
            return (await served.sparse(part, options)).sparse_arrays()

        try:
            parts = await self._sliced(texts, sparse)
        except InputTooLongError:
            raise InvalidFileError(
                f"a chunk is longer than the store's SPLADE model {model!r} reads at once ({await window_of(served)} "
                "tokens of its own); attach the file with a smaller static chunk size"
            ) from None
        return [vector for part in parts for vector in part]


def _logged(task: asyncio.Task[None]) -> None:
    """Log the error a read's task ended with (every error is handled within it; this is the backstop that keeps
    one from passing unseen, as "Task exception was never retrieved")."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.error("vector stores: a file's read ended with an error", exc_info=exc)
