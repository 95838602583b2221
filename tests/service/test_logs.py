"""The service's log lines: each about a request names it (request id, route, method, model, status,
latency), as text or as one JSON object per line, and none above debug quotes what a client sent."""

from __future__ import annotations

import json
import logging

import pytest

from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder
from service import logs, request_ids
from service.settings import Telemetry

pytestmark = pytest.mark.kernel_free

EMB, CE = "fake-encoder", "fake-ce"
SECRET = "zebra-quartz-7731"  # a text a client sends; no log line at info or above may quote it


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept():
    """The service's records at INFO and above, kept on its own logger (the app's logging setup replaces the
    root logger's handlers, pytest's capture among them)."""
    handler, logger = Kept(), logging.getLogger("embedrank")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.records
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_a_json_line_carries_the_request_fields_and_the_traceback():
    record = logging.LogRecord("embedrank.service", logging.ERROR, __file__, 1, "failed: %s", ("x",), None)
    token = request_ids.CURRENT.set("req_0123456789abcdef01234567")
    try:
        with logs.opened("/v1/embeddings", "POST"):
            logs.note_model(EMB)
            logs.RequestFields().filter(record)
    finally:
        request_ids.CURRENT.reset(token)
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    line = json.loads(logs.JsonLines().format(record))
    assert line["message"] == "failed: x" and line["level"] == "error" and line["logger"] == "embedrank.service"
    assert line["request_id"] == "req_0123456789abcdef01234567" and line["model"] == EMB
    assert (line["route"], line["method"]) == ("/v1/embeddings", "POST")
    assert line["timestamp"].endswith("+00:00") and "ValueError: boom" in line["exception"]
    outside = logging.LogRecord("embedrank", logging.INFO, __file__, 1, "idle", (), None)
    logs.RequestFields().filter(outside)
    assert set(json.loads(logs.JsonLines().format(outside))) == {"timestamp", "level", "logger", "message"}


def test_the_access_line_names_the_request_its_model_status_and_latency(fake_service, kept):
    with fake_service({EMB: FakeEncoder(EMB)}, telemetry=Telemetry(access_log=True)) as client:
        resp = client.post("/v1/embeddings", json={"model": EMB, "input": "green tea"})
        missing = client.post("/v1/embeddings", json={"model": "not-served", "input": "green tea"})
    access = [r for r in kept if r.name == "embedrank.access"]
    assert len(access) == 2
    ok, refused = access
    assert ok.request_id == resp.headers["x-request-id"] and refused.request_id == missing.headers["x-request-id"]
    assert (ok.route, ok.method, ok.model, ok.status) == ("/v1/embeddings", "POST", EMB, 200)
    assert refused.status == 404 and ok.latency_ms > 0
    assert ok.getMessage().startswith(f"request {resp.headers['x-request-id']}: POST /v1/embeddings 200 ")


def test_no_access_line_unless_asked(fake_service, kept):
    with fake_service({EMB: FakeEncoder(EMB)}) as client:
        assert client.post("/v1/embeddings", json={"model": EMB, "input": "green tea"}).status_code == 200
    assert kept and not [r for r in kept if r.name == "embedrank.access"]


def test_no_line_above_debug_quotes_what_a_client_sent(fake_service, kept):
    """Requests that succeed, fail on their input, or meet a server error, with the text in every field a
    client may fill: no formatted line (with its fields, as JSON) quotes it."""

    class Failing(FakeEncoder):
        armed = False

        def embed_rows(self, rows):
            if self.armed:
                raise RuntimeError("the model failed")  # a server error: logged with its traceback
            return super().embed_rows(rows)

    failing = Failing("failing")
    models = {EMB: FakeEncoder(EMB, max_seq_length=8), CE: FakeCrossEncoder(CE), "failing": failing}
    formatter = logs.JsonLines()
    long = " ".join([SECRET] * 40)
    with fake_service(models, telemetry=Telemetry(access_log=True)) as client:
        failing.armed = True
        for body in (
            {"model": EMB, "input": SECRET},
            {"model": EMB, "input": [SECRET, ""]},
            {"model": EMB, "input": long, "truncate": False},
            {"model": EMB, "input": SECRET, "dimensions": SECRET},
            {"model": EMB, "input": {"text": SECRET}},
            {"model": "failing", "input": SECRET},
        ):
            client.post("/v1/embeddings", json=body)
        client.post("/v1/rerank", json={"model": CE, "query": SECRET, "documents": [SECRET, long], "truncate": False})
        client.post("/v1/embeddings", content=b'{"model": "x", "input": "' + SECRET.encode() + b'"')  # cut short
        client.post("/embed", json={"inputs": SECRET, "truncate": False, "normalize": SECRET})
    lines = [formatter.format(r) for r in kept]
    assert any("the model failed" in line for line in lines)  # the server error was logged, with its traceback
    assert len([r for r in kept if r.name == "embedrank.access"]) == 9
    assert not [line for line in lines if SECRET in line]


@pytest.mark.slow  # a real server
def test_a_server_with_json_logs_writes_one_json_object_per_line(tmp_path):
    """``EMBEDRANK_LOG_FORMAT=json litestar run``: every line it writes, the server's and the framework's
    included, is a JSON object; a request's access line names its id, route, model, status and latency."""
    import httpx

    from embedrank.testing.launch import running_server

    log = tmp_path / "server.log"
    env = {
        "HF_HUB_OFFLINE": "1",
        "EMBEDRANK_MODELS": f"{EMB}=fake:encoder",
        "EMBEDRANK_API_KEYS": "k",
        "EMBEDRANK_LOG_FORMAT": "json",
        "EMBEDRANK_ACCESS_LOG": "true",
    }
    with running_server(env, log_path=str(log)) as base:
        resp = httpx.post(
            f"{base}/v1/embeddings", json={"model": EMB, "input": SECRET}, headers={"Authorization": "Bearer k"}
        )
        assert resp.status_code == 200
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # every line: one JSON object
    assert {"timestamp", "level", "logger", "message"} <= set(parsed[0])
    assert any(p["logger"].startswith("uvicorn") for p in parsed)  # the server's own lines too
    (access,) = [p for p in parsed if p["logger"] == "embedrank.access" and p["route"] != "/health"]
    assert access["request_id"] == resp.headers["x-request-id"] and access["model"] == EMB
    assert (access["route"], access["method"], access["status"]) == ("/v1/embeddings", "POST", 200)
    assert access["latency_ms"] > 0 and SECRET not in log.read_text()
