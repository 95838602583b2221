"""OpenTelemetry traces: configured by the OTEL_* variables, off and absent when none is set; one server span per
request with the GenAI attributes, child spans for tokenization, queue wait and the forward pass (one per batch,
linked to every request in it), a span per batch-job chunk and line; W3C ``traceparent`` honoured."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import numpy as np
import pytest
from litestar.plugins.opentelemetry import OpenTelemetryInstrumentationMiddleware
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from embedrank.serving import tracing as core_tracing
from embedrank.serving.engine import BatchEngine, EngineConfig
from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder
from embedrank.types import ModelOutput
from service import tracing
from service.settings import Batches, SettingsError

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture
def recorded():
    """A tracer provider whose finished spans land in memory at once; tracing is off again after the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    core_tracing.use(None)
    provider.shutdown()


def _by_name(spans, name):
    return [s for s in spans if s.name == name]


# -- configuration ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp_proto_http"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp_proto_http"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ["otlp_proto_http"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, ["otlp_proto_grpc"]),
        ({"OTEL_TRACES_EXPORTER": "console, otlp,console"}, ["console", "otlp_proto_http"]),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, []),
    ],
)
def test_the_exporters_are_what_the_standard_variables_name(environ, names):
    assert tracing.exporter_names(environ) == names


def test_an_unknown_protocol_or_exporter_is_a_setting_error_that_names_it():
    with pytest.raises(SettingsError, match="http/json"):
        tracing.exporter_names({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(SettingsError, match=r"'zipkin'.*installed: \[.*'console'"):
        tracing.provider_from_env({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(SettingsError, match="opentelemetry-exporter-otlp-proto-grpc"):  # not installed here
        tracing.provider_from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


def test_no_variable_no_provider_and_the_service_name_defaults_to_embedrank(monkeypatch):
    assert tracing.provider_from_env({}) is None
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    provider = tracing.provider_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert provider is not None and provider.resource.attributes["service.name"] == "embedrank"
    provider.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "search-api")
    provider = tracing.provider_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert provider is not None and provider.resource.attributes["service.name"] == "search-api"
    provider.shutdown()


def test_without_a_provider_the_app_has_no_tracing_layer_and_the_core_records_nothing(fake_service, monkeypatch):
    made = []
    monkeypatch.setattr(core_tracing, "Queued", lambda: made.append(1))  # what a traced request would keep
    with fake_service({"fake": FakeEncoder()}) as client:
        assert not isinstance(client.app.asgi_handler, OpenTelemetryInstrumentationMiddleware)
        assert core_tracing.tracer() is None
        assert client.post("/v1/embeddings", json={"model": "fake", "input": "green tea"}).status_code == 200
    assert made == []


# -- spans of a request -------------------------------------------------------------------------------------------
def test_an_embeddings_request_is_one_server_span_with_the_genai_attributes_and_its_children(fake_service, recorded):
    provider, exporter = recorded
    with fake_service({"fake": FakeEncoder()}, tracer_provider=provider) as client:
        resp = client.post("/v1/embeddings", json={"model": "fake", "input": ["green tea", "black coffee beans"]})
        assert resp.status_code == 200
        exporter.clear()
        traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
        resp = client.post(
            "/v1/embeddings", json={"model": "fake", "input": ["green tea"]}, headers={"traceparent": traceparent}
        )
        assert resp.status_code == 200
        assert client.get("/health").status_code == 200  # not traced
    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert server.name == "POST /v1/embeddings"
    assert server.attributes["http.route"] == "/v1/embeddings"
    assert server.attributes["gen_ai.operation.name"] == "embeddings"
    assert server.attributes["gen_ai.request.model"] == "fake"
    assert server.attributes["gen_ai.usage.input_tokens"] == resp.json()["usage"]["prompt_tokens"]
    assert server.attributes["embedrank.request_id"] == resp.headers["x-request-id"]
    # the caller's trace continues: same trace id, the caller's span as parent
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert format(server.parent.span_id, "016x") == PARENT_ID
    assert not _by_name(spans, "embedrank.tokenize")  # a short text is tokenized inline: no span of its own
    assert sorted(s.name for s in spans) == ["POST /v1/embeddings", "embedrank.forward"]  # one span of its own
    (forward,) = _by_name(spans, "embedrank.forward")
    assert forward.context.trace_id == server.context.trace_id
    assert forward.parent.span_id == server.context.span_id
    assert server.start_time <= forward.start_time <= forward.end_time <= server.end_time
    assert [link.context.span_id for link in forward.links] == [server.context.span_id]
    assert forward.attributes["embedrank.batch.items"] == 1
    waited = server.attributes["gen_ai.latency.time_in_queue"]  # queued until its forward pass began
    assert 0 <= waited <= (forward.start_time - server.start_time) / 1e9
    assert server.attributes["http.request.method"] == "POST" and server.attributes["url.path"] == "/v1/embeddings"
    assert server.attributes["http.response.status_code"] == 200


def test_texts_tokenized_in_a_worker_thread_get_a_tokenize_span(fake_service, recorded):
    provider, exporter = recorded
    long = " ".join(["green tea"] * 400)  # over INLINE_TOKENIZE_CHARS: tokenized off the event loop
    with fake_service({"fake": FakeEncoder()}, tracer_provider=provider) as client:
        assert client.post("/v1/embeddings", json={"model": "fake", "input": [long, "tea"]}).status_code == 200
    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    (tokenize,) = _by_name(spans, "embedrank.tokenize")
    assert tokenize.parent.span_id == server.context.span_id
    assert tokenize.attributes["embedrank.tokenize.texts"] == 2


def test_a_rerank_request_is_a_rerank_operation(fake_service, recorded):
    provider, exporter = recorded
    with fake_service({"rer": FakeCrossEncoder()}, tracer_provider=provider) as client:
        resp = client.post("/v1/rerank", json={"model": "rer", "query": "tea", "documents": ["green tea", "coffee"]})
        assert resp.status_code == 200
    (server,) = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert server.name == "POST /v1/rerank"
    assert server.attributes["gen_ai.operation.name"] == "rerank"
    assert server.attributes["gen_ai.request.model"] == "rer"
    assert server.attributes["gen_ai.usage.input_tokens"] == resp.json()["usage"]["total_tokens"]


def test_an_error_is_a_server_span_with_its_status_and_no_text_of_the_request(fake_service, recorded):
    provider, exporter = recorded
    secret = "a private sentence"
    with fake_service({"fake": FakeEncoder()}, tracer_provider=provider) as client:
        resp = client.post("/v1/embeddings", json={"model": "missing", "input": secret})
        assert resp.status_code == 404
        assert client.get("/v1/files/file-abc", headers={}).status_code == 404
    servers = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert [s.name for s in servers] == ["POST /v1/embeddings", "GET /v1/files/{file_id:str}"]  # templates, not paths
    assert servers[0].attributes["http.response.status_code"] == 404
    assert servers[0].attributes["gen_ai.request.model"] == "missing"
    assert secret not in json.dumps([dict(s.attributes) for s in exporter.get_finished_spans()])


# -- the forward pass of several requests -------------------------------------------------------------------------
class _Gated:
    """A batch model whose first batch waits for a gate, so that later requests queue up behind it."""

    max_seq_length = 16

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.batches: list[int] = []

    def item_tokens(self, item: str) -> int:
        return 4

    def run_batch(self, items):
        if not self.batches:
            self.gate.wait(10)
        self.batches.append(len(items))
        return ModelOutput(np.ones((len(items), 2), dtype=np.float32), [4] * len(items), [False] * len(items))


def test_one_forward_span_per_batch_linked_to_every_request_in_it(recorded):
    provider, exporter = recorded
    core_tracing.use(provider)
    tracer = provider.get_tracer("test")
    model = _Gated()

    async def main() -> dict[str, trace.Span]:
        engine = BatchEngine(model, EngineConfig(max_wait_ms=0))
        engine.start()
        requests: dict[str, trace.Span] = {}

        async def request(name: str, items: list[str]) -> None:
            with tracer.start_as_current_span(name) as span:
                requests[name] = span
                await engine.submit(items)

        first = asyncio.create_task(request("a", ["x"]))
        while not engine._computing:  # "a" is in its forward pass, held at the gate
            await asyncio.sleep(0.005)
        others = [asyncio.create_task(request(n, ["y", "z"])) for n in ("b", "c")]
        await asyncio.sleep(0.05)
        model.gate.set()
        await asyncio.gather(first, *others)
        await engine.drain(5)
        return requests

    requests = asyncio.run(main())
    assert model.batches == [1, 4]  # b's and c's items went into one batch
    spans = exporter.get_finished_spans()
    forwards = _by_name(spans, "embedrank.forward")
    assert len(forwards) == 2
    ids = {name: span.get_span_context().span_id for name, span in requests.items()}
    second = next(f for f in forwards if f.attributes["embedrank.batch.items"] == 4)
    assert sorted(link.context.span_id for link in second.links) == sorted([ids["b"], ids["c"]])
    assert second.parent.span_id in (ids["b"], ids["c"])  # the request whose item leads the batch
    assert not _by_name(spans, "embedrank.queue_wait")  # the queue wait is an attribute of each request's span
    waits = {s.name: s.attributes["gen_ai.latency.time_in_queue"] for s in spans if s.name in ids}
    assert set(waits) == set(ids)  # one queue wait per request
    assert waits["b"] >= 0.04 and waits["a"] < waits["b"]  # "b" waited behind "a"'s pass
    assert all(f.start_time <= f.end_time for f in forwards)
    (first,) = [f for f in forwards if f.attributes["embedrank.batch.items"] == 1]
    assert first.end_time - first.start_time >= 40_000_000  # held at the gate: the pass's own times
    (b,) = _by_name(spans, "b")
    assert first.end_time <= b.start_time + waits["b"] * 1e9 <= second.start_time + 1_000_000  # clocks: ns vs s


class _Threads(SpanProcessor):
    """Notes the thread each span starts on."""

    def __init__(self) -> None:
        self.started: dict[str, set[str]] = {}

    def on_start(self, span, parent_context=None) -> None:
        self.started.setdefault(span.name, set()).add(threading.current_thread().name)


def test_the_forward_threads_record_no_span(recorded, monkeypatch):
    """The engine's spans and the requests' queue waits are recorded on the event loop after the pass, with the
    pass's own times: the forward thread every request waits for spends no time on tracing."""
    provider, exporter = recorded
    threads = _Threads()
    provider.add_span_processor(threads)
    waited_on: set[str] = set()
    waited = core_tracing.Queued.waited

    def noted(queued: core_tracing.Queued) -> None:
        waited_on.add(threading.current_thread().name)
        waited(queued)

    monkeypatch.setattr(core_tracing.Queued, "waited", noted)
    core_tracing.use(provider)
    tracer = provider.get_tracer("test")
    model = _Gated()
    model.gate.set()

    async def main() -> None:
        engine = BatchEngine(model, EngineConfig(max_wait_ms=0))
        engine.start()

        async def request(items: list[str]) -> None:
            with tracer.start_as_current_span("request"):
                await engine.submit(items)

        await asyncio.gather(*(request(["x", "y"]) for _ in range(8)))
        await engine.drain(5)

    asyncio.run(main())
    assert threads.started["embedrank.forward"] and threads.started["request"]
    loop_threads = threads.started["request"]
    assert threads.started["embedrank.forward"] <= loop_threads, threads.started
    assert waited_on and waited_on <= loop_threads, (waited_on, loop_threads)
    requests = [s for s in exporter.get_finished_spans() if s.name == "request"]
    assert len(requests) == 8 and all(s.attributes["gen_ai.latency.time_in_queue"] >= 0 for s in requests)


# -- batch jobs ---------------------------------------------------------------------------------------------------
def test_a_batch_chunk_is_a_span_with_a_child_per_line(fake_service, recorded, tmp_path):
    provider, exporter = recorded
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": "fake", "input": "tea"}}
        for i in range(3)
    ]
    content = "\n".join(json.dumps(line) for line in lines).encode()
    with fake_service(
        {"fake": FakeEncoder()}, tracer_provider=provider, batches=Batches(batch_dir=str(tmp_path))
    ) as client:
        upload = client.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})
        assert upload.status_code == 200, upload.text
        batch = client.post(
            "/v1/batches",
            json={"input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"},
        ).json()
        deadline = time.monotonic() + 30
        while client.get(f"/v1/batches/{batch['id']}").json()["status"] != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    spans = exporter.get_finished_spans()
    (chunk,) = _by_name(spans, "embedrank.batch_chunk")
    assert chunk.attributes["embedrank.batch.id"] == batch["id"] and chunk.attributes["embedrank.batch.lines"] == 3
    line_spans = _by_name(spans, "embedrank.batch_line")
    assert sorted(s.attributes["embedrank.batch.line"] for s in line_spans) == [0, 1, 2]
    for line in line_spans:
        assert line.parent.span_id == chunk.context.span_id
        assert line.attributes["gen_ai.operation.name"] == "embeddings"
        assert line.attributes["gen_ai.request.model"] == "fake"
    forwards = _by_name(spans, "embedrank.forward")
    assert forwards and all(f.context.trace_id == chunk.context.trace_id for f in forwards)


# -- a real server ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("fronts", [None, 2], ids=["one-process", "two-fronts"])
def test_a_server_started_with_the_console_exporter_prints_the_request_span(tmp_path, fronts):
    """One process, or a replica of fronts: the forward pass's span (the engine process's) is the child of the
    request's server span (a front's), whose trace context travelled with the texts."""
    from embedrank.testing.launch import running_server

    log = tmp_path / "server.log"
    env = {
        "HF_HUB_OFFLINE": "1",
        "EMBEDRANK_MODELS": "fake=fake:encoder",
        "EMBEDRANK_API_KEYS": "k",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_SERVICE_NAME": "embedrank-test",
    }
    with running_server(env, log_path=str(log), fronts=fronts) as base:
        resp = httpx.post(
            f"{base}/v1/embeddings", json={"model": "fake", "input": "green tea"}, headers={"Authorization": "Bearer k"}
        )
        assert resp.status_code == 200
    text = log.read_text()  # the exporter flushed on the way out (SIGTERM)
    spans = []
    decoder = json.JSONDecoder()
    at = text.find('{\n    "name"')
    while at >= 0:
        span, end = decoder.raw_decode(text, at)
        spans.append(span)
        at = text.find('{\n    "name"', end)
    (server,) = [s for s in spans if s["kind"] == "SpanKind.SERVER"]
    assert server["attributes"]["gen_ai.operation.name"] == "embeddings"
    assert server["attributes"]["gen_ai.request.model"] == "fake"
    assert server["resource"]["attributes"]["service.name"] == "embedrank-test"
    (forward,) = [s for s in spans if s["name"] == "embedrank.forward"]
    assert forward["parent_id"] == server["context"]["span_id"]


@pytest.mark.slow  # runs the benchmark and its OTLP sink in processes of their own
def test_the_span_cost_benchmark_measures_the_spans_a_one_query_request_makes():
    """eval/benchmarks/span_cost.py drives the service's tracing code alone, exported over OTLP/HTTP to a sink: a
    server span per request (its queue wait an attribute) and a forward span per 16 requests reach the exporter,
    none dropped."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "eval", "bench", "span-cost", "--requests", "320", "--rounds", "1"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dropping" not in done.stderr, done.stderr[-3000:]
    found = re.search(
        r"^tracing's cost: \S+ us per request .*, (\S+) spans per request, \S+ us per span$", done.stdout, re.M
    )
    assert found is not None, done.stdout
    assert float(found[1]) == pytest.approx((320 + 320 / 16) / 320, abs=1e-3)  # server, forward / 16
    assert "a one-query request of the served default costs" in done.stdout  # read from the tracing record
