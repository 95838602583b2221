"""The loop that runs batches: it validates new batches, keeps a few chunks of lines in flight (claimed in
the store, their lines submitted together so that the engine batches them, behind direct requests), and
finalizes the batches that are done, cancelled or expired.

Nothing is lost or done twice across a crash: a chunk's results count only once the store has recorded it
done (:meth:`~service.batches.store.BatchStore.finish`), and a chunk a dead worker held is claimed again
when its lease runs out (at once when a single server restarts on its SQLite store).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedrank.errors import NotReadyError
from embedrank.serving import tracing
from embedrank.serving.pool import ModelPool
from service.batches.lines import (
    Checked,
    InputLine,
    Retry,
    Unready,
    read_input,
    request_lines,
    result_line,
    run_line,
    unrun_line,
)
from service.batches.store import BatchRow, BatchStore, Chunk, Ending
from service.context import Context
from service.errors import InsufficientStorageError
from service.settings import Settings
from service.storage.database import DatabaseUnavailableError
from service.storage.service import RETRY_SECONDS

logger = logging.getLogger("embedrank.service")

EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
WATCH_SECONDS = 0.5  # how often a running chunk looks whether its batch was cancelled
VALIDATION_TRIES = 3  # a batch whose checking fails so many times for a reason of its own is failed with it


@dataclasses.dataclass
class BatchWorker:
    """Runs the batches of ``store`` on the models ``pool_of`` gives (it raises while they are not ready).

    ``chunk_lines`` lines make a chunk; ``concurrency`` chunks are in flight at once; a claim lasts
    ``lease_seconds`` and is renewed while its chunk runs; with nothing to do, the loop looks again every
    ``poll_seconds`` (or when :meth:`wake` is called); ``max_lines`` bounds the request lines of one input file.
    """

    store: BatchStore
    pool_of: Callable[[], ModelPool]
    settings: Settings
    chunk_lines: int = 128
    concurrency: int = 2
    lease_seconds: float = 60.0
    poll_seconds: float = 0.5
    max_lines: int = 50_000
    name: str = dataclasses.field(default_factory=lambda: secrets.token_hex(6))
    lines_done: int = 0  # request lines this worker has recorded (output and error lines)
    orphans_removed: int = 0  # files without a row and rows without a file it removed (FileStore.remove_orphans)
    sweep_seconds: float = 600.0  # how often it looks for them
    _next_sweep: float = 0.0  # when it looks next (monotonic); at once when it starts
    room_wanted_since: float | None = None  # since when (Unix time) the store's disk has been full; None: it is not
    _no_claims_until: float = 0.0  # no chunk is claimed before this (monotonic): the disk was full
    _woken: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    _failures: dict[str, int] = dataclasses.field(default_factory=dict)  # batch id: its checks that failed in turn

    def wake(self) -> None:
        """Look for work now rather than at the next poll (a batch was just created here)."""
        self._woken.set()

    async def run(self) -> None:
        """Work until cancelled."""
        inflight: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    busy = await self._housekeeping()
                    # no chunk is claimed while the models are not ready: a claim held while waiting would keep
                    # the lines from a ready replica, and the batch from expiring if loading never ends
                    while len(inflight) < self.concurrency and self._ready() and not self._waiting_for_room():
                        chunk = await asyncio.to_thread(self.store.claim, self.name, self.lease_seconds)
                        if chunk is None:
                            break
                        inflight.add(asyncio.create_task(self.run_chunk(chunk)))
                        busy = True
                except InsufficientStorageError as exc:  # the disk is full: batches wait, none fails
                    self._out_of_room(exc)
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
                except Exception as exc:  # the store failed: its claims run out, and the loop tries again
                    _log_failure(exc, f"batch worker: the store failed; trying again in {RETRY_SECONDS:.0f} s")
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
                if inflight:
                    done, inflight = await asyncio.wait(
                        inflight, timeout=self.poll_seconds, return_when="FIRST_COMPLETED"
                    )
                    for task in done:
                        if (failure := task.exception()) is not None:
                            _log_failure(failure, "batch worker: a chunk failed; its claim runs out and it runs again")
                elif not busy:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._woken.wait(), self.poll_seconds)
                    self._woken.clear()
        finally:
            for task in inflight:
                task.cancel()
            await asyncio.gather(*inflight, return_exceptions=True)

    def _out_of_room(self, exc: InsufficientStorageError) -> None:
        """The store's disk is full: claim no chunk for :data:`RETRY_SECONDS` (the chunks in flight that cannot
        be recorded go back), say so once; batches wait and none fails."""
        if self.room_wanted_since is None:
            self.room_wanted_since = time.time()
            logger.error("batch store: the disk is full (%s); batches wait until there is room", exc)
        self._no_claims_until = time.monotonic() + RETRY_SECONDS

    def _room_again(self) -> None:
        if self.room_wanted_since is not None:
            logger.warning(
                "batch store: there is room again after %.0f s; batches go on", time.time() - self.room_wanted_since
            )
            self.room_wanted_since = None

    def _waiting_for_room(self) -> bool:
        return time.monotonic() < self._no_claims_until

    def _ready(self) -> bool:
        try:
            self.pool_of()
        except NotReadyError:
            return False
        return True

    async def _housekeeping(self) -> bool:
        """Validate new batches, each key's oldest one per round (so one key's many new batches do not hold up
        another key's, nor the claims between rounds), and finalize finished ones; True when there was any.

        A batch whose validation or finalizing fails for a reason of its own is set apart, so that no batch
        holds up another (or another key's): its validation is tried again at the next round and, failing
        :data:`VALIDATION_TRIES` times in turn, fails the batch with the reason; its finalizing is tried again
        at the next round. The store failing (its database unreachable) stops the round: nothing can be done."""
        validating = await asyncio.to_thread(self.store.batches_in, "validating")
        for batch in oldest_of_each_owner(validating):
            try:
                await self.validate(batch)
            except (DatabaseUnavailableError, InsufficientStorageError):  # the store's, not the batch's
                raise
            except Exception as exc:
                await self._validation_failed(batch, exc)
            else:
                self._failures.pop(batch.id, None)
                self._room_again()
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self.sweep_seconds
            removed = await asyncio.to_thread(self.store.files.remove_orphans)
            if removed:
                logger.warning("batch store: removed %d files without a row or rows without a file", removed)
            self.orphans_removed += removed
        finishing = await asyncio.to_thread(self.store.ready_to_finalize)
        for batch, ending in finishing:
            try:
                await self.finalize(batch, ending)
                self._room_again()
            except (DatabaseUnavailableError, InsufficientStorageError):
                raise
            except Exception as exc:
                logger.error("batch %s: finalizing failed (%s: %s); trying again", batch.id, type(exc).__name__, exc)
                logger.debug("batch %s: finalizing failed", batch.id, exc_info=exc)
        return bool(validating or finishing)

    async def _validation_failed(self, batch: BatchRow, exc: Exception) -> None:
        tries = self._failures[batch.id] = self._failures.get(batch.id, 0) + 1
        reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        logger.debug("batch %s: validation failed", batch.id, exc_info=exc)
        if tries < VALIDATION_TRIES:
            logger.error(
                "batch %s: validation failed (%s); trying again (%d of %d)",
                batch.id,
                reason,
                tries,
                VALIDATION_TRIES,
            )
            return
        logger.error("batch %s: validation failed %d times (%s): the batch fails", batch.id, tries, reason)
        message = f"the input file could not be checked ({reason})"
        await asyncio.to_thread(
            self.store.fail,
            batch.id,
            [{"code": "validation_failed", "message": message, "param": None, "line": None}],
        )
        self._failures.pop(batch.id, None)

    async def validate(self, batch: BatchRow) -> None:
        """Check the batch's input file and cut it into chunks, or fail the batch with the file's errors."""
        path = self.store.files.file_path(batch.input_file_id)

        def check() -> Checked:  # the file read a line at a time, in a worker thread
            with path.open("rb") as lines:
                return read_input(
                    batch.id, lines, batch.endpoint, chunk_lines=self.chunk_lines, max_lines=self.max_lines
                )

        try:
            checked = await asyncio.to_thread(check)
        except FileNotFoundError:
            error = {"code": "missing_input_file", "message": "the input file was deleted", "param": "input_file_id"}
            await asyncio.to_thread(self.store.fail, batch.id, [{**error, "line": None}])
            return
        if checked.errors:
            await asyncio.to_thread(self.store.fail, batch.id, checked.errors)
        else:
            await asyncio.to_thread(self.store.start, batch.id, checked.chunks)

    async def run_chunk(self, chunk: Chunk) -> None:
        """Run every line of ``chunk`` together and record its output and error lines. A chunk of a batch that
        is cancelled meanwhile is given up (its lines not recorded, its claim released). Traced as one span
        (``embedrank.batch_chunk``) with a child span per line (``embedrank.batch_line``)."""
        attributes = {
            "embedrank.batch.id": chunk.batch_id,
            "embedrank.batch.chunk": chunk.number,
            "embedrank.batch.lines": chunk.lines,
        }
        with tracing.span("embedrank.batch_chunk", attributes):
            await self._run_chunk(chunk)

    async def _run_chunk(self, chunk: Chunk) -> None:
        batch = await asyncio.to_thread(self.store.get_batch, None, chunk.batch_id)
        if batch is None:
            return
        lines = await asyncio.to_thread(_read_chunk, self.store.files.file_path(batch.input_file_id), chunk)
        running = [asyncio.ensure_future(self._run(line, chunk.first_line + k)) for k, line in enumerate(lines)]
        work = asyncio.gather(*running)
        watching = asyncio.create_task(self._watch(chunk, work))
        try:
            results = await work
        except asyncio.CancelledError:
            if not watching.done():  # this task was cancelled: the worker is stopping
                raise
            with contextlib.suppress(DatabaseUnavailableError):  # unreachable: the claim runs out by itself
                await asyncio.to_thread(self.store.release, self.name, chunk)
            return
        except Unready as exc:  # the models are not ready (any more): the chunk goes back, unrecorded
            for task in running:
                task.cancel()
            logger.warning("batch %s: chunk %d given back: %s", chunk.batch_id, chunk.number, exc)
            await asyncio.to_thread(self.store.release, self.name, chunk)
            return
        finally:
            watching.cancel()
        output = b"".join(
            result_line(line.custom_id, s, b, r) for line, (s, b, r) in zip(lines, results, strict=True) if s < 400
        )
        errors = b"".join(
            result_line(line.custom_id, s, b, r) for line, (s, b, r) in zip(lines, results, strict=True) if s >= 400
        )
        failed = sum(1 for s, _, _ in results if s >= 400)
        try:
            recorded = await asyncio.to_thread(
                self.store.finish, self.name, chunk, output, errors, len(lines) - failed, failed
            )
        except InsufficientStorageError as exc:  # the chunk goes back, to run again once there is room
            self._out_of_room(exc)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.store.release, self.name, chunk)
            return
        self._room_again()
        if recorded:
            self.lines_done += len(lines)
        else:
            logger.warning(
                "batch %s: chunk %d was claimed by another worker; its results are dropped",
                chunk.batch_id,
                chunk.number,
            )

    async def _run(self, line: InputLine, number: int) -> tuple[int, bytes, str]:
        """``line`` (request line ``number`` of its file, from 0) run (:func:`run_line`), again after a growing
        pause while the engine is overloaded.

        Raises:
            Unready: the models are not ready (any more).
        """
        with tracing.span("embedrank.batch_line", {"embedrank.batch.line": number}):
            return await self._retried(line)

    async def _retried(self, line: InputLine) -> tuple[int, bytes, str]:
        delay = 0.05
        while True:
            try:
                pool = self.pool_of()
            except NotReadyError as exc:
                raise Unready(str(exc)) from exc
            try:
                return await run_line(line, Context(pool, self.settings, cached=True))
            except Retry:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _watch(self, chunk: Chunk, work: asyncio.Future[Any]) -> None:
        """While ``chunk`` runs: renew its claim, and give it up (cancel ``work``) when its batch is cancelled,
        the claim is lost, or the store has been unreachable for a whole lease (another worker may hold the
        chunk by then: its results would be refused)."""
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        unreachable = False
        while True:
            await asyncio.sleep(min(self.lease_seconds / 3, WATCH_SECONDS))
            try:
                batch = await asyncio.to_thread(self.store.get_batch, None, chunk.batch_id)
                held = True
                if loop.time() - renewed >= self.lease_seconds / 3:
                    held = await asyncio.to_thread(self.store.renew, self.name, chunk, self.lease_seconds)
                    renewed = loop.time()
            except DatabaseUnavailableError as exc:
                if loop.time() - renewed < self.lease_seconds:
                    if not unreachable:  # one line per outage; the chunk runs on while its lease lasts
                        logger.warning(
                            "batch %s: chunk %d: its claim cannot be renewed: %s", chunk.batch_id, chunk.number, exc
                        )
                    unreachable = True
                    continue
                logger.warning(
                    "batch %s: chunk %d given up: its claim could not be renewed for %.0f s (its lease)",
                    chunk.batch_id,
                    chunk.number,
                    self.lease_seconds,
                )
                work.cancel()
                return
            unreachable = False
            if batch is None or (batch.status != "in_progress" and batch.status != "finalizing") or not held:
                work.cancel()
                return

    async def finalize(self, batch: BatchRow, ending: Ending) -> None:
        """Join the recorded parts, in line order, into the batch's output and error files (lines that never
        ran, when it expired, go to the error file), then close it as ``ending``."""
        claimed = await asyncio.to_thread(self.store.claim_finalizing, self.name, batch, ending, self.lease_seconds)
        if not claimed:
            return
        # the claim is renewed while the files are written, as a chunk's is: a worker that dies while finalizing
        # has the batch finalized by another one lease later
        writing = asyncio.ensure_future(asyncio.to_thread(self._write_results, batch, ending))
        held = True
        while not (await asyncio.wait({writing}, timeout=self.lease_seconds / 3))[0]:
            renewed = await asyncio.to_thread(self.store.renew_finalizing, self.name, batch.id, self.lease_seconds)
            held = held and renewed
        output_id, error_id = await writing
        closed = held and await asyncio.to_thread(
            self.store.close_batch, self.name, batch.id, ending, output_id, error_id
        )
        if not closed:  # another worker took the finalizing over (this one was too slow to renew): it closes it
            logger.warning("batch %s: its finalizing was taken over by another worker", batch.id)

    def _write_results(self, batch: BatchRow, ending: Ending) -> tuple[str | None, str | None]:
        chunks = self.store.chunks(batch.id)
        parts = [c.part for c in chunks if c.state == "done" and c.part is not None]
        outputs = [self.store.part_path(batch.id, part, "out") for part in parts]
        errors: list[Path | bytes] = [self.store.part_path(batch.id, part, "err") for part in parts]
        if ending == "expired":
            source = self.store.files.file_path(batch.input_file_id)
            for c in chunks:
                if c.state != "done":
                    errors += [
                        unrun_line(line.custom_id, "batch_expired", EXPIRED_MESSAGE) for line in _read_chunk(source, c)
                    ]
        output_id = self.store.files.add_result_file(batch.owner, batch.id, "output", outputs)
        error_id = self.store.files.add_result_file(batch.owner, batch.id, "errors", errors)
        return output_id, error_id


def _log_failure(exc: BaseException, what: str) -> None:
    """Log ``what`` happened because of ``exc``: one line while the database is unreachable (an outage the worker
    outlasts: its traceback at debug), the traceback for anything else."""
    if isinstance(exc, DatabaseUnavailableError):
        logger.error("%s: %s", what, exc)
        logger.debug("%s", what, exc_info=exc)
    else:
        logger.error("%s", what, exc_info=exc)


def oldest_of_each_owner(batches: list[BatchRow]) -> list[BatchRow]:
    """Of ``batches`` (oldest first), each owner's oldest, in that order."""
    first: dict[str, BatchRow] = {}
    for batch in batches:
        first.setdefault(batch.owner, batch)
    return list(first.values())


def _read_chunk(path: Path, chunk: Chunk) -> list[InputLine]:
    """The request lines of ``chunk``, read from its bytes of the input file ``path``."""
    with open(path, "rb") as f:
        f.seek(chunk.start_byte)
        return request_lines(f.read(chunk.end_byte - chunk.start_byte))
