"""The Batch API's lifecycle: its store (opened on first use) and the worker that runs its batches, and the
batches' progress for ``/metrics``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from embedrank.serving.pool import ModelPool
from service.batches.database import DatabaseUnavailableError, PostgresDatabase
from service.batches.store import ACTIVE, BatchRow, BatchStore
from service.batches.worker import RETRY_SECONDS, BatchWorker
from service.settings import Settings

logger = logging.getLogger("embedrank.service")


@dataclasses.dataclass(eq=False)  # a collector of the app's metrics registry: hashed by identity
class BatchService:
    """The batch store of ``settings.batches.batch_dir`` (opened on first use) and the worker that runs its batches."""

    settings: Settings
    pool_of: Callable[[], ModelPool]
    _store: BatchStore | None = None
    worker: BatchWorker | None = None
    _opening: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def opened(self) -> BatchStore | None:
        """The store if it is open, else None (:meth:`store` opens it)."""
        return self._store

    @property
    def root(self) -> Path:
        return self.settings.batches.folder()

    def store(self) -> BatchStore:
        """The store, opened on first use (blocking: a PostgreSQL server is reached over the network).

        Raises:
            DatabaseUnavailableError: the database cannot be reached now.
        """
        with self._opening:
            if self._store is None:
                url = self.settings.batches.batch_database
                self._store = BatchStore(self.root, PostgresDatabase(url) if url else None)
        return self._store

    async def reached(self) -> BatchStore:
        """The store, once it exists (SQLite's is created by the first upload or vector store; a PostgreSQL
        server is reached at start, and again every few seconds until it answers)."""
        while (
            not self.settings.batches.batch_database
            and self._store is None
            and not (self.root / "batches.db").is_file()
        ):
            await asyncio.sleep(0.5)
        while True:
            try:
                return await asyncio.to_thread(self.store)
            except Exception as exc:  # the server is not reachable (yet): the API answers 503 meanwhile
                logger.warning(
                    "the Batch API's database is not reachable: %s; trying again in %.0f s", exc, RETRY_SECONDS
                )
                await asyncio.sleep(RETRY_SECONDS)

    async def run(self) -> None:
        """The worker, once the store exists (:meth:`reached`); until cancelled."""
        store = await self.reached()
        if not store.db.shared:  # one host on its own store: a claim left by a crash cannot be live
            await asyncio.to_thread(store.release_claims)
        for folder in await asyncio.to_thread(store.leftover_parts):  # a crash between closing and cleaning up
            await asyncio.to_thread(shutil.rmtree, folder, True)
        self.worker = BatchWorker(
            store,
            self.pool_of,
            self.settings,
            max_lines=self.settings.limits.max_batch_lines,
            lease_seconds=self.settings.batches.batch_lease_seconds,
        )
        await self.worker.run()

    def collect(self) -> Iterator[Metric]:
        """The batches' progress for ``/metrics``, read from the store at each scrape: the unfinished batches,
        their lines waiting (the queue depth) and done, and the lines this process recorded. Summed over
        every key's batches: any key may read ``/metrics``, so batch ids appear (one series per batch) only
        when ``metrics_batch_ids`` is set."""
        by_batch = self.settings.telemetry.metrics_batch_ids
        labels = ["batch"] if by_batch else []
        unfinished = GaugeMetricFamily("embedrank_batches_unfinished", "Batches not finished (every key's)")
        waiting = GaugeMetricFamily(
            "embedrank_batch_lines_waiting", "Lines of unfinished batches not yet recorded", labels=labels
        )
        done = GaugeMetricFamily(
            "embedrank_batch_lines_done",
            "Lines of unfinished batches recorded, by outcome",
            labels=[*labels, "outcome"],
        )
        recorded = CounterMetricFamily(
            "embedrank_batch_lines_recorded", "Batch lines this process has recorded (rate: lines per second)"
        )
        recorded.add_metric([], self.worker.lines_done if self.worker is not None else 0)
        orphans = CounterMetricFamily(
            "embedrank_batch_orphans_removed",
            "Files without a row, and file rows without a file, this process removed from the Batch API's store",
        )
        orphans.add_metric([], self.worker.orphans_removed if self.worker is not None else 0)
        rows: list[BatchRow] = []
        if self._store is not None:
            try:
                rows = self._store.batches_in(*ACTIVE)
            except DatabaseUnavailableError as exc:  # the scrape still answers, without the batches' rows
                logger.warning("/metrics: the Batch API's database: %s", exc)
        unfinished.add_metric([], len(rows))
        if by_batch:
            for row in rows:
                waiting.add_metric([row.id], row.total - row.completed - row.failed)
                done.add_metric([row.id, "completed"], row.completed)
                done.add_metric([row.id, "failed"], row.failed)
        else:
            waiting.add_metric([], sum(row.total - row.completed - row.failed for row in rows))
            done.add_metric(["completed"], sum(row.completed for row in rows))
            done.add_metric(["failed"], sum(row.failed for row in rows))
        full = GaugeMetricFamily(
            "embedrank_batch_store_full_seconds",
            "How long the Batch API's store has been out of disk space, batches waiting (0: it has room)",
        )
        since = self.worker.room_wanted_since if self.worker is not None else None
        full.add_metric([], time.time() - since if since is not None else 0.0)
        yield from (unfinished, waiting, done, recorded, orphans, full)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self.run())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
