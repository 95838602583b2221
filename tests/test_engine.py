"""The micro-batcher with a deterministic fake backend: batching across jobs, order, cancellation, overload."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from embedrank.engine import BatchEngine, EngineConfig, ItemResult
from embedrank.errors import InputTooLongError, InvalidInputError, NotReadyError, OverloadedError


class FakeBackend:
    """Value = text reversed; tokens = len(text); 'truncated' when longer than max_seq_length chars."""

    max_seq_length = 50

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()

    def item_chars(self, item: str) -> int:
        return len(item)

    def run_batch(self, items):
        self.gate.wait(5)
        time.sleep(self.delay)
        self.batches.append(list(items))
        return [ItemResult(t[::-1], min(len(t), 50), len(t) > 50) for t in items]


def test_batches_across_concurrent_jobs_and_keeps_order():
    async def main():
        backend = FakeBackend(delay=0.01)
        engine = BatchEngine(backend, EngineConfig(max_batch_size=64, max_wait_ms=5))
        engine.start()
        jobs = [[f"job{j}-item{i}" + "x" * (i * 3 % 7) for i in range(1 + j % 4)] for j in range(40)]
        results = await asyncio.gather(*(engine.submit(items) for items in jobs))
        for items, res in zip(jobs, results, strict=True):
            assert res.values == [t[::-1] for t in items]
            assert res.token_counts == [len(t) for t in items]
        assert len(backend.batches) < len(jobs)  # requests shared forward passes
        assert max(len(b) for b in backend.batches) > 4
        for b in backend.batches:  # each batch is sorted longest first
            assert [len(x) for x in b] == sorted((len(x) for x in b), reverse=True)
        await engine.drain(1)

    asyncio.run(main())


def test_token_budget_closes_batches():
    async def main():
        backend = FakeBackend()
        engine = BatchEngine(backend, EngineConfig(max_batch_tokens=40, max_wait_ms=5, chars_per_token=1))
        engine.start()
        await engine.submit(["a" * 18] * 6)  # est. 20 tokens each -> two per batch
        assert [len(b) for b in backend.batches] == [2, 2, 2]
        await engine.drain(1)

    asyncio.run(main())


def test_cancelled_jobs_are_dropped_before_compute():
    async def main():
        backend = FakeBackend()
        backend.gate.clear()  # hold the worker so the queue builds up
        engine = BatchEngine(backend, EngineConfig(max_batch_size=1, max_wait_ms=0, workers=1))
        engine.start()
        first = asyncio.ensure_future(engine.submit(["first"]))
        await asyncio.sleep(0.05)
        doomed = asyncio.ensure_future(engine.submit(["gone-1", "gone-2"]))
        kept = asyncio.ensure_future(engine.submit(["kept"]))
        await asyncio.sleep(0.01)
        doomed.cancel()
        backend.gate.set()
        assert (await first).values == ["tsrif"]
        assert (await kept).values == ["tpek"]
        computed = [x for b in backend.batches for x in b]
        assert "gone-1" not in computed and "gone-2" not in computed
        assert engine.stats.dropped == 2
        await engine.drain(1)

    asyncio.run(main())


def test_full_queue_raises_overload_and_oversized_job_is_invalid():
    async def main():
        backend = FakeBackend()
        backend.gate.clear()
        engine = BatchEngine(backend, EngineConfig(max_queue_items=3, max_batch_size=1, max_wait_ms=0, workers=1))
        engine.start()
        running = asyncio.ensure_future(engine.submit(["a"]))
        await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(engine.submit(["b", "c"]))
        await asyncio.sleep(0)
        with pytest.raises(OverloadedError, match="limit 3"):
            await engine.submit(["d", "e"])
        with pytest.raises(InvalidInputError, match="capacity of 3"):
            await engine.submit(["x"] * 4)
        backend.gate.set()
        await asyncio.gather(running, waiting)
        await engine.drain(1)
        with pytest.raises(NotReadyError):
            await engine.submit(["late"])

    asyncio.run(main())


def test_truncate_false_fails_only_that_job():
    async def main():
        engine = BatchEngine(FakeBackend(), EngineConfig(max_wait_ms=5))
        engine.start()
        strict = engine.submit(["y" * 60], truncate=False)
        lenient = engine.submit(["y" * 60], truncate=True)
        res = await asyncio.gather(strict, lenient, return_exceptions=True)
        assert isinstance(res[0], InputTooLongError)
        assert res[1].truncated == [True]
        await engine.drain(1)

    asyncio.run(main())


def test_backend_failure_fails_the_batch_not_the_engine():
    class Boom(FakeBackend):
        def run_batch(self, items):
            if "boom" in items:
                raise RuntimeError("kaput")
            return super().run_batch(items)

    async def main():
        engine = BatchEngine(Boom(), EngineConfig(max_wait_ms=0))
        engine.start()
        with pytest.raises(RuntimeError, match="kaput"):
            await engine.submit(["boom"])
        assert (await engine.submit(["ok"])).values == ["ko"]
        await engine.drain(1)

    asyncio.run(main())


def test_forward_thread_pulls_batches_while_the_event_loop_is_busy():
    async def main():
        backend = FakeBackend()
        backend.gate.clear()
        engine = BatchEngine(backend, EngineConfig(max_batch_size=1, max_wait_ms=0))
        engine.start()
        job = asyncio.ensure_future(engine.submit(["a", "b", "c"]))  # three one-item batches
        await asyncio.sleep(0.01)
        backend.gate.set()
        time.sleep(0.3)  # block the event loop: the forward thread must not need it between batches
        assert len(backend.batches) == 3
        assert (await job).values == ["a", "b", "c"]
        await engine.drain(1)

    asyncio.run(main())


def test_lone_caller_never_waits_and_the_wait_ends_when_arrivals_stop():
    async def main():
        backend = FakeBackend()
        engine = BatchEngine(backend, EngineConfig(max_wait_ms=400))
        engine.start()
        t0 = time.perf_counter()
        await engine.submit(["alone"])
        assert time.perf_counter() - t0 < 0.15  # no concurrency seen yet: no wait at all
        backend.gate.clear()
        burst = [asyncio.ensure_future(engine.submit([f"x{i}"])) for i in range(20)]
        await asyncio.sleep(0.05)
        backend.gate.set()
        await asyncio.gather(*burst)  # the engine now expects ~20 callers
        t0 = time.perf_counter()
        await engine.submit(["straggler"])
        # it waits for company, but gives up after half of max_wait_ms without arrivals, not the full 400 ms
        assert 0.15 < time.perf_counter() - t0 < 0.35
        await engine.drain(1)

    asyncio.run(main())


def test_drain_fails_jobs_that_could_not_be_computed_in_time():
    async def main():
        backend = FakeBackend()
        backend.gate.clear()
        engine = BatchEngine(backend, EngineConfig(max_batch_size=1, max_wait_ms=0))
        with pytest.raises(NotReadyError, match="not been started"):
            await engine.submit(["early"])
        engine.start()
        running = asyncio.ensure_future(engine.submit(["running"]))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(engine.submit(["queued"]))
        await asyncio.sleep(0)
        await engine.drain(0.1)
        with pytest.raises(NotReadyError, match="shut down"):
            await queued
        backend.gate.set()
        assert (await running).values == ["gninnur"]

    asyncio.run(main())
