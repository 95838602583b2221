"""What every route shares, on weightless fakes: the error body, limits, overload, request ids, loading, body
encodings and the work a request is allowed before it is refused."""

from __future__ import annotations

import re
import threading

import msgspec
import pytest
from litestar.testing import TestClient

from embedrank.errors import OverloadedError
from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder
from service.app import create_app
from service.settings import Limits
from tests.service.fakes import AUTH, BASE, CE, KEY, MODEL, assert_error, embed, fakes, make_app

pytestmark = pytest.mark.kernel_free


def test_malformed_json_wrong_method_media_type_unknown_model(client):
    assert_error(
        client.post("/v1/embeddings", content=b'{"model": ', headers={"Content-Type": "application/json"}),
        400,
        "invalid_json",
    )
    err = assert_error(client.get("/v1/embeddings"), 405, "method_not_allowed")
    assert "POST" in err["message"]
    assert_error(client.post("/v1/embeddings", content=b"{}", headers={"Content-Type": "text/plain"}), 415)
    assert_error(client.post("/v1/embeddings", content=b"{}", headers={"Content-Type": ""}), 415)
    err = assert_error(
        client.post("/v1/embeddings", json={"model": "nope", "input": "x"}), 404, "model_not_found", "model"
    )
    assert "nope" in err["message"]
    assert_error(
        client.post("/v1/rerank", json={"model": "nope", "query": "q", "documents": ["a"]}), 404, "model_not_found"
    )
    assert_error(client.get("/v1/nothing-here"), 404, "not_found")
    ok = client.post(
        "/v1/embeddings",
        content=b'{"model": "%s", "input": "x"}' % MODEL.encode(),
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200


def test_limits():
    limits = Limits(max_inputs=3, max_documents=2, max_body_bytes=2000, max_text_chars=50)
    with TestClient(make_app(msgspec.structs.replace(BASE, limits=limits))) as c:
        c.headers.update(AUTH)
        err = assert_error(c.post("/v1/embeddings", json={"model": MODEL, "input": ["a"] * 4}), 400, "too_many_inputs")
        assert "max_inputs=3" in err["message"]
        err = assert_error(
            c.post("/v1/rerank", json={"model": MODEL, "query": "q", "documents": ["a"] * 3}), 400, "too_many_documents"
        )
        assert "max_documents=2" in err["message"]
        err = assert_error(c.post("/v1/embeddings", json={"model": MODEL, "input": "x" * 51}), 400, "text_too_long")
        assert "max_text_chars=50" in err["message"]
        assert_error(
            c.post("/v1/rerank", json={"model": MODEL, "query": "q" * 51, "documents": ["a"]}),
            400,
            "text_too_long",
            "query",
        )
        assert_error(c.post("/v1/embeddings", json={"model": MODEL, "input": ["y" * 40] * 3 + ["z" * 2000]}), 413)


def test_overload_is_429_with_retry_after(client):
    runner = client.app.state.service.pool.models[MODEL].runner

    async def full(*args, **kwargs):
        raise OverloadedError("engine queue is full (limit 1)", retry_after=2)

    runner.engine.submit = full
    resp = embed(client, input="x")
    assert_error(resp, 429, "queue_full")
    assert resp.headers["retry-after"] == "2"


def test_internal_error_is_500_without_trace(client):
    runner = client.app.state.service.pool.models[MODEL].runner

    async def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    runner.embed = broken
    err = assert_error(embed(client, input="x"), 500, "internal_error")
    assert "secret" not in err["message"]
    assert 'route="/v1/embeddings",status="500"' in client.get("/metrics").text


def test_every_answer_carries_a_request_id_and_the_log_names_it(client, caplog):
    """The client's X-Request-Id when well-formed, else a fresh one; in the header of every answer, in every
    error body, and in the log line about the request."""
    ok = client.post("/v1/embeddings", json={"model": MODEL, "input": "x"}, headers={"X-Request-Id": "trace-42:a/b"})
    assert ok.status_code == 200 and ok.headers["x-request-id"] == "trace-42:a/b"
    fresh = {
        client.post("/v1/embeddings", json={"model": MODEL, "input": "x"}).headers["x-request-id"] for _ in range(3)
    }
    assert len(fresh) == 3 and all(re.fullmatch(r"req_[0-9a-f]{24}", f) for f in fresh)
    for sent in ("has space", "x" * 129, "-lead", ""):  # not well-formed: replaced, not echoed
        got = client.post("/v1/embeddings", json={"model": MODEL}, headers={"X-Request-Id": sent})
        assert re.fullmatch(r"req_[0-9a-f]{24}", assert_error(got, 400)["request_id"]), sent
    for resp in (
        client.get("/v1/nope", headers={"X-Request-Id": "r1"}),  # no route
        client.get("/v1/models", headers={"Authorization": "Bearer wrong", "X-Request-Id": "r1"}),  # refused
        client.get("/health", headers={"X-Request-Id": "r1"}),
    ):
        assert resp.headers["x-request-id"] == "r1"
        assert resp.status_code == 200 or resp.json()["error"]["request_id"] == "r1"
    runner = client.app.state.service.pool.models[MODEL].runner

    async def broken(*args, **kwargs):
        raise RuntimeError("boom")

    runner.embed = broken
    with caplog.at_level("ERROR", logger="embedrank.service"):
        sent = client.post("/v1/embeddings", json={"model": MODEL, "input": "x"}, headers={"X-Request-Id": "r-500"})
        assert_error(sent, 500, "internal_error")
    assert any("request r-500" in r.getMessage() for r in caplog.records)


def test_loading_is_503_then_ready(monkeypatch):
    from embedrank.serving.pool import ModelPool

    gate = threading.Event()
    loaded = threading.Event()
    real_load = ModelPool.load

    def slow_load(self, **kwargs):
        gate.wait(30)
        try:
            return real_load(self, **kwargs)
        finally:
            loaded.set()

    monkeypatch.setattr(ModelPool, "load", slow_load)
    with TestClient(create_app(BASE, models=fakes())) as c:
        assert c.get("/health").status_code == 503
        assert c.get("/health").json()["status"] == "loading"
        resp = c.post("/v1/embeddings", json={"model": MODEL, "input": "x"}, headers=AUTH)
        assert_error(resp, 503, "not_ready")
        assert "retry-after" in resp.headers
        gate.set()
        assert loaded.wait(30)
        for _ in range(1000):  # the lifespan task flips the status right after load returns
            if c.get("/health").status_code == 200:
                break
        assert c.get("/health").status_code == 200
        assert c.post("/v1/embeddings", json={"model": MODEL, "input": "x"}, headers=AUTH).status_code == 200


def test_a_body_is_decoded_once(client, monkeypatch):
    """The strict decoder's value is what the handler gets: Litestar does not parse the JSON again."""
    import litestar.connection.request

    def refuse(*args, **kwargs):
        raise AssertionError("the body was decoded a second time")

    monkeypatch.setattr(litestar.connection.request, "decode_json", refuse)
    assert embed(client, input=["once"]).status_code == 200
    assert client.post("/v1/rerank", json={"model": MODEL, "query": "q", "documents": ["a"]}).status_code == 200


def test_each_input_is_tokenized_once_when_submitted(fake_service):
    """The runner tokenizes a request's inputs once (off the event loop); the engine budgets on those rows'
    real lengths and the model pads them: no second tokenization, no token count on the happy path."""
    encoder, cross = FakeEncoder("once", dimension=8, max_seq_length=16), FakeCrossEncoder("once-ce")
    calls: list[list] = []
    with fake_service({"once": encoder, "once-ce": cross}) as client:  # started: its int8 ranges are fitted
        for model in (encoder, cross):
            original = model.tokenize_rows
            model.tokenize_rows = lambda items, original=original, **kw: (
                calls.append(list(items)) or original(items, **kw)
            )
            model.count_tokens = lambda *a, **k: pytest.fail("counted tokens again")
        encoder.encode_batch = lambda texts: pytest.fail("tokenized inside the forward pass")
        cross.score_batch = lambda pairs: pytest.fail("tokenized inside the forward pass")
        assert client.post("/v1/embeddings", json={"model": "once", "input": ["a b c", "d"]}).status_code == 200
        assert calls == [["a b c", "d"]]
        body = {"model": "once-ce", "query": "q", "documents": ["x y", "q z"], "truncate": False}
        assert client.post("/v1/rerank", json=body).status_code == 200
        assert calls[1] == [("q", "x y"), ("q", "q z")]
        engine = client.app.state.service.pool.models["once"].runner.engine
        assert engine.model.item_tokens(encoder.tokenize_rows(["a b c"])[0]) == 5  # 3 words + 2 special


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model": "fake-encoder", "input": "x", "dimensions": 1e400}', "dimensions"),
        (b'{"model": "fake-encoder", "input": [1e999]}', "input"),
        (b'{"model": "fake-encoder", "input": "x", "unknown": -1E+400}', "unknown"),
        (b'{"model": "fake-encoder", "input": "x", "priority": 1e308}', "priority"),
        (b'{"model": "fake-encoder", "input": "x", "return_tokens": 1e400}', "return_tokens"),
    ],
)
def test_numbers_out_of_range_are_a_400_naming_the_field(client, raw, param):
    resp = client.post("/v1/embeddings", content=raw, headers={"Content-Type": "application/json"})
    err = assert_error(resp, 400, param=param)
    assert param in err["message"]


def test_one_request_over_the_token_limit_is_413_before_it_is_queued(fake_service):
    class Counting(FakeEncoder):
        batches = 0

        def embed_rows(self, rows, **kwargs):
            Counting.batches += 1
            return super().embed_rows(rows, **kwargs)

    settings = msgspec.structs.replace(BASE, limits=Limits(max_request_tokens=100))
    encoder = Counting(MODEL, dimension=32, max_seq_length=16)
    with fake_service({MODEL: encoder, CE: FakeCrossEncoder(CE, max_seq_length=16)}, key=KEY, settings=settings) as c:
        started = Counting.batches  # the int8 ranges fitted at startup
        for path, body in (
            ("/v1/embeddings", {"model": MODEL, "input": ["a b c d e"] * 30}),  # 30 x 7 tokens
            ("/v1/embeddings", {"model": MODEL, "input": "w " * 500, "chunking": True}),
            ("/v1/rerank", {"model": CE, "query": "q", "documents": ["w " * 60] * 3}),  # chunked by default
            ("/v1/rerank", {"model": MODEL, "query": "q", "documents": ["a b c"] * 30}),
        ):
            err = assert_error(c.post(path, json=body), 413, "request_too_large")
            assert "max_request_tokens" in err["message"] and "limit is 100" in err["message"]
        assert Counting.batches == started  # nothing of the refused requests reached the model
        assert c.post("/v1/embeddings", json={"model": MODEL, "input": ["a b c"] * 10}).status_code == 200
        assert Counting.batches == started + 1


def test_gzip_bodies_are_read_and_other_encodings_refused(client):
    import gzip
    import json

    body = json.dumps({"model": MODEL, "input": ["a gzip body", "two"]}).encode()
    plain = client.post("/v1/embeddings", content=body, headers={"Content-Type": "application/json"})
    zipped = client.post(
        "/v1/embeddings",
        content=gzip.compress(body),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert zipped.status_code == 200 and zipped.json()["data"] == plain.json()["data"]
    lying = client.post(
        "/v1/embeddings", content=body, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
    )
    assert_error(lying, 400, "invalid_json")
    other = client.post(
        "/v1/embeddings", content=body, headers={"Content-Type": "application/json", "Content-Encoding": "br"}
    )
    assert_error(other, 415, "unsupported_media_type")
    bomb = gzip.compress(b'{"model": "x", "input": "' + b"a" * (17 * 2**20) + b'"}')  # 17 MiB inflated
    assert len(bomb) < 100_000
    resp = client.post(
        "/v1/embeddings", content=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
    )
    assert_error(resp, 413, "body_too_large")
