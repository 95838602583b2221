"""The micro-batcher with a deterministic fake model: batching across jobs, order, cancellation, overload,
and the runners' checks before the queue. Threads are ordered with events and an injected clock, never
with sleeps or wall-clock windows."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from embedrank.errors import InputTooLongError, InvalidInputError, NotReadyError, OverloadedError
from embedrank.serving.engine import BatchEngine, EngineConfig
from embedrank.serving.options import EmbedOptions, RerankOptions
from embedrank.serving.runners import AsyncCrossEncoder, AsyncEncoder
from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder
from embedrank.types import ModelOutput

WAIT = 10.0  # seconds an event may take before the test fails; never reached when the engine is right


class FakeBatchModel:
    """Value = text reversed; tokens = len(text) capped at 50; 'truncated' when longer than 50 chars.

    ``gate`` holds every batch until set; ``entered`` is set once a batch has started.
    """

    max_seq_length = 50

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.three_done = threading.Event()

    def item_tokens(self, item: str) -> int:
        return len(item)

    def run_batch(self, items):
        self.entered.set()
        assert self.gate.wait(WAIT)
        self.batches.append(list(items))
        if len(self.batches) == 3:
            self.three_done.set()
        return ModelOutput(
            np.array([t[::-1] for t in items]), [min(len(t), 50) for t in items], [len(t) > 50 for t in items]
        )


async def _entered(model: FakeBatchModel) -> None:
    assert await asyncio.to_thread(model.entered.wait, WAIT)


def test_batches_across_concurrent_jobs_and_keeps_order():
    async def main():
        model = FakeBatchModel()
        model.gate.clear()  # the first batch holds the worker while every other job queues
        # batches sized by tokens only: a measured speed (the gated first batch's) must not shape them
        engine = BatchEngine(model, EngineConfig(max_batch_size=128, max_wait_ms=0, target_batch_seconds=None))
        engine.start()
        jobs = [[f"job{j}-item{i}" + "x" * (i * 3 % 7) for i in range(1 + j % 4)] for j in range(40)]
        first = asyncio.ensure_future(engine.submit(jobs[0]))
        await _entered(model)
        rest = [asyncio.ensure_future(engine.submit(items)) for items in jobs[1:]]
        await asyncio.sleep(0)  # every submit has queued its items
        model.gate.set()
        results = [await first, *await asyncio.gather(*rest)]
        for items, res in zip(jobs, results, strict=True):
            assert res.values.tolist() == [t[::-1] for t in items]
            assert res.token_counts == [len(t) for t in items]
        assert len(model.batches) == 2  # the 39 queued jobs (99 items) shared one forward pass
        for b in model.batches:  # each batch is sorted longest first
            assert [len(x) for x in b] == sorted((len(x) for x in b), reverse=True)
        await engine.drain(1)

    asyncio.run(main())


def test_token_budget_closes_batches():
    async def main():
        model = FakeBatchModel()
        engine = BatchEngine(model, EngineConfig(max_batch_tokens=40, max_wait_ms=0, target_batch_seconds=None))
        engine.start()
        await engine.submit(["a" * 18] * 6)  # est. 20 tokens each -> two per batch
        assert [len(b) for b in model.batches] == [2, 2, 2]
        await engine.drain(1)

    asyncio.run(main())


def test_cancelled_jobs_are_dropped_before_compute():
    async def main():
        model = FakeBatchModel()
        model.gate.clear()  # hold the worker so the queue builds up
        engine = BatchEngine(model, EngineConfig(max_batch_size=1, max_wait_ms=0, workers=1))
        engine.start()
        first = asyncio.ensure_future(engine.submit(["first"]))
        await _entered(model)
        doomed = asyncio.ensure_future(engine.submit(["gone-1", "gone-2"]))
        kept = asyncio.ensure_future(engine.submit(["kept"]))
        await asyncio.sleep(0)
        doomed.cancel()
        model.gate.set()
        assert (await first).values.tolist() == ["tsrif"]
        assert (await kept).values.tolist() == ["tpek"]
        computed = [x for b in model.batches for x in b]
        assert "gone-1" not in computed and "gone-2" not in computed
        assert engine.dropped == 2
        await engine.drain(1)

    asyncio.run(main())


def test_full_queue_raises_overload_and_oversized_job_is_invalid():
    async def main():
        model = FakeBatchModel()
        model.gate.clear()
        engine = BatchEngine(model, EngineConfig(max_queue_items=3, max_batch_size=1, max_wait_ms=0, workers=1))
        engine.start()
        running = asyncio.ensure_future(engine.submit(["a"]))
        await _entered(model)
        waiting = asyncio.ensure_future(engine.submit(["b", "c"]))
        await asyncio.sleep(0)
        with pytest.raises(OverloadedError, match="limit 3"):
            await engine.submit(["d", "e"])
        with pytest.raises(InvalidInputError, match="capacity of 3"):
            await engine.submit(["x"] * 4)
        model.gate.set()
        await asyncio.gather(running, waiting)
        await engine.drain(1)
        with pytest.raises(NotReadyError):
            await engine.submit(["late"])

    asyncio.run(main())


def test_overload_is_judged_by_each_jobs_estimated_wait():
    """429 when the work scheduled before a job (at the measured speed) exceeds max_queue_seconds: a bulk
    job behind another bulk job is refused with the time to wait; a small job or an urgent one is not."""

    class Timed(FakeBatchModel):
        def run_batch(self, items):  # every forward pass takes exactly 1 s of the injected clock
            out = super().run_batch(items)
            now[0] += 1.0
            return out

    now = [0.0]

    async def main():
        model = Timed()
        config = EngineConfig(max_batch_size=1, max_wait_ms=0, max_queue_seconds=30)
        engine = BatchEngine(model, config, clock=lambda: now[0])
        engine.start()
        text = "x" * 11  # the fake model's items cost their length: 11 tokens
        await engine.submit([text])
        assert engine.token_rate == pytest.approx(11.0)  # 11 tokens per second
        model.gate.clear()
        model.entered.clear()
        running = asyncio.ensure_future(engine.submit([text]))  # in flight: 1 s
        await _entered(model)
        first_bulk = asyncio.ensure_future(engine.submit([text] * 40))  # waits 1 s: admitted
        await asyncio.sleep(0)
        with pytest.raises(OverloadedError, match="about 41 s") as info:  # 1 s + 40 s of the first bulk
            await engine.submit([text] * 40)
        assert info.value.retry_after == pytest.approx(11.0)  # 41 s - 30 s
        small = asyncio.ensure_future(engine.submit([text]))  # goes before the bulk job: admitted
        urgent = asyncio.ensure_future(engine.submit([text] * 40, priority=-1))  # before everything
        await asyncio.sleep(0)
        model.gate.set()
        await asyncio.gather(running, first_bulk, small, urgent)
        await engine.drain(1)

    asyncio.run(main())


def test_backend_failure_fails_the_batch_not_the_engine():
    class Boom(FakeBatchModel):
        def run_batch(self, items):
            if "boom" in items:
                raise RuntimeError("kaput")
            return super().run_batch(items)

    async def main():
        engine = BatchEngine(Boom(), EngineConfig(max_wait_ms=0))
        engine.start()
        with pytest.raises(RuntimeError, match="kaput"):
            await engine.submit(["boom"])
        assert (await engine.submit(["ok"])).values.tolist() == ["ko"]
        await engine.drain(1)

    asyncio.run(main())


def test_values_that_do_not_stack_fail_the_job_instead_of_leaving_it_waiting():
    class Ragged(FakeBatchModel):
        def run_batch(self, items):  # a value per item of a different shape each: np.stack refuses them
            values = np.empty(len(items), dtype=object)
            values[:] = [np.zeros(len(t)) for t in items]
            return ModelOutput(values, [len(t) for t in items], [False] * len(items))

    async def main():
        engine = BatchEngine(Ragged(), EngineConfig(max_wait_ms=0))
        engine.start()
        with pytest.raises(ValueError):
            await asyncio.wait_for(engine.submit(["a", "bcd"]), WAIT)
        assert (await engine.submit(["ab"])).values.shape == (1, 2)
        await engine.drain(1)

    asyncio.run(main())


def test_forward_thread_pulls_batches_while_the_event_loop_is_blocked():
    async def main():
        model = FakeBatchModel()
        model.gate.clear()
        engine = BatchEngine(model, EngineConfig(max_batch_size=1, max_wait_ms=0))
        engine.start()
        job = asyncio.ensure_future(engine.submit(["a", "b", "c"]))  # three one-item batches
        await _entered(model)
        model.gate.set()
        # block the event loop until all three batches ran: the forward thread must not need it in between
        assert model.three_done.wait(WAIT)
        assert (await job).values.tolist() == ["a", "b", "c"]
        await engine.drain(1)

    asyncio.run(main())


class FakeClockEngine(BatchEngine):
    """Records each timed wait and moves a fake clock past it instead of sleeping."""

    def __init__(self, *args, **kwargs) -> None:
        self.now = 0.0
        self.waits: list[float] = []
        super().__init__(*args, clock=lambda: self.now, **kwargs)

    def _timed_wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def test_lone_caller_never_waits_and_the_wait_ends_when_arrivals_stop():
    async def main():
        model = FakeBatchModel()
        engine = FakeClockEngine(model, EngineConfig(max_wait_ms=400))
        engine.start()
        await engine.submit(["alone"])
        assert engine.waits == []  # no concurrency seen yet: no wait at all
        model.gate.clear()
        model.entered.clear()
        burst = [asyncio.ensure_future(engine.submit([f"x{i}"])) for i in range(20)]
        await asyncio.sleep(0)
        model.gate.set()
        await asyncio.gather(*burst)  # the engine now expects ~20 callers
        engine.waits.clear()
        await engine.submit(["straggler"])
        # it waits for company once, for half of max_wait_ms, and gives up when nobody came: not 400 ms
        assert engine.waits == [pytest.approx(0.2)]
        await engine.drain(1)

    asyncio.run(main())


def test_drain_fails_jobs_that_could_not_be_computed_in_time():
    async def main():
        model = FakeBatchModel()
        model.gate.clear()
        engine = BatchEngine(model, EngineConfig(max_batch_size=1, max_wait_ms=0))
        with pytest.raises(NotReadyError, match="not been started"):
            await engine.submit(["early"])
        engine.start()
        running = asyncio.ensure_future(engine.submit(["running"]))
        await _entered(model)
        queued = asyncio.ensure_future(engine.submit(["queued"]))
        await asyncio.sleep(0)
        await engine.drain(0)
        with pytest.raises(NotReadyError, match="shut down"):
            await queued
        model.gate.set()
        assert (await running).values.tolist() == ["gninnur"]

    asyncio.run(main())


class CountingEncoder(FakeEncoder):
    def __init__(self) -> None:
        super().__init__(max_seq_length=8)
        self.batches = 0

    def encode_batch(self, texts):
        self.batches += 1
        return super().encode_batch(texts)


def test_truncate_false_is_refused_before_the_queue_naming_field_and_index():
    long = "w " * 20

    async def main():
        encoder = CountingEncoder()
        runner = AsyncEncoder(encoder, EngineConfig(max_wait_ms=0))
        runner.engine.start()
        with pytest.raises(InputTooLongError) as info:
            await runner.embed(["ok", "fine", long], EmbedOptions(truncate=False))
        assert (info.value.param, info.value.index) == ("input", 2) and "input[2]" in str(info.value)
        with pytest.raises(InputTooLongError) as info:
            await runner.rerank("q", ["ok", long], RerankOptions(truncate=False))
        assert (info.value.param, info.value.index) == ("documents", 1) and "documents[1]" in str(info.value)
        with pytest.raises(InputTooLongError) as info:
            await runner.rerank(long, ["ok"], RerankOptions(truncate=False))
        assert (info.value.param, info.value.index) == ("query", 0)
        assert encoder.batches == 0  # nothing reached the model
        lenient = await runner.embed(["ok", long])
        assert lenient.truncated == [False, True] and lenient.token_counts == [3, 8]
        with pytest.raises(InvalidInputError) as info:
            await runner.embed(["ok"], EmbedOptions(dimensions=0))
        assert info.value.param == "dimensions"

        scorer = AsyncCrossEncoder(FakeCrossEncoder(max_seq_length=10), EngineConfig(max_wait_ms=0))
        scorer.engine.start()
        with pytest.raises(InputTooLongError) as info:
            await scorer.rerank("q", ["a", "b", long], RerankOptions(truncate=False))
        assert (info.value.param, info.value.index) == ("documents", 2)
        out = await scorer.rerank("red apple", ["an apple", long])
        assert out.values.tolist() == [0.5, 0.0] and out.truncated == [False, True]
        await runner.engine.drain(1)
        await scorer.engine.drain(1)

    asyncio.run(main())


def test_bi_encoder_rerank_is_the_cosine_of_the_encoder_vectors():
    async def main():
        encoder = FakeEncoder()
        runner = AsyncEncoder(encoder, EngineConfig(max_wait_ms=0))
        runner.engine.start()
        docs = ["red apple pie", "blue sky", "apple"]
        out = await runner.rerank("apple", docs)
        vectors = encoder.encode(["apple", *docs])
        np.testing.assert_allclose(out.values, vectors[1:] @ vectors[0], atol=1e-6)
        assert out.token_counts == encoder.count_tokens(["apple", *docs])
        short = await runner.embed(docs, EmbedOptions(dimensions=8))
        full = vectors[1:, :8]
        expected = full / np.maximum(np.linalg.norm(full, axis=1, keepdims=True), 1e-12)
        np.testing.assert_allclose(short.values, expected, atol=1e-6)
        await runner.engine.drain(1)

    asyncio.run(main())


def test_a_new_request_waits_only_for_the_batch_in_flight():
    async def main():
        model = FakeBatchModel()
        model.gate.clear()
        config = EngineConfig(max_batch_tokens=200, max_wait_ms=0, target_batch_seconds=None)
        engine = BatchEngine(model, config)  # 4 long items per batch
        engine.start()
        bulk = asyncio.ensure_future(engine.submit([f"{i:02d}" + "p" * 400 for i in range(20)]))
        await _entered(model)  # the first bulk batch is computing
        small = asyncio.ensure_future(engine.submit(["hi"]))
        await asyncio.sleep(0)
        model.gate.set()
        assert (await small).values.tolist() == ["ih"]
        await bulk
        assert [len(b) for b in model.batches] == [4, 1, 4, 4, 4, 4]
        assert model.batches[1] == ["hi"]  # right after the batch in flight, on its own
        await engine.drain(1)

    asyncio.run(main())


@pytest.mark.slow  # the real packaged model
def test_start_side_truncation_and_unnormalized_vectors_on_the_real_model(encoder, st_model):
    """``truncation_side="left"`` keeps a text's last tokens (what fits beside the prompt and special tokens),
    checked against sentence-transformers with its tokenizer truncating on the left; ``normalize=False`` is
    the pooled vector before the model's Normalize module, as sentence-transformers' first two modules give."""
    import torch

    long = " ".join(
        f"sentence {i} talks about topic {i % 7} and its unusual-hyphenated, punctuated details." for i in range(60)
    )
    texts = [long, "a short text", "naïve café — 東京 " * 80]

    async def main():
        runner = AsyncEncoder(encoder, EngineConfig(max_wait_ms=0))
        runner.engine.start()
        left = await runner.embed(texts, EmbedOptions(truncation_side="left"))
        right = await runner.embed(texts)
        raw = await runner.embed(texts, EmbedOptions(normalize=False))
        await runner.engine.drain(1)
        return left, right, raw

    left, right, raw = asyncio.run(main())
    assert left.truncated == right.truncated == [True, False, True]
    assert encoder.max_seq_length - 3 <= left.token_counts[0] <= encoder.max_seq_length  # fills the window
    st_model.tokenizer.truncation_side = "left"
    try:
        expected = st_model.encode(texts, convert_to_numpy=True)
    finally:
        st_model.tokenizer.truncation_side = "right"
    cosines = np.sum(left.values * expected, axis=1)
    # the cut text is tokenized again, so a word cut at the new start is read as a word, not as its last
    # word pieces as the tokenizer's own left truncation keeps them: a token or two differ
    assert cosines.min() > 0.99, cosines
    assert np.sum(left.values[0] * right.values[0]) < 0.99  # the other end of the text
    with torch.inference_mode():
        features = st_model.tokenize(texts)
        pooled = st_model[1](st_model[0](features))["sentence_embedding"].numpy()
    np.testing.assert_allclose(raw.values, pooled, atol=2e-4)
    np.testing.assert_allclose(np.linalg.norm(right.values, axis=1), 1.0, atol=1e-6)


def test_raw_scores_are_refused_for_several_labels():
    class ThreeLabels(FakeCrossEncoder):
        num_labels = 3

    async def main():
        scorer = AsyncCrossEncoder(ThreeLabels(max_seq_length=10), EngineConfig(max_wait_ms=0))
        scorer.engine.start()
        with pytest.raises(InvalidInputError) as info:
            await scorer.rerank("q", ["a"], RerankOptions(raw_scores=True))
        assert info.value.param == "raw_scores" and "several labels" in str(info.value)
        assert (await scorer.rerank("q", ["q"])).values.tolist() == [1.0]
        await scorer.engine.drain(1)

    asyncio.run(main())


def test_batches_are_sized_by_the_measured_speed():
    """With ``target_batch_seconds``, a batch holds what the measured speed computes in that time: the same
    wait for the batch in flight on a CPU twice as slow. A fake clock makes each 20-token item take 0.1 s."""

    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()

    class Timed(FakeBatchModel):
        def run_batch(self, items):
            clock.now += 0.1 * len(items)  # 200 tokens per second
            return super().run_batch(items)

    async def main():
        model = Timed()
        config = EngineConfig(max_batch_tokens=400, target_batch_seconds=0.3, max_wait_ms=0)
        engine = BatchEngine(model, config, clock=clock)
        assert engine.batch_tokens() == 400  # the cap until a batch is measured
        engine.start()
        await engine.submit(["a" * 20] * 20)
        assert [len(b) for b in model.batches] == [20]  # unmeasured: the cap (400 tokens)
        assert engine.token_rate == pytest.approx(200.0)
        assert engine.batch_tokens() == 60  # 0.3 s at 200 tokens/s
        await engine.submit(["b" * 20] * 9)
        assert [len(b) for b in model.batches][1:] == [3, 3, 3]
        engine.token_rate = 10.0  # a slow CPU: never less than one max-length item (50 tokens)
        assert engine.batch_tokens() == 50
        fixed = BatchEngine(model, EngineConfig(max_batch_tokens=400, target_batch_seconds=None), clock=clock)
        fixed.token_rate = 200.0
        assert fixed.batch_tokens() == 400
        await engine.drain(1)

    asyncio.run(main())


class FixedCost(FakeBatchModel):
    """Every forward pass takes 1 s of its clock whatever its size, as a GPU's launch-bound pass."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def run_batch(self, items):
        out = super().run_batch(items)
        self.now += 1.0
        return out


def test_next_rate_moves_with_full_batches_and_only_up_with_small_ones():
    from embedrank.serving.engine import next_rate

    assert next_rate(0.0, 500.0, full=True) == 500.0  # the first full batch sets it
    assert next_rate(0.0, 5.0, full=False) == 5.0  # the first batch sizes the next ones, full or not
    assert next_rate(1000.0, 500.0, full=True) == pytest.approx(850.0)  # a slower machine: follows it down
    assert next_rate(1000.0, 5.0, full=False) == 1000.0  # a lone query: no lower
    assert next_rate(1000.0, 2000.0, full=False) == pytest.approx(1300.0)  # faster even when small: up


def test_lone_queries_leave_the_rate_of_full_batches_and_bulk_requests_admitted():
    """Each forward pass costs 1 s of the injected clock whatever its size (a GPU's launch-bound pass): the
    rate a full batch measured stays while 1-item batches run, so bulk requests are still admitted and their
    batches keep their size (a rate dragged down by the lone queries refused them with 429)."""

    async def main():
        model = FixedCost()
        config = EngineConfig(max_batch_tokens=400, target_batch_seconds=1.0, max_queue_seconds=30, max_wait_ms=0)
        engine = BatchEngine(model, config, clock=model.clock)
        engine.start()
        await engine.submit(["a" * 20] * 20)  # one full batch: 400 tokens in 1 s
        assert engine.token_rate == pytest.approx(400.0)
        for _ in range(20):
            await engine.submit(["q"])  # 1 token in 1 s, alone
        assert engine.token_rate == pytest.approx(400.0)
        assert engine.batch_tokens() == 400
        model.gate.clear()
        model.entered.clear()
        running = asyncio.ensure_future(engine.submit(["q"]))
        await _entered(model)
        bulks = [asyncio.ensure_future(engine.submit(["b" * 20] * 100)) for _ in range(4)]  # 8,000 tokens: 20 s
        await asyncio.sleep(0)
        assert not any(b.done() for b in bulks)  # admitted, none refused
        model.gate.set()
        await asyncio.wait_for(asyncio.gather(running, *bulks), WAIT)
        assert {len(b) for b in model.batches[22:]} == {20}  # full batches, as before the queries
        await engine.drain(1)

    asyncio.run(main())


def test_no_request_is_refused_for_its_wait_until_a_full_batch_measured_the_speed():
    """A lone query as the first batch measures mostly fixed cost: it sizes the next batches, but bulk requests
    are not refused for a wait estimated from it."""

    async def main():
        model = FixedCost()
        config = EngineConfig(max_batch_tokens=400, target_batch_seconds=1.0, max_queue_seconds=2, max_wait_ms=0)
        engine = BatchEngine(model, config, clock=model.clock)
        engine.start()
        await engine.submit(["q"])  # 1 token in 1 s
        assert engine.token_rate == pytest.approx(1.0) and not engine.rate_of_full
        model.gate.clear()
        model.entered.clear()
        running = asyncio.ensure_future(engine.submit(["q"]))
        await _entered(model)
        bulks = [asyncio.ensure_future(engine.submit(["b" * 20] * 10)) for _ in range(3)]  # 200 s at 1 token/s
        await asyncio.sleep(0)
        assert not any(b.done() for b in bulks)  # admitted
        model.gate.set()
        await asyncio.wait_for(asyncio.gather(running, *bulks), WAIT)
        assert engine.rate_of_full  # the bulk's batches filled their budget
        await engine.drain(1)

    asyncio.run(main())
