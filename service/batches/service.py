"""The Batch API's lifecycle: its store over the app's storage (opened on first use), the worker that runs its
batches, and the batches' progress for ``/metrics``."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator

from litestar.datastructures import State
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from embedrank.serving.pool import ModelPool
from service.batches.store import ACTIVE, SCHEMA, BatchRow, BatchStore, InputFiles, renamed_columns
from service.batches.worker import BatchWorker
from service.files.service import FileService
from service.settings import Settings
from service.storage.database import DatabaseUnavailableError
from service.storage.service import StorageService

logger = logging.getLogger("embedrank.service")


@dataclasses.dataclass(eq=False)  # a collector of the app's metrics registry: hashed by identity
class BatchService:
    """The batches of ``storage`` (their store opened on first use), their files in ``files``, and the worker that
    runs them on the models of ``pool_of``."""

    storage: StorageService
    files: FileService
    pool_of: Callable[[], ModelPool]
    _store: BatchStore | None = None
    worker: BatchWorker | None = None
    _opening: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.storage.register(SCHEMA, renamed_columns)
        self.files.users.append(InputFiles())  # a file is not deleted while a batch reads it

    @property
    def settings(self) -> Settings:
        return self.storage.settings

    def store(self) -> BatchStore:
        """The store, opened on first use (blocking: a PostgreSQL server is reached over the network).

        Raises:
            DatabaseUnavailableError: the database cannot be reached now.
        """
        with self._opening:
            if self._store is None:
                self._store = BatchStore(self.storage.open(), self.files.store())
        return self._store

    async def opened(self) -> BatchStore:
        """The store, opened in a worker thread the first time."""
        return self._store if self._store is not None else await asyncio.to_thread(self.store)

    async def run(self) -> None:
        """The worker, once the storage exists (:meth:`StorageService.reached`); until cancelled."""
        storage = await self.storage.reached()
        store = await self.opened()
        if not storage.shared:  # one host on its own store: a claim left by a crash cannot be live
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


def batches_of(state: State) -> BatchService:
    """The app's :class:`BatchService` (put in its state by :func:`service.app.create_app`)."""
    return state.batches  # type: ignore[no-any-return]
