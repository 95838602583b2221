"""Every route, error, limit and auth case of the HTTP service, on weightless fake models (fast suite).

The fakes (:mod:`embedrank.testing.fake`) have a real model's interface and token accounting, so these
tests exercise the whole path (auth, parsing, limits, engine, shaping, errors) in milliseconds. Parity
with the real packaged model is in ``test_service_real.py``.
"""

from __future__ import annotations

import asyncio
import base64
import re
import threading

import msgspec
import numpy as np
import pytest
from litestar.testing import AsyncTestClient, TestClient

from embedrank.errors import OverloadedError
from embedrank.math.chunks import aggregate_window_scores
from embedrank.models.chunking import Chunking, split_windows
from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder
from service.app import create_app
from service.routes import DOC_PATHS
from service.settings import Auth, Engine, Limits, ModelEntry, Models, Settings, SettingsError

pytestmark = pytest.mark.kernel_free

MODEL = "fake-encoder"
CE = "fake-ce"
KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
ENCODER = FakeEncoder(MODEL, dimension=32, max_seq_length=16)
BASE = Settings(
    auth=Auth(api_keys=(KEY,)),
    models=Models(entries=(ModelEntry(id=MODEL, aliases=("fe",)),)),
    engine=Engine(batch_wait_ms=0, tune_malloc=False),
)


def fakes() -> dict:
    return {MODEL: ENCODER, CE: FakeCrossEncoder(CE, max_seq_length=16)}


def make_app(settings: Settings = BASE, **kwargs):
    return create_app(settings, wait_for_models=True, models=kwargs.pop("models", None) or fakes(), **kwargs)


def _assert_error(resp, status, code=None, param=None):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code", "request_id"}
    assert body["error"]["request_id"] == resp.headers["x-request-id"]  # the same id in the header
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code
    if param is not None:
        assert body["error"]["param"] == param
    assert "Traceback" not in resp.text
    return body["error"]


@pytest.fixture
def client(fake_service):
    with fake_service(fakes(), settings=BASE, key=KEY) as c:
        yield c


def _embed(client, **body):
    return client.post("/v1/embeddings", json={"model": MODEL, **body})


def _rerank(client, model=MODEL, **body):
    return client.post("/v1/rerank", json={"model": model, "query": "what causes the seasons", **body})


# -- SPEC 4.1 ------------------------------------------------------------------------------------
def test_embeddings_single_string(client):
    resp = _embed(client, input="hello world")
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert body["data"] == [{"object": "embedding", "index": 0, "embedding": body["data"][0]["embedding"]}]
    np.testing.assert_allclose(body["data"][0]["embedding"], ENCODER.encode(["hello world"])[0], atol=1e-7)
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}  # 2 words + 2 special tokens
    assert resp.headers["x-truncated-inputs"] == "0"


def test_embeddings_list_order_values_and_usage(client):
    texts = ["short", "a much longer text about retrieval", " ", "Ünïcödé 日本語", "mid length text"]
    body = _embed(client, input=texts).json()
    assert [d["index"] for d in body["data"]] == list(range(len(texts)))
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, ENCODER.encode(texts), atol=1e-7)
    tokens = sum(ENCODER.count_tokens(texts))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_embeddings_base64_dimensions_user_and_extra_fields(client):
    texts = ["alpha beta", "beta gamma delta"]
    floats = _embed(client, input=texts).json()["data"]
    b64 = _embed(client, input=texts, encoding_format="base64", user="u-1", unknown_field={"x": 1}).json()["data"]
    for f, b in zip(floats, b64, strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.array(f["embedding"], dtype=np.float32))
    short = _embed(client, input=texts, dimensions=8).json()["data"]
    full = ENCODER.encode(texts)[:, :8]
    expected = full / np.maximum(np.linalg.norm(full, axis=1, keepdims=True), 1e-12)
    np.testing.assert_allclose([d["embedding"] for d in short], expected, atol=1e-6)


def test_alias_is_accepted(client):
    resp = client.post("/v1/embeddings", json={"model": "fe", "input": "x"})
    assert resp.status_code == 200 and resp.json()["model"] == "fe"


def test_truncation_is_reported_or_refused_naming_the_input(client):
    long = "retrieval " * 40
    resp = _embed(client, input=["ok", long, long])
    assert resp.status_code == 200 and resp.headers["x-truncated-inputs"] == "2"
    assert resp.json()["usage"]["total_tokens"] == 16 * 2 + 3
    err = _assert_error(_embed(client, input=["ok", long], truncate=False), 400, "input_too_long", "input")
    assert "input[1]" in err["message"] and "16" in err["message"]


# -- SPEC 4.2 ------------------------------------------------------------------------------------
DOCS = [
    "Bananas are yellow.",
    "The tilt of Earth's axis causes the seasons.",
    "Seasons change through the year.",
    "Bananas are yellow.",
]


def test_rerank_defaults_sorting_and_scores(client):
    resp = _rerank(client, documents=[{"text": d} for d in DOCS])
    assert resp.status_code == 200
    body = resp.json()
    assert re.fullmatch(r"rerank-[0-9a-f]{32}", body["id"])
    assert body["model"] == MODEL
    results = body["results"]
    assert len(results) == len(DOCS)  # top_n defaults to all
    assert all(set(r) == {"index", "relevance_score"} for r in results)  # no document by default
    vectors = ENCODER.encode(["what causes the seasons", *DOCS])
    ref = vectors[1:] @ vectors[0]
    for r in results:
        assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=1e-6)
    assert [r["index"] for r in results] == sorted(range(4), key=lambda i: (-round(float(ref[i]), 6), i))
    assert [r["index"] for r in results if r["index"] in (0, 3)] == [0, 3]  # identical documents: lower index first
    assert body["usage"]["total_tokens"] == sum(ENCODER.count_tokens(["what causes the seasons", *DOCS]))
    assert resp.headers["x-truncated-inputs"] == "0"


def test_rerank_top_n_documents_and_plain_strings(client):
    body = _rerank(client, documents=DOCS, top_n=2, return_documents=True).json()
    assert len(body["results"]) == 2
    for r in body["results"]:
        assert r["document"] == {"text": DOCS[r["index"]]}
    assert len(_rerank(client, documents=DOCS, top_n=50).json()["results"]) == len(DOCS)
    mixed = _rerank(client, documents=[DOCS[0], {"text": DOCS[1]}], return_documents=False).json()
    assert len(mixed["results"]) == 2 and "document" not in mixed["results"][0]


def test_rerank_truncate_false_names_the_field_and_index(client):
    long = "season " * 40
    one = {"max_chunks_per_doc": 1}  # the first window only: what truncation scored
    err = _assert_error(_rerank(client, documents=["ok", "fine", long], truncate=False, **one), 400, "input_too_long")
    assert err["param"] == "documents" and "documents[2]" in err["message"]
    err = _assert_error(
        client.post("/v1/rerank", json={"model": MODEL, "query": long, "documents": ["a"], "truncate": False}),
        400,
        "input_too_long",
        "query",
    )
    err = _assert_error(_rerank(client, model=CE, documents=["ok", long], truncate=False, **one), 400, "input_too_long")
    assert err["param"] == "documents" and "documents[1]" in err["message"]
    resp = _rerank(client, documents=["ok", long], **one)
    assert resp.status_code == 200 and resp.headers["x-truncated-inputs"] == "1"
    chunked = _rerank(client, documents=["ok", long], truncate=False)  # chunked by default: nothing left out
    assert chunked.status_code == 200 and chunked.headers["x-truncated-inputs"] == "0"
    assert chunked.json()["usage"]["chunked_documents"] == 1


def test_cross_encoder_serves_its_scores_and_refuses_embeddings(client):
    body = _rerank(client, model=CE, documents=DOCS, max_chunks_per_doc=1).json()
    ref = FakeCrossEncoder(max_seq_length=16).score_batch([("what causes the seasons", d) for d in DOCS]).values
    assert {r["index"]: r["relevance_score"] for r in body["results"]} == pytest.approx(dict(enumerate(ref.tolist())))
    assert [r["index"] for r in body["results"]] == sorted(range(4), key=lambda i: (-ref[i], i))
    _assert_error(client.post("/v1/embeddings", json={"model": CE, "input": "x"}), 400, "model_wrong_kind", "model")


def test_models_health_metrics(client):
    assert _embed(client, input="count me").status_code == 200
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert cards[MODEL]["capabilities"] == ["embeddings", "rerank"] and cards[MODEL]["scorer"] == "bi-encoder"
    assert cards[MODEL]["dimension"] == 32 and cards[MODEL]["max_tokens"] == 16 and cards[MODEL]["aliases"] == ["fe"]
    assert cards[CE]["capabilities"] == ["rerank"] and cards[CE]["scorer"] == "cross-encoder"
    assert client.get("/health", headers={"Authorization": ""}).json()["status"] == "ok"
    text = client.get("/metrics").text
    for name in (
        "embedrank_requests_total",
        "embedrank_request_seconds",
        "embedrank_batch_size",
        "embedrank_batch_seconds",
        "embedrank_queue_depth",
        "embedrank_tokens_total",
        "embedrank_dropped_items",
    ):
        assert name in text
    assert 'embedrank_requests_total{method="POST",route="/v1/embeddings",status="200"} 1.0' in text
    assert f'embedrank_tokens_total{{model="{MODEL}"}} 4.0' in text  # "count me": 2 words + 2 special tokens


def test_every_served_route_is_counted_under_its_own_path(client):
    from service.app import ROUTES

    served = {route.path for route in client.app.routes if not route.path.startswith("/docs")}  # Litestar's pages
    assert served == ROUTES
    assert client.post("/v1/tokenize", json={"model": MODEL, "input": "count me"}).status_code == 200
    text = client.get("/metrics").text
    assert 'embedrank_requests_total{method="POST",route="/v1/tokenize",status="200"} 1.0' in text


def test_openapi_describes_routes_examples_and_errors(client):
    schema = client.get("/openapi.json").json()
    text = client.get("/openapi.json").text
    assert "SPEC" not in text and "shared/" not in text  # the description speaks for itself, no outside file
    for path in ("/v1/embeddings", "/v1/rerank", "/v1/models", "/health", "/metrics"):
        assert path in schema["paths"]
    post = schema["paths"]["/v1/embeddings"]["post"]
    assert {"400", "401", "404", "413", "415", "429", "503"} <= set(post["responses"])
    content = post["requestBody"]["content"]["application/json"]
    assert content.get("examples") or content["schema"].get("examples")
    assert schema["paths"]["/v1/rerank"]["post"]["responses"]["200"]["content"]["application/json"].get("examples")
    components = schema["components"]["schemas"]
    assert {"EmbeddingsRequest", "RerankRequest", "EmbeddingList", "RerankResponse", "ErrorResponse"} <= set(components)


# -- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"model": MODEL}, "missing_field", "input"),
        ({"input": "x"}, "missing_field", "model"),
        ({"model": MODEL, "input": 5}, "invalid_type", "input"),
        ({"model": MODEL, "input": []}, "empty_input", "input"),
        ({"model": MODEL, "input": [[1, 2], [100256]]}, "invalid_value", "input"),  # not a cl100k_base token
        ({"model": MODEL, "input": ["text", 5]}, "invalid_type", "input"),  # texts mixed with bare ids
        ({"model": MODEL, "input": [[]]}, "empty_input", "input"),
        ({"model": MODEL, "input": [-1]}, "invalid_value", "input"),
        ({"model": MODEL, "input": "x", "dimensions": 0}, "invalid_value", "dimensions"),
        ({"model": MODEL, "input": "x", "dimensions": 33}, "invalid_value", "dimensions"),
        ({"model": MODEL, "input": "x", "encoding_format": "int8"}, "invalid_type", "encoding_format"),
    ],
)
def test_embeddings_400s(client, body, code, param):
    err = _assert_error(client.post("/v1/embeddings", json=body), 400, code, param)
    assert param in err["message"]


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"query": "q", "documents": []}, "empty_documents", "documents"),
        ({"query": "  ", "documents": ["a"]}, "empty_query", "query"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "invalid_value", "top_n"),
        ({"query": "q"}, "missing_field", "documents"),
        ({"query": "q", "documents": [{"content": "a"}]}, None, None),
    ],
)
def test_rerank_400s(client, body, code, param):
    _assert_error(client.post("/v1/rerank", json={"model": MODEL, **body}), 400, code, param)


def test_malformed_json_wrong_method_media_type_unknown_model(client):
    _assert_error(
        client.post("/v1/embeddings", content=b'{"model": ', headers={"Content-Type": "application/json"}),
        400,
        "invalid_json",
    )
    err = _assert_error(client.get("/v1/embeddings"), 405, "method_not_allowed")
    assert "POST" in err["message"]
    _assert_error(client.post("/v1/embeddings", content=b"{}", headers={"Content-Type": "text/plain"}), 415)
    _assert_error(client.post("/v1/embeddings", content=b"{}", headers={"Content-Type": ""}), 415)
    err = _assert_error(
        client.post("/v1/embeddings", json={"model": "nope", "input": "x"}), 404, "model_not_found", "model"
    )
    assert "nope" in err["message"]
    _assert_error(
        client.post("/v1/rerank", json={"model": "nope", "query": "q", "documents": ["a"]}), 404, "model_not_found"
    )
    _assert_error(client.get("/v1/nothing-here"), 404, "not_found")
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
        err = _assert_error(c.post("/v1/embeddings", json={"model": MODEL, "input": ["a"] * 4}), 400, "too_many_inputs")
        assert "max_inputs=3" in err["message"]
        err = _assert_error(
            c.post("/v1/rerank", json={"model": MODEL, "query": "q", "documents": ["a"] * 3}), 400, "too_many_documents"
        )
        assert "max_documents=2" in err["message"]
        err = _assert_error(c.post("/v1/embeddings", json={"model": MODEL, "input": "x" * 51}), 400, "text_too_long")
        assert "max_text_chars=50" in err["message"]
        _assert_error(
            c.post("/v1/rerank", json={"model": MODEL, "query": "q" * 51, "documents": ["a"]}),
            400,
            "text_too_long",
            "query",
        )
        _assert_error(c.post("/v1/embeddings", json={"model": MODEL, "input": ["y" * 40] * 3 + ["z" * 2000]}), 413)


def test_overload_is_429_with_retry_after(client):
    runner = client.app.state.service.pool.models[MODEL].runner

    async def full(*args, **kwargs):
        raise OverloadedError("engine queue is full (limit 1)", retry_after=2)

    runner.engine.submit = full
    resp = _embed(client, input="x")
    _assert_error(resp, 429, "queue_full")
    assert resp.headers["retry-after"] == "2"


def test_internal_error_is_500_without_trace(client):
    runner = client.app.state.service.pool.models[MODEL].runner

    async def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    runner.embed = broken
    err = _assert_error(_embed(client, input="x"), 500, "internal_error")
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
        assert re.fullmatch(r"req_[0-9a-f]{24}", _assert_error(got, 400)["request_id"]), sent
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
        _assert_error(sent, 500, "internal_error")
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
        _assert_error(resp, 503, "not_ready")
        assert "retry-after" in resp.headers
        gate.set()
        assert loaded.wait(30)
        for _ in range(1000):  # the lifespan task flips the status right after load returns
            if c.get("/health").status_code == 200:
                break
        assert c.get("/health").status_code == 200
        assert c.post("/v1/embeddings", json={"model": MODEL, "input": "x"}, headers=AUTH).status_code == 200


# -- auth ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "header", [None, "", "Bearer", "Bearer ", "Basic abc", "Token test-key-123", "Bearer wrong", "Bearer test-key-1234"]
)
def test_auth_failures(header):
    headers = {"Authorization": header} if header is not None else {}
    with TestClient(make_app()) as anon:
        for method, path in (
            ("post", "/v1/embeddings"),
            ("post", "/v1/rerank"),
            ("get", "/v1/models"),
            ("get", "/metrics"),
        ):
            resp = getattr(anon, method)(path, headers=headers, **({"json": {}} if method == "post" else {}))
            _assert_error(resp, 401, "invalid_api_key")
            assert resp.headers["www-authenticate"] == "Bearer"
            assert KEY not in resp.text
        assert anon.get("/health", headers=headers).status_code == 200
        # /metrics counts refused requests as what they got: 401, never 500
        text = anon.get("/metrics", headers=AUTH).text
        assert 'route="/v1/models",status="401"' in text
        assert 'status="500"' not in text


def test_keys_from_env_and_file(tmp_path):
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("# comment\nfile-key\n")
    settings = Settings.from_env(
        {"EMBEDRANK_API_KEYS": "k-a, k-b", "EMBEDRANK_API_KEYS_FILE": str(keys_file), "EMBEDRANK_MAX_INPUTS": "7"}
    )
    assert settings.auth.api_keys == ("k-a", "k-b", "file-key") and settings.limits.max_inputs == 7
    with TestClient(make_app(settings)) as c:
        for key in ("k-a", "k-b", "file-key"):
            assert c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "Bearer k-c"}).status_code == 401


def test_generated_key_when_none_configured(capsys):
    with TestClient(make_app(msgspec.structs.replace(BASE, auth=Auth()))) as c:
        key = re.search(r"Authorization: Bearer (\S+)", capsys.readouterr().err).group(1)
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_explicit_no_auth_warns(capsys):
    with TestClient(make_app(msgspec.structs.replace(BASE, auth=Auth(no_auth=True)))) as c:
        assert "WITHOUT authentication" in capsys.readouterr().err
        assert c.get("/v1/models").status_code == 200


# -- concurrency --------------------------------------------------------------------------------------
def test_200_mixed_requests_from_32_concurrent_clients():
    rng = np.random.default_rng(0)
    words = "retrieval ranking dense sparse vector query passage model token batch".split()
    requests = []
    for i in range(200):
        kind = ["embed1", "embed16", "rerank", "ce"][i % 4]
        n = {"embed1": 1, "embed16": 16, "rerank": 8, "ce": 8}[kind]
        texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 12)))) + f" n{i}x{j}" for j in range(n)]
        requests.append((kind, texts))
    app = create_app(
        msgspec.structs.replace(BASE, engine=Engine(tune_malloc=False)), wait_for_models=True, models=fakes()
    )
    scorer = FakeCrossEncoder(CE, max_seq_length=16)

    async def main():
        sem = asyncio.Semaphore(32)
        async with AsyncTestClient(app) as c:

            async def one(kind, texts):
                async with sem:
                    if kind in ("rerank", "ce"):
                        body = {
                            "model": CE if kind == "ce" else MODEL,
                            "query": texts[0],
                            "documents": texts[1:],
                            "max_chunks_per_doc": 1,  # compared with whole-document scoring below
                        }
                        return await c.post("/v1/rerank", json=body, headers=AUTH)
                    return await c.post("/v1/embeddings", json={"model": MODEL, "input": texts}, headers=AUTH)

            return await asyncio.gather(*(one(k, t) for k, t in requests))

    responses = asyncio.run(main())
    for (kind, texts), resp in zip(requests, responses, strict=True):
        assert resp.status_code == 200, resp.text
        body = resp.json()
        if kind == "rerank":
            vectors = ENCODER.encode(texts)
            ref = vectors[1:] @ vectors[0]
        elif kind == "ce":  # the first window of each document, sized to fit next to the query
            one = Chunking(max_chunks=1)
            windows = split_windows(texts[1:], scorer.token_offsets, window=scorer.chunk_window(texts[0]), chunking=one)
            window_scores = scorer.score_batch([(texts[0], t) for t in windows.texts]).values
            ref = aggregate_window_scores(window_scores, windows.owners, len(texts) - 1)
        else:
            got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
            assert [d["index"] for d in body["data"]] == list(range(len(texts)))
            np.testing.assert_allclose(got, ENCODER.encode(texts), atol=1e-6)
            continue
        assert sorted(r["index"] for r in body["results"]) == list(range(len(texts) - 1))
        for r in body["results"]:
            assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=1e-6)


def test_client_gone_cancels_the_job():
    from service.errors import APIError
    from service.handling import respond as _respond

    cancelled = asyncio.Event()

    class GoneRequest:
        async def receive(self):
            return {"type": "http.disconnect"}

    async def work():
        try:
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return None, 0

    async def main():
        with pytest.raises(APIError) as info:
            await _respond(GoneRequest(), work())
        assert info.value.status == 499
        await asyncio.sleep(0)
        assert cancelled.is_set()

    asyncio.run(main())


# -- hostile and loosely typed bodies: every client mistake is a 4xx that names the field ----------------
@pytest.mark.parametrize(
    ("body", "headers", "code", "param"),
    [
        (b'{"model":"fake-encoder","input":"abc\xff\xfe"}', {}, "invalid_json", None),
        ('{"model":"fake-encoder","input":"caf\xe9"}'.encode("latin-1"), {"charset": "latin-1"}, "invalid_json", None),
        (b'{"model":"fake-encoder","input":' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, "invalid_json", None),
        (
            b'{"model":"fake-encoder","input":"x","extra":' + b'{"a":' * 99_999 + b"1" + b"}" * 100_000,
            {},
            "invalid_json",
            None,
        ),
        (b'{"model":"fake-encoder","input":"x","dimensions":"10"}', {}, "invalid_type", "dimensions"),
        (b'{"model":"fake-encoder","input":"x","dimensions":10.5}', {}, "invalid_type", "dimensions"),
        (b'{"model":"fake-encoder","input":"x","dimensions":"1e1"}', {}, "invalid_type", "dimensions"),
        (b'{"model":"fake-encoder","input":"x","truncate":0}', {}, "invalid_type", "truncate"),
        (b'{"model":"fake-encoder","input":"x","truncate":"false"}', {}, "invalid_type", "truncate"),
        (b'{"model":"fake-encoder","input":42}', {}, "invalid_type", "input"),
        (b'{"model":"fake-encoder","input":""}', {}, "empty_input", "input"),
        (b'{"model":"fake-encoder","input":["a",""]}', {}, "empty_input", "input"),
        (b'{"model":"fake-encoder","input":"x","dimensions":0}', {}, "invalid_value", "dimensions"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_hostile_and_loose_embeddings_bodies(client, body, headers, code, param):
    content_type = "application/json" + (f"; charset={headers['charset']}" if headers else "")
    resp = client.post("/v1/embeddings", content=body, headers={"Content-Type": content_type})
    err = _assert_error(resp, 400, code, param)
    if param:
        assert param in err["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"top_n": "2"}, "top_n"), ({"return_documents": 1}, "return_documents"), ({"top_n": 0}, "top_n")],
)
def test_rerank_fields_are_not_coerced(client, extra, param):
    _assert_error(_rerank(client, documents=["a", "b"], **extra), 400, None, param)


def test_input_42_says_what_was_wrong(client):
    err = _assert_error(_embed(client, input=42), 400, "invalid_type", "input")
    assert err["message"] == "input must be a string or an array of strings, got an integer"


def test_schema_states_the_limits_the_server_enforces(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    emb, rr = schemas["EmbeddingsRequest"]["properties"], schemas["RerankRequest"]["properties"]
    text = str(emb["input"])
    assert "'minLength': 1" in text and "'minItems': 1" in text
    assert "'minimum': 1" in str(emb["dimensions"]) and "'minimum': 1" in str(rr["top_n"])
    assert rr["query"]["minLength"] == 1 and rr["documents"]["minItems"] == 1
    paths = client.get("/openapi.json").json()["paths"]
    assert paths["/health"]["get"]["security"] == []  # documented as open, as it is
    assert "401" in paths["/metrics"]["get"]["responses"]
    assert "408" in paths["/v1/embeddings"]["post"]["responses"]


def test_schema_names_the_served_models_and_limits(client):
    """``model`` is an enum of the ids and aliases ``/v1/models`` lists for the route; limits are bounds."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    emb, rr = schemas["EmbeddingsRequest"]["properties"], schemas["RerankRequest"]["properties"]
    cards = client.get("/v1/models").json()["data"]
    served = {
        cap: {name for m in cards if cap in m["capabilities"] for name in [m["id"], *m["aliases"]]}
        for cap in ("embeddings", "rerank")
    }
    assert set(emb["model"]["enum"]) == served["embeddings"] and set(rr["model"]["enum"]) == served["rerank"]
    assert emb["dimensions"]["oneOf"][0]["maximum"] == max(m["dimension"] for m in cards if m["dimension"])
    texts = emb["input"]["oneOf"][1]
    assert texts["maxItems"] == 2048 and texts["items"]["oneOf"][0]["maxLength"] == 100_000  # texts or id arrays
    assert rr["documents"]["maxItems"] == 1000 and rr["query"]["maxLength"] == 100_000


def test_integral_numbers_are_integers_as_json_schema_says(client):
    """JSON Schema's integer is any number with a zero fraction: 10.0 is 10, 10.5 and "10" are refused."""
    resp = _embed(client, input="x", dimensions=10.0)
    assert resp.status_code == 200 and len(resp.json()["data"][0]["embedding"]) == 10
    assert _rerank(client, documents=["a", "b", "c"], top_n=2.0).json()["results"].__len__() == 2


def test_head_health_and_long_model_names(client):
    assert client.head("/health").status_code == 200
    err = _assert_error(client.post("/v1/embeddings", json={"model": "m" * 100_000, "input": "x"}), 404)
    assert len(err["message"]) < 400 and "100000 characters" in err["message"]


def test_client_gone_mid_body_is_499_not_500():
    app = make_app()

    async def main():
        async with AsyncTestClient(app) as c:
            sent = []
            messages = [
                {"type": "http.request", "body": b'{"model": "fake', "more_body": True},
                {"type": "http.disconnect"},
            ]

            async def receive():
                return messages.pop(0) if messages else {"type": "http.disconnect"}

            async def send(message):
                sent.append(message)

            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "POST",
                "scheme": "http",
                "path": "/v1/embeddings",
                "raw_path": b"/v1/embeddings",
                "query_string": b"",
                "root_path": "",
                "headers": [(b"content-type", b"application/json"), (b"authorization", f"Bearer {KEY}".encode())],
                "client": ("127.0.0.1", 1234),
                "server": ("testserver", 80),
                "state": {},
            }
            await app(scope, receive, send)
            assert sent[0]["status"] == 499
            return (await c.get("/metrics", headers=AUTH)).text

    text = asyncio.run(main())
    assert 'route="/v1/embeddings",status="499"' in text and 'status="500"' not in text


# -- security ----------------------------------------------------------------------------------------
def _route_table(app):
    for route in app.routes:
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        for method in sorted(getattr(route, "methods", ())):
            yield method, path


def test_every_route_but_health_needs_the_key():
    app = make_app()
    table = sorted(set(_route_table(app)))
    assert ("POST", "/v1/embeddings") in table and ("GET", "/schema/openapi.json") in table
    with TestClient(app) as c:
        unknown = [("GET", "/v1/nope"), ("POST", "/admin"), ("DELETE", "/v1/embeddings"), ("GET", "/v1/rerank")]
        for method, path in [*table, *unknown]:  # OPTIONS too: CORS is off, so no preflight is open
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer  {KEY}"}):
                resp = c.request(method, path, headers=headers)
                if path == "/health":
                    assert resp.status_code in (200, 204), (method, path)
                elif path in DOC_PATHS:  # the API's description and its pages: open (public_docs)
                    assert resp.status_code != 401, (method, path)
                else:
                    assert resp.status_code == 401, (method, path, headers, resp.status_code)
        assert c.get("/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200  # RFC 7235
        assert c.get("/v1/nope", headers=AUTH).status_code == 404  # with the key: what the path is
        assert c.delete("/v1/embeddings", headers=AUTH).status_code == 405
        assert c.options("/v1/embeddings", headers=AUTH).status_code == 204


def test_the_api_description_and_its_pages_are_open_unless_closed():
    with TestClient(make_app()) as c:
        document = c.get("/openapi.json")
        assert document.status_code == 200 and document.json() == c.get("/docs/openapi.json").json()
        assert document.json() == c.get("/schema/openapi.json").json()  # where it was before
        assert "/v1/embeddings" in document.json()["paths"] and "/openapi.json" not in document.json()["paths"]
        for page, marker in (("/docs", "swagger-ui"), ("/docs/redoc", "redoc")):
            shown = c.get(page)
            assert shown.status_code == 200 and marker in shown.text.lower() and '"/v1/embeddings"' in shown.text
    closed = Settings.from_env({"EMBEDRANK_API_KEYS": KEY, "EMBEDRANK_PUBLIC_DOCS": "false"})
    with TestClient(make_app(closed)) as c:
        for path in ("/openapi.json", "/docs", "/docs/redoc", "/docs/openapi.json"):
            assert c.get(path).status_code == 401 and c.get(path, headers=AUTH).status_code == 200, path


def test_cors_is_off_by_default_and_configurable():
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    with TestClient(make_app()) as c:
        resp = c.options("/v1/embeddings", headers=preflight)
        assert "access-control-allow-origin" not in resp.headers
    settings = Settings.from_env({"EMBEDRANK_API_KEYS": KEY, "EMBEDRANK_CORS_ORIGINS": "https://app.example"})
    with TestClient(make_app(settings)) as c:
        resp = c.options(
            "/v1/embeddings", headers={**preflight, "Access-Control-Request-Headers": "authorization,content-type"}
        )
        assert resp.headers["access-control-allow-origin"] == "https://app.example"
        resp = c.post(
            "/v1/embeddings", json={"model": MODEL, "input": "x"}, headers={**AUTH, "Origin": "https://app.example"}
        )
        assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == "https://app.example"
        other = c.options("/v1/embeddings", headers={**preflight, "Origin": "https://evil.example"})
        assert other.headers.get("access-control-allow-origin") != "https://evil.example"
        # a browser deletes its uploaded files and reads the request id of every answer
        delete = c.options("/v1/files/file-abc", headers={**preflight, "Access-Control-Request-Method": "DELETE"})
        assert delete.status_code in (200, 204) and "DELETE" in delete.headers["access-control-allow-methods"]
        assert resp.headers["access-control-expose-headers"] == "x-request-id"


def test_priority_is_accepted_and_typed(client):
    assert _embed(client, input="x", priority=-5).status_code == 200
    assert _rerank(client, documents=["a"], priority=3).status_code == 200
    _assert_error(_embed(client, input="x", priority="high"), 400, "invalid_type", "priority")


def test_engine_serves_a_lower_priority_value_first():
    from embedrank.serving.scheduler import FairQueue, QueuedJob

    q = FairQueue()
    normal, urgent = QueuedJob(est=[10] * 3), QueuedJob(est=[10], priority=-1)
    q.push(normal)
    q.push(urgent)
    assert q.take(max_tokens=10, max_size=1)[0][0] is urgent


def test_backend_and_precision_per_model_from_env_and_toml(tmp_path):
    env = {
        "EMBEDRANK_MODELS": "a=sentence-transformers/all-MiniLM-L6-v2@openvino:int8,b=all-MiniLM-L6-v2@torch,c",
        "EMBEDRANK_PRECISION": "int8",
    }
    with pytest.raises(SettingsError, match=r"model 'b': backend 'torch' runs precision fp32, bf16, fp16; got 'int8'"):
        Settings.from_env(env)
    ok = Settings.from_env({**env, "EMBEDRANK_PRECISION": ""})
    got = [(m.id, m.path, m.backend, m.precision) for m in ok.models.entries]
    assert got == [
        ("a", "sentence-transformers/all-MiniLM-L6-v2", "openvino", "int8"),
        ("b", "all-MiniLM-L6-v2", "torch", None),
        ("c", None, None, None),
    ]
    default = Settings.from_env({"EMBEDRANK_BACKEND": "torch"}).models.entries
    assert [(m.id, m.backend) for m in default] == [("sentence-transformers/all-MiniLM-L6-v2", "torch")]
    with pytest.raises(SettingsError, match="unknown backend 'cuda'"):
        Settings.from_env({"EMBEDRANK_BACKEND": "cuda"})
    with pytest.raises(SettingsError, match="@backend"):
        Settings.from_env({"EMBEDRANK_MODELS": "m@"})
    toml = tmp_path / "embedrank.toml"
    toml.write_text(
        'backend = "onnx"\n[[models]]\nid = "m1"\npath = "all-MiniLM-L6-v2"\n'
        '[[models]]\nid = "m2"\npath = "all-MiniLM-L6-v2"\nbackend = "openvino"\nprecision = "bf16"\n'
    )
    models = Settings.from_env({"EMBEDRANK_CONFIG": str(toml)}).models.entries
    assert [(m.id, m.backend, m.precision) for m in models] == [("m1", "onnx", None), ("m2", "openvino", "bf16")]


def test_models_card_reports_backend(client):
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert (cards[MODEL]["backend"], cards[MODEL]["precision"], cards[MODEL]["inference_precision"]) == (
        "fake",
        "fp32",
        "f32",
    )


def test_a_body_is_decoded_once(client, monkeypatch):
    """The strict decoder's value is what the handler gets: Litestar does not parse the JSON again."""
    import litestar.connection.request

    def refuse(*args, **kwargs):
        raise AssertionError("the body was decoded a second time")

    monkeypatch.setattr(litestar.connection.request, "decode_json", refuse)
    assert _embed(client, input=["once"]).status_code == 200
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
    err = _assert_error(resp, 400, param=param)
    assert param in err["message"]


def test_a_keys_file_without_keys_or_not_utf8_stops_the_start(tmp_path):
    empty = tmp_path / "keys"
    empty.write_text("# keys go here\n\n")
    with pytest.raises(SettingsError, match=r"EMBEDRANK_API_KEYS_FILE=.*holds no key"):
        Settings.from_env({"EMBEDRANK_API_KEYS_FILE": str(empty)})
    latin = tmp_path / "latin"
    latin.write_bytes("clé\n".encode("latin-1"))
    with pytest.raises(SettingsError, match=r"EMBEDRANK_API_KEYS_FILE=.*not UTF-8"):
        Settings.from_env({"EMBEDRANK_API_KEYS_FILE": str(latin)})


def test_an_over_long_query_is_named_query(client):
    body = {"model": MODEL, "query": "word " * 40, "documents": ["a"], "truncate": False}
    err = _assert_error(client.post("/v1/rerank", json=body), 400, "input_too_long", "query")
    assert err["message"].startswith("query is longer"), err["message"]


def test_chunk_overlap_over_half_the_window_is_refused_before_any_work(client):
    text = "! " * 4100
    for overlap in (2**31 - 1, 8):  # the schema's bound, then over half of this model's 14-token window
        body = {"model": MODEL, "input": text, "chunking": True, "chunk_overlap": overlap}
        err = _assert_error(client.post("/v1/embeddings", json=body), 400, param="chunk_overlap")
        assert "chunk_overlap" in err["message"]
    ok = client.post("/v1/embeddings", json={"model": MODEL, "input": text, "chunking": True}).json()
    assert ok["usage"]["total_tokens"] <= 2 * 4100 + 2 * ok["usage"]["chunked_inputs"] * 600  # at most doubled
    rerank = {"model": CE, "query": "word " * 6, "documents": [text], "chunk_overlap": 6}
    _assert_error(client.post("/v1/rerank", json=rerank), 400, "chunk_overlap_too_large", "chunk_overlap")
    assert client.post("/v1/rerank", json={**rerank, "chunk_overlap": None}).status_code == 200


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
            err = _assert_error(c.post(path, json=body), 413, "request_too_large")
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
    _assert_error(lying, 400, "invalid_json")
    other = client.post(
        "/v1/embeddings", content=body, headers={"Content-Type": "application/json", "Content-Encoding": "br"}
    )
    _assert_error(other, 415, "unsupported_media_type")
    bomb = gzip.compress(b'{"model": "x", "input": "' + b"a" * (17 * 2**20) + b'"}')  # 17 MiB inflated
    assert len(bomb) < 100_000
    resp = client.post(
        "/v1/embeddings", content=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
    )
    _assert_error(resp, 413, "body_too_large")


def test_int8_ranges_are_fitted_before_the_service_is_ready(fake_service):
    class Counting(FakeEncoder):
        fits = 0

        def embed_for_ranges(self, texts, *, normalize):
            Counting.fits += 1
            return super().embed_for_ranges(texts, normalize=normalize)

    with fake_service({MODEL: Counting(MODEL, dimension=32)}, key=KEY, settings=BASE) as c:
        assert Counting.fits == 1  # at startup
        body = {"model": MODEL, "input": ["a b", "c d"], "embedding_types": ["int8", "uint8"], "dimensions": 16}
        assert c.post("/v1/embeddings", json=body).status_code == 200
        assert Counting.fits == 1  # no request pays for them


def test_a_query_is_blank_by_json_schemas_whitespace(client):
    """The schema says a query matches ``\\S`` (ECMA-262): U+0085 is not whitespace there, so it is a query."""
    ok = client.post("/v1/rerank", json={"model": MODEL, "query": "\u0085", "documents": ["a"]})
    assert ok.status_code == 200, ok.text
    blank = client.post("/v1/rerank", json={"model": MODEL, "query": " \t\u3000", "documents": ["a"]})
    _assert_error(blank, 400, "empty_query", "query")


def test_vectors_are_written_at_float32_precision_on_every_embedding_route(client):
    texts = ["the tilt of the earth causes seasons", "bananas are rich in potassium"]
    want = ENCODER.encode(texts).astype(np.float32)  # (2, 32)

    def numbers(raw: str) -> list[str]:
        return re.findall(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", raw)

    bodies = {
        "openai": _embed(client, input=texts),
        "tei": client.post("/embed", json={"inputs": texts, "model": MODEL}),
        "cohere": client.post("/v2/embed", json={"model": MODEL, "texts": texts, "input_type": "search_document"}),
    }
    for route, resp in bodies.items():
        assert resp.status_code == 200, (route, resp.text)
        body = resp.json()
        got = {
            "openai": lambda b: [d["embedding"] for d in b["data"]],
            "tei": lambda b: b,
            "cohere": lambda b: b["embeddings"]["float"],
        }[route](body)
        # each number reads back to exactly the model's float32 value ...
        np.testing.assert_array_equal(np.asarray(got, dtype=np.float32), want, err_msg=route)
        # ... and is written with no more digits than float32 needs (not float64's 17)
        vector_text = resp.text[resp.text.index("[") :]
        digits = [
            len(n.lstrip("-").split("e")[0].split("E")[0].replace(".", "").lstrip("0")) for n in numbers(vector_text)
        ]
        assert max(digits) <= 9, (route, max(digits))


def test_the_manuals_http_reference_is_the_served_description_rendered():
    """docs/http-api.md is what a default server's /openapi.json says, rendered: every route, its body and its
    error codes, and every schema's fields."""
    from pathlib import Path

    from service.openapi_reference import openapi_document, render_reference

    with TestClient(make_app(Settings(auth=Auth(api_keys=(KEY,)), engine=Engine(tune_malloc=False)))) as c:
        served = c.get("/openapi.json").json()
    document = openapi_document()
    assert document["paths"].keys() == served["paths"].keys()
    assert document["components"]["schemas"].keys() == served["components"]["schemas"].keys()
    page = (Path(__file__).resolve().parents[2] / "docs" / "http-api.md").read_text()
    assert page == render_reference(document), "run: python -m service.openapi_reference > docs/http-api.md"
    for path, item in document["paths"].items():
        for method in item:
            assert f"`{path}`" in page, (method, path)
    for name in document["components"]["schemas"]:
        assert f"### {name}\n" in page
