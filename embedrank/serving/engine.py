"""An asyncio micro-batcher between many concurrent callers and one model.

Each call (a "job") gets its own future. Its items (texts, or query/document pairs) join a fair queue
(:mod:`embedrank.serving.scheduler`: the job with the least work left is served next, so a 1-text request
waits for at most the batch in flight even behind a 1,024-passage one; a job passed over too often gets its turn; an
optional ``priority`` goes first). Forward threads pull their next batch themselves the moment they finish
one (no event-loop turn sits between two forward passes). A batch closes when the next item would push
the padded cost (longest sequence x batch size, counted from the items, which are tokenized when submitted)
over the batch budget (:meth:`BatchEngine.batch_tokens`: what the measured speed computes in
``target_batch_seconds``, capped by ``max_batch_tokens``),
when ``max_batch_size`` is reached, or (with ``max_wait_ms`` > 0, off by default) when the queue holds about
as many items as were recently in flight. That last wait lasts at most ``max_wait_ms``, ends sooner when
arrivals stop, and never happens for a lone caller. ``workers`` > 1 runs several forward threads and splits the torch threads between
them. The event loop only queues items and resolves futures, so it keeps accepting requests while the
model computes. Items of jobs whose caller has gone (cancelled future) are dropped before compute. A
full queue raises :class:`~embedrank.errors.OverloadedError`.

The engine knows nothing of HTTP or of models: it takes a :class:`BatchModel` whose ``run_batch(items)``
returns a :class:`~embedrank.types.ModelOutput`, and answers each job with one in the job's input order.
The model runners that use it are in :mod:`embedrank.serving.runners`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import torch

from embedrank.errors import InvalidInputError, NotReadyError, OverloadedError
from embedrank.serving import tracing
from embedrank.serving.scheduler import FairQueue, QueuedJob
from embedrank.types import ModelOutput

Item = TypeVar("Item")
Item_contra = TypeVar("Item_contra", contravariant=True)


class BatchModel(Protocol[Item_contra]):
    """One model as the engine sees it: a batch of items in, a :class:`~embedrank.types.ModelOutput` out."""

    max_seq_length: int

    def run_batch(self, items: Sequence[Item_contra]) -> ModelOutput: ...

    def item_tokens(self, item: Item_contra) -> int:
        """The tokens ``item`` costs in a batch (items are tokenized when they are submitted)."""
        ...


@dataclasses.dataclass(eq=False, kw_only=True)
class _Job(QueuedJob):
    items: list[Any]
    future: asyncio.Future[ModelOutput]
    values: list[Any]
    token_counts: list[int]
    truncated: list[bool]
    remaining: int  # items whose results have not arrived
    trace: tracing.Queued | None = None  # its context and submission time, when it is traced

    def output(self) -> ModelOutput:
        return ModelOutput(np.stack([np.asarray(v) for v in self.values]), self.token_counts, self.truncated)


CPU_BATCH_TOKENS = 8192  # EngineConfig.max_batch_tokens when unset
CPU_BATCH_SIZE = 128  # EngineConfig.max_batch_size when unset


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    max_batch_tokens: int | None = None  # the most padded tokens per forward pass, whatever the device's speed;
    # None: CPU_BATCH_TOKENS (a model served on a GPU gets what its memory holds: HostedModel.start)
    target_batch_seconds: float | None = 0.25  # a batch holds the tokens the measured speed computes in about
    # this long (at least one max-length item, at most max_batch_tokens): it bounds how long a new request
    # waits for the batch in flight on any CPU, where a fixed token budget takes twice as long on a CPU half as
    # fast (eval/benchmarks/fairness.py). None: always max_batch_tokens
    max_batch_size: int | None = None  # items per forward pass, at most; None: CPU_BATCH_SIZE (on a GPU, more)
    max_wait_ms: float = 0.0  # upper bound of the adaptive wait; 0: none. Measured on 2 cores (32 closed-loop
    # clients x 1 query, OpenVINO fp32 and int8): waiting 20 ms for callers to rejoin gave bigger batches but
    # left the forward thread idle 16-33% of the time; without it the load splits into two pipelined halves,
    # the thread stays busy, and throughput rose 4-14% with a lower p99 (eval/benchmarks/service.py)
    max_queue_items: int = 8192
    max_queue_seconds: float = 30.0  # a job whose estimated wait for its first batch is longer is refused
    # (OverloadedError, Retry-After: when that wait would be short enough); its own compute time does not count
    workers: int | None = None  # forward threads (default 1: on few cores, concurrent OpenMP teams
    # spin against each other and lose throughput; measured in eval/benchmarks/service.py, and two OpenVINO
    # streams of one core each, one per thread, split 32 one-query clients into batches of ~7 and lost 4-8%)
    threads: int | None = None  # torch threads, split evenly between the workers; default torch's
    idle_seconds: float = 30.0  # after this long without work, a forward thread calls on_idle once


@dataclasses.dataclass(frozen=True, slots=True)
class BatchReport:
    """One finished batch: its items, estimated padded tokens, real tokens and compute seconds."""

    items: int
    padded_tokens: int
    tokens: int
    seconds: float


class BatchEngine(Generic[Item]):
    """Cross-request micro-batching for one batch model. Create and start it inside a running event loop.

    The event loop only queues items and hands results back; the forward threads pull their next batch
    themselves the moment they finish one, so no event-loop turn sits between two forward passes.
    """

    def __init__(
        self,
        model: BatchModel[Item],
        config: EngineConfig | None = None,
        *,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_idle: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.config = config or EngineConfig()
        # the bounds of a forward pass; what the config leaves unset, the CPU's
        self.max_batch_tokens: int = self.config.max_batch_tokens or CPU_BATCH_TOKENS
        self.max_batch_size: int = self.config.max_batch_size or CPU_BATCH_SIZE
        self.on_batch = on_batch  # called on the event loop after each forward pass
        self.on_idle = on_idle  # called in a forward thread once work stopped for config.idle_seconds
        self._busy_since_idle = False
        self.clock = clock  # what the adaptive wait and batch times are measured with (tests inject a fake one)
        self.dropped = 0  # queued items skipped because their caller had gone
        self._cond = threading.Condition()  # guards _queue, _computing, _peak_inflight, _stopping
        self._queue = FairQueue(short_tokens=model.max_seq_length // 2)  # up to half the max length is short
        self._computing = 0  # items in forward passes right now
        self._computing_tokens = 0  # their estimated tokens
        self.token_rate = 0.0  # estimated tokens computed per second (moving average; 0 until measured)
        self.last_work = clock()  # when the last forward pass ended (or the engine was made)
        self.rate_of_full = False  # whether a full batch has measured token_rate (only then may it refuse work)
        self._peak_inflight = 0.0  # decaying maximum of items in flight
        self._stopping = False
        self._closing = False  # refuse new jobs (drain started)
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inflight_items = 0
        self._inflight_jobs = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the forward threads; results are delivered on the running event loop."""
        if self._threads:
            return
        self._loop = asyncio.get_running_loop()
        workers = self.config.workers or 1
        threads = max(1, (self.config.threads or torch.get_num_threads()) // workers)
        for k in range(workers):
            thread = threading.Thread(target=self._work, args=(threads,), name=f"embedrank-forward-{k}", daemon=True)
            thread.start()
            self._threads.append(thread)

    async def drain(self, timeout: float = 30.0) -> None:
        """Refuse new jobs, finish the ones in flight (up to ``timeout`` seconds), then stop.

        Jobs still queued after ``timeout`` fail with :class:`~embedrank.errors.NotReadyError`.
        """
        self._closing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        with self._cond:
            self._stopping = True
            left = self._queue.clear()
            self._cond.notify_all()
        for job in left:
            assert isinstance(job, _Job)
            if not job.future.done():
                job.future.set_exception(NotReadyError("the service shut down before this request was computed"))
        for thread in self._threads:
            await asyncio.to_thread(thread.join, timeout)

    def idle_for(self) -> float:
        """Seconds since the engine last had work: 0 while items wait or are computed."""
        with self._cond:
            return 0.0 if self._queue.queued or self._computing else self.clock() - self.last_work

    @property
    def queue_depth(self) -> int:
        """Items waiting to be scheduled."""
        return self._queue.queued

    # -- submission (event loop) -------------------------------------------------------------------
    async def submit(self, items: Sequence[Item], *, priority: int = 0) -> ModelOutput:
        """Queue ``items`` as one job and wait for all their results (in input order).

        Jobs with a lower ``priority`` are scheduled first (default 0; negative is more urgent). Over-long
        inputs are the caller's to refuse before submitting (the runners do, when truncation is off);
        here they are truncated and flagged.
        """
        if self._closing:
            raise NotReadyError("the service is shutting down; retry on another instance")
        if not self._threads:
            raise NotReadyError("the batching engine has not been started")
        if len(items) > self.config.max_queue_items:
            raise InvalidInputError(
                f"{len(items)} items in one request exceed the engine queue capacity of {self.config.max_queue_items}; "
                f"split the request"
            )
        future: asyncio.Future[ModelOutput] = asyncio.get_running_loop().create_future()
        n = len(items)
        job = _Job(
            est=[self._estimate_tokens(item) for item in items],
            priority=priority,
            items=list(items),
            future=future,
            values=[None] * n,
            token_counts=[0] * n,
            truncated=[False] * n,
            remaining=n,
            trace=tracing.queued(),
        )
        with self._cond:
            if self._queue.queued + n > self.config.max_queue_items:
                raise OverloadedError(
                    f"engine queue is full ({self._queue.queued} items waiting, limit {self.config.max_queue_items}); "
                    f"retry shortly",
                    retry_after=1.0,
                )
            self._admit_by_wait(priority, sum(job.est))
            self._queue.push(job)
            self._inflight_items += len(items)
            self._peak_inflight = max(self._peak_inflight, float(self._inflight_items))
            self._cond.notify()
        self._inflight_jobs += 1
        self._idle.clear()
        try:
            return await future
        finally:
            self._inflight_jobs -= 1
            with self._cond:
                self._inflight_items -= len(items)
            if self._inflight_jobs == 0:
                self._idle.set()

    def estimated_wait(self, priority: int, work: int) -> float:
        """Seconds until a new job of ``priority`` and ``work`` estimated tokens would get its first batch:
        the batch in flight plus the queued work scheduled before it (:meth:`FairQueue.work_ahead`), at
        the measured rate. 0 until a full batch has been measured (:func:`next_rate`). Call under ``self._cond``."""
        if not self.rate_of_full:
            return 0.0
        return (self._computing_tokens + self._queue.work_ahead(priority, work)) / self.token_rate

    def _wait_bound(self) -> float:
        """An upper bound of :meth:`estimated_wait` for any job: all queued work ahead (under ``self._cond``)."""
        return 0.0 if not self.rate_of_full else (self._computing_tokens + self._queue.work) / self.token_rate

    def _admit_by_wait(self, priority: int, work: int) -> None:
        """Refuse a job that would wait longer than ``max_queue_seconds`` for its first batch, with the
        time after which it would not (under ``self._cond``). A small job is refused only when the work
        ahead of *it* is too long; a bulk job queued behind other bulk work is refused first."""
        limit = self.config.max_queue_seconds
        if self._wait_bound() <= limit:  # all the queued work fits: no need to order it
            return
        wait = self.estimated_wait(priority, work)
        if wait > limit:
            raise OverloadedError(
                f"the engine is overloaded: this request would wait about {wait:.0f} s for its first batch "
                f"(limit {limit:g} s); retry later",
                retry_after=min(60.0, max(1.0, wait - limit)),
            )

    # -- batching (forward threads, under self._cond) ----------------------------------------------
    def _estimate_tokens(self, item: Item) -> int:
        return min(self.model.item_tokens(item), self.model.max_seq_length)

    def batch_tokens(self) -> int:
        """The padded-token budget of the next batch: what the measured speed computes in
        ``target_batch_seconds``, between one max-length item and ``max_batch_tokens`` (the cap until a
        batch has been measured)."""
        cap, target = self.max_batch_tokens, self.config.target_batch_seconds
        if not target or self.token_rate <= 0:
            return cap
        return max(min(self.model.max_seq_length, cap), min(cap, int(self.token_rate * target)))

    def _take_batch(self, budget: int) -> list[tuple[_Job, int]]:
        """Pop the next batch of live items (:class:`~embedrank.serving.scheduler.FairQueue`) within ``budget``
        padded tokens, longest first."""
        self.dropped += self._queue.drop(lambda job: job.future.done())  # type: ignore[attr-defined]
        batch = self._queue.take(max_tokens=budget, max_size=self.max_batch_size)
        jobs: list[tuple[_Job, int]] = batch  # type: ignore[assignment]
        jobs.sort(key=lambda ji: -self.model.item_tokens(ji[0].items[ji[1]]))
        return jobs

    def _wait_for_company(self) -> None:
        """Under concurrent load, wait until about as many items are queued as recently were in flight
        (minus those being computed), so callers whose answers just went out rejoin this batch instead of
        splitting the load into small batches: each forward pass streams all the weights once (~8 ms for
        MiniLM on 2 cores), so small batches waste it. The wait ends after ``max_wait_ms``, or sooner
        when no item arrived for half of it. A lone caller never waits."""
        if self.config.max_wait_ms <= 0:
            return
        target = min(
            int((self._peak_inflight - self._computing) * 0.9),
            self.max_batch_size,
            self.batch_tokens() // max(1, self._queue.head_estimate()),
        )
        gap = self.config.max_wait_ms / 2000
        deadline = self.clock() + self.config.max_wait_ms / 1000
        while self._queue.queued and self._queue.queued < target and not self._stopping:
            remaining = min(deadline - self.clock(), gap)
            if remaining <= 0:
                break
            queued = self._queue.queued
            self._timed_wait(remaining)
            if self._queue.queued <= queued:  # nothing arrived: the rest of the load is not coming back soon
                break

    def _timed_wait(self, seconds: float) -> None:
        """Wait on the queue's condition for at most ``seconds`` (under ``self._cond``)."""
        self._cond.wait(seconds)

    def _next_batch(self) -> tuple[list[tuple[_Job, int]], bool] | None:
        """Block until a batch is ready: the batch, and whether it fills at least half the token budget or
        all of ``max_batch_size`` (its speed is the engine's, not one forward pass's fixed cost); ``None``
        once the engine stops, ``([], False)`` after ``idle_seconds`` without work (once per quiet period,
        only when ``on_idle`` is set)."""
        with self._cond:
            while True:
                while not self._queue.queued and not self._stopping:
                    if self.on_idle is None or not self._busy_since_idle:
                        self._cond.wait()
                    elif not self._cond.wait(self.config.idle_seconds) and not self._queue.queued:
                        self._busy_since_idle = False
                        return [], False  # quiet for idle_seconds: the caller runs on_idle
                if self._stopping:
                    return None
                self._wait_for_company()
                budget = self.batch_tokens()
                batch = self._take_batch(budget)
                if batch:
                    self._busy_since_idle = True
                    self._computing += len(batch)
                    self._computing_tokens += sum(job.est[i] for job, i in batch)
                    return batch, 2 * _padded(batch) >= budget or len(batch) >= self.max_batch_size

    def _work(self, threads: int) -> None:
        """Forward-thread body: pull a batch, run it, hand the outcome to the event loop, repeat."""
        if torch.get_num_threads() != threads:  # per OS thread
            torch.set_num_threads(threads)
        assert self._loop is not None
        while (taken := self._next_batch()) is not None:
            batch, full = taken
            if not batch:
                if self.on_idle is not None:
                    self.on_idle()
                continue
            start = self.clock()
            tokens = sum(job.est[i] for job, i in batch)
            began_ns = _began(batch) if tracing.tracer() is not None else 0  # the spans: on the event loop
            outcome: ModelOutput | Exception
            try:
                outcome = self.model.run_batch([job.items[i] for job, i in batch])
            except Exception as exc:  # a model failure fails the jobs of this batch, not the engine
                outcome = exc
            seconds = self.clock() - start
            span = (began_ns, time.time_ns(), tokens) if began_ns else None
            with self._cond:
                self._computing -= len(batch)
                self._computing_tokens -= tokens
                self.last_work = self.clock()
                if seconds > 0 and not isinstance(outcome, Exception):
                    self.token_rate = next_rate(self.token_rate, tokens / seconds, full=full)
                    self.rate_of_full = self.rate_of_full or full
            try:
                self._loop.call_soon_threadsafe(self._deliver, batch, outcome, seconds, span)
            except RuntimeError:  # the event loop is closed: nobody is waiting any more
                return

    # -- results (event loop) ----------------------------------------------------------------------
    def _deliver(
        self,
        batch: list[tuple[_Job, int]],
        outcome: ModelOutput | Exception,
        seconds: float,
        span: tuple[int, int, int] | None = None,
    ) -> None:
        """Hand a forward pass's ``outcome`` to the jobs of ``batch``; with ``span`` (its start and end in ns and its
        estimated tokens, while tracing is on), record its spans first."""
        if span is not None:
            began_ns, ended_ns, tokens = span
            traced = list({id(job.trace): job.trace for job, _ in batch if job.trace is not None}.values())
            attributes = {
                "embedrank.batch.items": len(batch),
                "embedrank.batch.padded_tokens": _padded(batch),
                "embedrank.batch.tokens": tokens,
            }
            error = outcome if isinstance(outcome, Exception) else None
            tracing.forward(traced, attributes, began_ns, ended_ns, error)
        if isinstance(outcome, Exception):
            for job in {id(j): j for j, _ in batch}.values():
                if not job.future.done():
                    job.future.set_exception(outcome)
            return
        for row, (job, i) in enumerate(batch):
            if job.future.done():
                continue
            job.values[i] = outcome.values[row]
            job.token_counts[i] = outcome.token_counts[row]
            job.truncated[i] = outcome.truncated[row]
            job.remaining -= 1
            if job.remaining == 0:
                try:
                    job.future.set_result(job.output())
                except Exception as exc:  # values that do not stack: fail the job, never leave it waiting
                    job.future.set_exception(exc)
        with self._cond:
            self._peak_inflight *= 0.9  # forget old load slowly; submit() raises it again
        if self.on_batch is not None:
            self.on_batch(
                BatchReport(
                    items=len(batch), padded_tokens=_padded(batch), tokens=outcome.total_tokens, seconds=seconds
                )
            )


def next_rate(estimate: float, measured: float, *, full: bool) -> float:
    """The engine's token rate after a batch computed at ``measured`` tokens/s: a moving average (0.3 of the new
    batch) of the batches that filled their budget (``full``). A smaller batch is mostly a forward pass's fixed
    cost (about 3 ms on a GPU, whatever its size: 14 tokens of a lone query measure under 5,000 tokens/s where a
    full batch computes 1.6 million), so it only raises the estimate, never lowers it: queries arriving one by
    one would otherwise drag the rate down until the next bulk request's estimated wait exceeded
    ``max_queue_seconds`` and it was refused, and its batches shrank to the lone queries' size. 0 stands for
    "not measured yet": the first batch sets it, full or not, so a bulk request's first batches are sized by a
    measured speed (the engine refuses work for its estimated wait only once a full batch has measured it)."""
    if estimate <= 0:
        return measured
    if full or measured > estimate:
        return 0.7 * estimate + 0.3 * measured
    return estimate


def _began(batch: list[tuple[_Job, int]]) -> int:
    """Now, in ns, noted as the start of its first forward pass on each traced job of ``batch`` that had none."""
    now = time.time_ns()
    for job, _ in batch:
        if job.trace is not None and not job.trace.began_ns:
            job.trace.began_ns = now
    return now


def _padded(batch: list[tuple[_Job, int]]) -> int:
    """A batch's estimated padded tokens: its longest item's estimate times its items."""
    return max(job.est[i] for job, i in batch) * len(batch)
