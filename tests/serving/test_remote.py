"""Engines served to other processes (:mod:`embedrank.serving.remote`): what crosses comes back equal, two
submitting connections share one fair queue, errors and cancellations cross as in process, the trace context
travels, and a host that dies fails what waits with ``NotReadyError``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from embedrank.errors import InvalidInputError, NotReadyError, OverloadedError
from embedrank.models.tokens import TokenRow
from embedrank.serving import tracing
from embedrank.serving.engine import BatchEngine, EngineConfig
from embedrank.serving.image_text import ImageInput
from embedrank.serving.late import Held
from embedrank.serving.remote import Answer, EngineFailedError, EngineHost, EngineLink, Submit, decode, encode
from embedrank.serving.runners import EmbeddingBatchModel
from embedrank.testing.fake import FakeEncoder
from embedrank.types import ModelOutput

REPO = Path(__file__).resolve().parents[2]


class Gated:
    """A batch model that holds each batch until ``gate`` is set, noting which rows each batch held; a row's value
    is its length, and a row whose tokens are ``["boom"]`` fails its batch."""

    max_seq_length = 32

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.batches: list[list[int]] = []
        self.started = threading.Event()

    def item_tokens(self, item: TokenRow) -> int:
        return item.length

    def run_batch(self, items: Sequence[TokenRow]) -> ModelOutput:
        self.started.set()
        self.gate.wait(30)
        self.batches.append([r.length for r in items])
        if any(r.tokens == ["boom"] for r in items):
            raise RuntimeError("the forward pass failed")
        values = np.array([[float(r.length)] for r in items], dtype=np.float32)  # (B, 1)
        return ModelOutput(values, [r.length for r in items], [r.truncated for r in items])


def rows(*lengths: int) -> list[TokenRow]:
    return [TokenRow(["t"] * n, n, False) for n in lengths]


async def hosted(engines: dict[str, BatchEngine], path: str) -> EngineHost:
    for engine in engines.values():
        engine.start()
    host = EngineHost(engines)
    await host.serve(path)
    return host


@pytest.fixture
def socket_path(tmp_path):
    return str(tmp_path / "engine.sock")


def test_a_fake_encoders_vectors_come_back_as_computed_in_process(socket_path):
    model = FakeEncoder(dimension=8, max_seq_length=6)
    texts = ["hello world", "a b c d e f g h", "one"]

    async def main():
        engine = BatchEngine(EmbeddingBatchModel(model))
        host = await hosted({"enc": engine}, socket_path)
        link = EngineLink(socket_path)
        try:
            return await link.engine("enc").submit(model.tokenize_rows(texts))
        finally:
            await link.close()
            await host.close()
            await engine.drain()

    out = asyncio.run(main())
    expected = model.embed_rows(model.tokenize_rows(texts))
    assert out.values.dtype == np.float32 and np.array_equal(out.values, expected.values)
    assert out.token_counts == expected.token_counts and out.truncated == [False, True, False]


def test_two_connections_share_one_fair_queue(socket_path):
    """While a batch is held, one connection queues a bulk job and another a one-row job: the one-row job is
    computed in the next batch, before the bulk job's other batches, as two callers of one process would be."""
    model = Gated()

    async def main():
        engine = BatchEngine(model, EngineConfig(max_batch_size=4, target_batch_seconds=None))
        host = await hosted({"m": engine}, socket_path)
        bulk_link, small_link = EngineLink(socket_path), EngineLink(socket_path)
        first = asyncio.create_task(bulk_link.engine("m").submit(rows(3)))
        await asyncio.to_thread(model.started.wait, 10)  # the first batch is held in its forward pass
        bulk = asyncio.create_task(bulk_link.engine("m").submit(rows(*[2] * 20)))
        while engine.queue_depth < 20:
            await asyncio.sleep(0.01)
        small = asyncio.create_task(small_link.engine("m").submit(rows(5)))
        while engine.queue_depth < 21:
            await asyncio.sleep(0.01)
        model.gate.set()
        done = await asyncio.gather(first, bulk, small)
        for link in (bulk_link, small_link):
            await link.close()
        await host.close()
        await engine.drain()
        return done

    first, bulk, small = asyncio.run(main())
    assert model.batches[0] == [3] and model.batches[1][0] == 5  # the small job goes next, before the bulk job's rest
    assert sorted(row for batch in model.batches[1:] for row in batch) == [2] * 20 + [5]  # each row once
    assert small.values.tolist() == [[5.0]] and bulk.token_counts == [2] * 20 and first.token_counts == [3]


def test_errors_cross_as_the_engine_raised_them(socket_path):
    model = Gated()
    model.gate.set()

    async def main():
        engine = BatchEngine(model, EngineConfig(max_queue_items=4))
        host = await hosted({"m": engine}, socket_path)
        link = EngineLink(socket_path)
        caught = []
        for name, items in (
            ("m", rows(*[1] * 5)),
            ("m", [TokenRow(["boom"], 1, False)]),
            ("other", rows(1)),
            ("m", ["an item no runner makes"]),  # refused before it is queued: still answered
        ):
            try:
                await link.submit(name, items)
            except Exception as exc:
                caught.append(exc)
        await link.close()
        await host.close()
        await engine.drain()
        return caught

    too_many, failed, unknown, broken = asyncio.run(main())
    assert isinstance(too_many, InvalidInputError) and "exceed the engine queue capacity of 4" in str(too_many)
    assert isinstance(failed, EngineFailedError) and str(failed) == "RuntimeError: the forward pass failed"
    assert isinstance(unknown, NotReadyError) and "no engine 'other'" in str(unknown)
    assert isinstance(broken, EngineFailedError) and str(broken).startswith("AttributeError"), broken


def test_the_request_id_travels_with_the_submission(socket_path, caplog):
    model = Gated()
    model.gate.set()

    async def main():
        engine = BatchEngine(model, EngineConfig())
        host = await hosted({"m": engine}, socket_path)
        link = EngineLink(socket_path, request_id=lambda: "req_from_the_front")
        with pytest.raises(EngineFailedError):
            await link.submit("m", [TokenRow(["boom"], 1, False)])
        with pytest.raises(EngineFailedError):
            await link.submit("m", [TokenRow(["boom"], 1, False)], request_id="req_named")
        await link.close()
        await host.close()
        await engine.drain()

    with caplog.at_level("WARNING", logger="embedrank.serving"):
        asyncio.run(main())
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert "req_from_the_front" in failures[0] and "req_named" in failures[1], failures


def test_an_overloaded_engine_refuses_with_its_retry_after(socket_path):
    model = Gated()

    async def main():
        engine = BatchEngine(model, EngineConfig(max_queue_items=3, target_batch_seconds=None, max_batch_size=1))
        host = await hosted({"m": engine}, socket_path)
        link = EngineLink(socket_path)
        held = asyncio.create_task(link.submit("m", rows(1)))
        await asyncio.to_thread(model.started.wait, 10)
        queued = asyncio.create_task(link.submit("m", rows(1, 1, 1)))
        while engine.queue_depth < 3:
            await asyncio.sleep(0.01)
        with pytest.raises(OverloadedError) as refused:
            await link.submit("m", rows(1))
        model.gate.set()
        await asyncio.gather(held, queued)
        await link.close()
        await host.close()
        await engine.drain()
        return refused.value

    refused = asyncio.run(main())
    assert "engine queue is full (3 items waiting, limit 3)" in str(refused) and refused.retry_after == 1.0


def test_a_cancelled_submission_and_a_closed_connection_drop_their_items(socket_path):
    """A submitter that stops waiting has its queued items dropped before they are computed; so has every
    submission of a connection that closes."""
    model = Gated()

    async def main():
        engine = BatchEngine(model, EngineConfig(max_batch_size=1, target_batch_seconds=None))
        host = await hosted({"m": engine}, socket_path)
        link, gone = EngineLink(socket_path), EngineLink(socket_path)
        held = asyncio.create_task(link.submit("m", rows(1)))
        await asyncio.to_thread(model.started.wait, 10)
        cancelled = asyncio.create_task(link.submit("m", rows(2, 2)))
        orphaned = asyncio.create_task(gone.submit("m", rows(3, 3, 3)))
        while engine.queue_depth < 5:
            await asyncio.sleep(0.01)
        cancelled.cancel()
        await gone.close()
        with pytest.raises(NotReadyError, match="went away"):
            await orphaned
        while host.waiting() > 1:  # the cancellation and the closed connection reached the host
            await asyncio.sleep(0.01)
        model.gate.set()
        await held
        after = await link.submit("m", rows(4))
        await link.close()
        await host.close()
        await engine.drain()
        return after

    after = asyncio.run(main())
    assert after.values.tolist() == [[4.0]]
    assert [b for b in model.batches] == [[1], [4]]  # neither the cancelled nor the orphaned rows were computed


def test_the_trace_context_travels_and_the_forward_pass_links_the_request(socket_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    model = FakeEncoder(dimension=4)

    async def main():
        engine = BatchEngine(EmbeddingBatchModel(model))
        host = await hosted({"enc": engine}, socket_path)
        link = EngineLink(socket_path)
        with provider.get_tracer("test").start_as_current_span("request") as request:
            await link.submit("enc", model.tokenize_rows(["traced text"]), request_id="req-1")
        await link.close()
        await host.close()
        await engine.drain()
        return request.get_span_context()

    tracing.use(provider)
    try:
        request = asyncio.run(main())
    finally:
        tracing.use(None)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert sorted(spans) == ["embedrank.forward", "request"]
    forward = spans["embedrank.forward"]
    assert forward.context.trace_id == request.trace_id and forward.parent.span_id == request.span_id
    assert [link.context.span_id for link in forward.links] == [request.span_id]
    waited = spans["request"].attributes["gen_ai.latency.time_in_queue"]  # measured there, recorded here
    assert 0 <= waited <= (forward.start_time - spans["request"].start_time) / 1e9


HOST = """
import asyncio, sys, time
from embedrank.serving.engine import BatchEngine
from embedrank.serving.remote import EngineHost
from embedrank.serving.runners import EmbeddingBatchModel
from embedrank.testing.fake import FakeEncoder

class Slow(EmbeddingBatchModel):
    def run_batch(self, items):
        if any("slow" in row.tokens for row in items):
            time.sleep(600)
        return super().run_batch(items)

async def main():
    engine = BatchEngine(Slow(FakeEncoder(dimension=4)))
    engine.start()
    await EngineHost({"enc": engine}).serve(sys.argv[1])
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.slow  # a process of its own
def test_a_host_killed_fails_what_waits_and_what_follows_with_not_ready(socket_path):
    host = subprocess.Popen([sys.executable, "-c", HOST, socket_path], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None and host.stdout.readline().strip() == "ready"
        model = FakeEncoder(dimension=4)

        async def main():
            link = EngineLink(socket_path)
            first = await link.submit("enc", model.tokenize_rows(["before"]))
            waiting = asyncio.create_task(link.submit("enc", model.tokenize_rows(["slow"])))
            await asyncio.sleep(0.5)  # sent; its batch sleeps
            os.kill(host.pid, signal.SIGKILL)
            errors = []
            with pytest.raises(NotReadyError) as lost:
                await waiting
            errors.append(str(lost.value))
            await asyncio.to_thread(host.wait)  # gone whole: its listening socket too
            with pytest.raises(NotReadyError) as refused:
                await link.submit("enc", model.tokenize_rows(["after"]))
            errors.append(str(refused.value))
            await link.close()
            return first, errors

        first, errors = asyncio.run(main())
        assert first.values.shape == (1, 4)
        assert errors[0] == "the engine process went away while this was computed; retry"
        assert errors[1].startswith("the engine process is not reachable")
    finally:
        host.kill()
        host.wait()


@given(
    hnp.arrays(
        st.sampled_from([np.float32, np.float16, np.int8, np.uint8, np.int64]),
        hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5),
    )
)
def test_arrays_cross_with_their_dtype_shape_and_bytes(values):
    answer = decode(encode(Answer(7, values, [1], [False]))[4:])
    assert answer.values.dtype == values.dtype and answer.values.shape == values.shape
    assert answer.values.tobytes() == values.tobytes()


def test_held_values_sparse_rows_and_images_cross_whole():
    held = np.empty(2, dtype=object)
    held[:] = [Held(np.ones((3, 2), np.float32)), Held({"dense": np.zeros(2, np.float32), "n": 1})]
    back = decode(encode(Answer(1, held, [3, 2], [False, False]))[4:]).values
    assert back.dtype == object and back[0].value.shape == (3, 2) and back[1].value["n"] == 1
    csr = np.empty(1, dtype=object)
    csr[0] = sp.csr_matrix(np.array([[0, 1.5, 0, 2.0]], dtype=np.float32))
    again = decode(encode(Answer(1, csr, [4], [False]))[4:]).values[0]
    assert (again != csr[0]).nnz == 0 and again.dtype == np.float32
    image = ImageInput(b"\x89PNG...", "input", "[2]")
    assert decode(encode(Submit(1, "img", 0, [image]))[4:]).items == [image]


def test_a_preprocessed_image_crosses_as_its_pixel_arrays():
    import torch

    from embedrank.models.image_text import ImageRow

    batch = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.int32)
    row = ImageRow({"pixel_values": batch[1], "pixel_attention_mask": mask[0]}, 17, False)  # views of a batch
    (back,) = decode(encode(Submit(1, "clip", 0, [row]))[4:]).items
    assert isinstance(back, ImageRow) and (back.length, back.truncated) == (17, False)
    assert set(back.pixels) == {"pixel_values", "pixel_attention_mask"}
    for name, tensor in row.pixels.items():
        assert back.pixels[name].dtype == tensor.dtype and torch.equal(back.pixels[name], tensor), name


class Opaque:
    pass


def test_what_cannot_cross_is_refused_naming_its_type():
    with pytest.raises(TypeError, match=r"an? Opaque cannot be sent to an engine in another process"):
        encode(Submit(1, "m", 0, [Opaque()]))


def test_a_refusal_names_the_request_field():
    from embedrank.serving.remote import raised, refusal

    again = raised(refusal(3, InvalidInputError("too long", param="input")))
    assert isinstance(again, InvalidInputError) and again.param == "input" and str(again) == "too long"


def test_reports_are_kept_for_scrapes_and_marked_once_their_process_went(socket_path):
    async def main():
        host = EngineHost({}, exposition=lambda: b"engine figures")
        await host.serve(socket_path)
        first, second = EngineLink(socket_path), EngineLink(socket_path)
        await first.report("front-1", b"one")
        await second.report("front-2", b"two", ready=False)
        await second.report("front-2", b"two, later", ready=False)
        seen = await first.scrape(except_source="front-1")
        ready = host.ready_sources()
        await second.report("front-2", b"two, ready", ready=True)
        await second.scrape()  # on the same connection: the report before it has arrived
        both = host.ready_sources()
        await second.close()
        await asyncio.sleep(0.1)
        after = await first.scrape()
        await first.close()
        await host.close()
        return seen, after, (ready, both, host.ready_sources())

    seen, after, ready = asyncio.run(main())
    assert ready == (["front-1"], ["front-1", "front-2"], [])  # connected, their last report ready
    assert seen == [("engine", b"engine figures", True), ("front-2", b"two, later", True)]
    assert after == [("engine", b"engine figures", True), ("front-1", b"one", True), ("front-2", b"two, ready", False)]


def test_a_call_the_host_process_answers_crosses_with_its_arrays_errors_and_cancellation(socket_path):
    """:meth:`EngineHost.answer`: a call's arguments and value cross as a submission's do (arrays whole); what the call
    raises crosses as the same error class; a name the host does not answer is not ready; a caller that stops
    waiting has the call cancelled there."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def scaled(args):  # type: ignore[no-untyped-def]
        return {"rows": args["vectors"] * args["by"], "sparse": args["sparse"], "name": args["name"]}

    async def refused(args):  # type: ignore[no-untyped-def]
        raise InvalidInputError(f"no such thing as {args}", param="thing")

    async def broken(args):  # type: ignore[no-untyped-def]
        raise KeyError(args)

    async def slow(args):  # type: ignore[no-untyped-def]
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    vectors = np.arange(6, dtype=np.float32).reshape(2, 3)
    sparse = sp.csr_matrix(np.array([[0, 1.5], [2.0, 0]], dtype=np.float32))

    async def main():  # type: ignore[no-untyped-def]
        host = EngineHost({})
        for name, call in {"scaled": scaled, "refused": refused, "broken": broken, "slow": slow}.items():
            host.answer(name, call)
        await host.serve(socket_path)
        link = EngineLink(socket_path)
        try:
            value = await link.call("scaled", {"vectors": vectors, "by": 2, "sparse": sparse, "name": "x"})
            with pytest.raises(InvalidInputError, match="no such thing as 7") as invalid:
                await link.call("refused", 7)
            assert invalid.value.param == "thing"
            with pytest.raises(EngineFailedError, match="KeyError"):
                await link.call("broken", "k")
            with pytest.raises(NotReadyError, match="does not answer 'unknown'"):
                await link.call("unknown", None)
            waiting = asyncio.create_task(link.call("slow", None))
            await asyncio.wait_for(started.wait(), 10)
            waiting.cancel()
            await asyncio.wait_for(cancelled.wait(), 10)  # cancelled in the host too
            return value
        finally:
            await link.close()
            await host.close()

    value = asyncio.run(main())
    assert value["rows"].dtype == np.float32 and np.array_equal(value["rows"], vectors * 2)
    assert (value["sparse"] != sparse).nnz == 0 and value["name"] == "x"
