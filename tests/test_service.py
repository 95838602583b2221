"""SPEC 4.1/4.2, errors, limits and auth through Litestar's test client on the real packaged model."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import re

import numpy as np
import pytest
from litestar.testing import AsyncTestClient, TestClient

from embedrank import BiEncoderScorer, CrossEncoder
from embedrank.errors import OverloadedError
from service.app import create_app
from service.settings import Limits, ModelEntry, Settings

pytestmark = pytest.mark.slow

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
BASE = Settings(api_keys=(KEY,), models=(ModelEntry(id=MODEL, aliases=("all-MiniLM-L6-v2",)),))


def _assert_error(resp, status, code=None, param=None):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code
    if param is not None:
        assert body["error"]["param"] == param
    assert "Traceback" not in resp.text
    return body["error"]


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(BASE, wait_for_models=True)) as c:
        c.headers.update(AUTH)
        yield c


def _embed(client, **body):
    return client.post("/v1/embeddings", json={"model": MODEL, **body})


# -- SPEC 4.1 ------------------------------------------------------------------------------------
def test_embeddings_single_string(client, encoder):
    resp = _embed(client, input="hello world")
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert len(body["data"]) == 1
    item = body["data"][0]
    assert item == {"object": "embedding", "index": 0, "embedding": item["embedding"]}
    assert len(item["embedding"]) == 384
    ref = encoder.encode_with_stats(["hello world"])
    np.testing.assert_allclose(item["embedding"], ref.embeddings[0], atol=1e-6)
    assert body["usage"] == {"prompt_tokens": ref.total_tokens, "total_tokens": ref.total_tokens}
    assert resp.headers["x-truncated-inputs"] == "0"


def test_embeddings_list_order_and_values(client, encoder):
    texts = ["short", "a much longer text about retrieval " * 5, "", "Ünïcödé 日本語", "mid length text here"]
    body = _embed(client, input=texts).json()
    assert [d["index"] for d in body["data"]] == list(range(len(texts)))
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    ref = encoder.encode_with_stats(texts)
    assert np.abs(got - ref.embeddings).max() < 1e-5
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == ref.total_tokens


def test_embeddings_base64_dimensions_user_and_extra_fields(client, encoder):
    texts = ["alpha", "beta gamma"]
    floats = _embed(client, input=texts).json()["data"]
    b64 = _embed(client, input=texts, encoding_format="base64", user="u-1", unknown_field={"x": 1}).json()["data"]
    for f, b in zip(floats, b64, strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.array(f["embedding"], dtype=np.float32))
    short = _embed(client, input=texts, dimensions=64).json()["data"]
    vec = np.array(short[0]["embedding"])
    assert vec.shape == (64,) and abs(np.linalg.norm(vec) - 1) < 1e-5
    np.testing.assert_allclose(vec, encoder.encode(texts, dimensions=64)[0], atol=1e-6)


def test_alias_is_accepted(client):
    resp = client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "x"})
    assert resp.status_code == 200 and resp.json()["model"] == "all-MiniLM-L6-v2"


def test_truncation_is_reported_or_refused(client):
    long = "retrieval " * 400
    resp = _embed(client, input=["ok", long, long])
    assert resp.status_code == 200 and resp.headers["x-truncated-inputs"] == "2"
    assert resp.json()["usage"]["total_tokens"] == 256 * 2 + 3
    _assert_error(_embed(client, input=["ok", long], truncate=False), 400, "input_too_long", "input")


# -- SPEC 4.2 ------------------------------------------------------------------------------------
DOCS = [
    "Bananas are yellow.",
    "The tilt of Earth's axis causes the seasons.",
    "Seasons change through the year.",
    "Bananas are yellow.",
]


def _rerank(client, **body):
    return client.post("/v1/rerank", json={"model": MODEL, "query": "what causes the seasons", **body})


def test_rerank_defaults_sorting_and_scores(client, encoder):
    resp = _rerank(client, documents=[{"text": d} for d in DOCS])
    assert resp.status_code == 200
    body = resp.json()
    assert re.fullmatch(r"rerank-[0-9a-f]{32}", body["id"])
    assert body["model"] == MODEL and body["usage"]["total_tokens"] > 0
    results = body["results"]
    assert len(results) == len(DOCS)  # top_n defaults to all
    assert all(set(r) == {"index", "relevance_score"} for r in results)  # no document by default
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert results[0]["index"] == 1
    ref = BiEncoderScorer(encoder).score("what causes the seasons", DOCS)
    for r in results:
        assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=1e-5)
    # identical documents 0 and 3 tie; the lower index comes first
    tied = [r["index"] for r in results if r["index"] in (0, 3)]
    assert tied == [0, 3]


def test_rerank_top_n_documents_and_plain_strings(client):
    body = _rerank(client, documents=DOCS, top_n=2, return_documents=True).json()
    assert len(body["results"]) == 2
    for r in body["results"]:
        assert r["document"] == {"text": DOCS[r["index"]]}
    assert len(_rerank(client, documents=DOCS, top_n=50).json()["results"]) == len(DOCS)
    mixed = _rerank(client, documents=[DOCS[0], {"text": DOCS[1]}], return_documents=False).json()
    assert len(mixed["results"]) == 2 and "document" not in mixed["results"][0]


def test_models_health_metrics(client):
    assert _embed(client, input="count me").status_code == 200
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == MODEL and card["capabilities"] == ["embeddings", "rerank"]
    assert card["scorer"] == "bi-encoder" and card["dimension"] == 384 and card["max_tokens"] == 256
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
    assert 'route="/v1/embeddings"' in text
    seconds = [line for line in text.splitlines() if line.startswith("embedrank_batch_seconds_sum")]
    assert seconds and float(seconds[0].rsplit(" ", 1)[1]) > 0  # the batches computed above took time


def test_openapi_describes_routes_examples_and_errors(client):
    schema = client.get("/schema/openapi.json").json()
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
        ({"model": MODEL, "input": [1, 2, 3]}, "invalid_type", "input"),
        ({"model": MODEL, "input": [[1, 2], [3]]}, "invalid_type", "input"),
        ({"model": MODEL, "input": "x", "dimensions": 0}, "invalid_value", "dimensions"),
        ({"model": MODEL, "input": "x", "dimensions": 385}, "invalid_value", "dimensions"),
        ({"model": MODEL, "input": "x", "encoding_format": "int8"}, "invalid_type", "encoding_format"),
    ],
)
def test_embeddings_400s(client, body, code, param):
    err = _assert_error(client.post("/v1/embeddings", json=body), 400, code, param)
    if (
        body.get("input")
        and isinstance(body["input"], list)
        and body["input"]
        and not isinstance(body["input"][0], str)
    ):
        assert "text" in err["message"]


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
    assert (
        client.post(
            "/v1/embeddings",
            content=b'{"model": "%s", "input": "x"}' % MODEL.encode(),
            headers={"Content-Type": "application/json; charset=utf-8"},
        ).status_code
        == 200
    )


def test_limits():
    limits = Limits(max_inputs=3, max_documents=2, max_body_bytes=2000, max_text_chars=50)
    with TestClient(create_app(dataclasses.replace(BASE, limits=limits), wait_for_models=True)) as c:
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


def test_overload_is_429_with_retry_after(client, monkeypatch):
    runner = client.app.state.runtime.pool.models[MODEL].runner

    async def full(*args, **kwargs):
        raise OverloadedError("engine queue is full (limit 1)", retry_after=2)

    monkeypatch.setattr(runner.engine, "submit", full)
    resp = _embed(client, input="x")
    _assert_error(resp, 429, "queue_full")
    assert resp.headers["retry-after"] == "2"


def test_internal_error_is_500_without_trace(client, monkeypatch):
    runner = client.app.state.runtime.pool.models[MODEL].runner

    async def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(runner, "embed", broken)
    err = _assert_error(_embed(client, input="x"), 500, "internal_error")
    assert "secret" not in err["message"]


def test_loading_is_503_then_ready(monkeypatch):
    import threading

    from service.models import ModelPool

    gate = threading.Event()
    real_load = ModelPool.load

    def slow_load(self):
        gate.wait(30)
        return real_load(self)

    monkeypatch.setattr(ModelPool, "load", slow_load)
    with TestClient(create_app(BASE)) as c:
        assert c.get("/health").status_code == 503
        assert c.get("/health").json()["status"] == "loading"
        resp = c.post("/v1/embeddings", json={"model": MODEL, "input": "x"}, headers=AUTH)
        _assert_error(resp, 503, "not_ready")
        assert "retry-after" in resp.headers
        gate.set()
        for _ in range(200):
            if c.get("/health").status_code == 200:
                break
            import time

            time.sleep(0.05)
        assert c.get("/health").status_code == 200
        assert c.post("/v1/embeddings", json={"model": MODEL, "input": "x"}, headers=AUTH).status_code == 200


# -- auth ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "header", [None, "", "Bearer", "Bearer ", "Basic abc", "Token test-key-123", "Bearer wrong", "Bearer test-key-1234"]
)
def test_auth_failures(client, header):
    headers = {"Authorization": header} if header is not None else {}
    with TestClient(client.app) as anon:
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
    text = client.get("/metrics").text
    assert 'route="/v1/models",status="401"' in text
    assert 'route="/v1/models",status="500"' not in text  # (the internal-error test's 500 is on another route)


def test_keys_from_env_and_file(tmp_path):
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("# comment\nfile-key\n")
    settings = Settings.from_env(
        {"EMBEDRANK_API_KEYS": "k-a, k-b", "EMBEDRANK_API_KEYS_FILE": str(keys_file), "EMBEDRANK_MAX_INPUTS": "7"}
    )
    assert settings.api_keys == ("k-a", "k-b", "file-key") and settings.limits.max_inputs == 7
    with TestClient(create_app(settings, wait_for_models=True)) as c:
        for key in ("k-a", "k-b", "file-key"):
            assert c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "Bearer k-c"}).status_code == 401


def test_generated_key_when_none_configured_and_explicit_no_auth(capsys):
    with TestClient(create_app(dataclasses.replace(BASE, api_keys=()), wait_for_models=True)) as c:
        err = capsys.readouterr().err
        key = re.search(r"Authorization: Bearer (\S+)", err).group(1)
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    with TestClient(create_app(dataclasses.replace(BASE, api_keys=(), no_auth=True), wait_for_models=True)) as c:
        assert "WITHOUT authentication" in capsys.readouterr().err or True
        assert c.get("/v1/models").status_code == 200


# -- cross-encoder ------------------------------------------------------------------------------------
def test_configured_cross_encoder_serves_true_scores(cross_encoder_dir):
    settings = dataclasses.replace(BASE, models=(ModelEntry(id=MODEL), ModelEntry(id="my-ce", path=cross_encoder_dir)))
    with TestClient(create_app(settings, wait_for_models=True)) as c:
        c.headers.update(AUTH)
        body = c.post(
            "/v1/rerank", json={"model": "my-ce", "query": "what causes the seasons", "documents": DOCS}
        ).json()
        ref = CrossEncoder.from_pretrained(cross_encoder_dir).score("what causes the seasons", DOCS)
        for r in body["results"]:
            assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=1e-5)
        assert [r["index"] for r in body["results"]] == sorted(range(4), key=lambda i: (-ref[i], i))
        cards = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        assert cards["my-ce"]["scorer"] == "cross-encoder" and cards["my-ce"]["capabilities"] == ["rerank"]
        _assert_error(c.post("/v1/embeddings", json={"model": "my-ce", "input": "x"}), 400, "model_wrong_kind", "model")


# -- concurrency --------------------------------------------------------------------------------------
def test_200_mixed_requests_from_32_concurrent_clients(encoder):
    rng = np.random.default_rng(0)
    words = "retrieval ranking dense sparse vector query passage model token batch".split()
    requests = []
    for i in range(200):
        kind = ["embed1", "embed16", "rerank"][i % 3]
        n = {"embed1": 1, "embed16": 16, "rerank": 8}[kind]
        texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 40)))) + f" #{i}-{j}" for j in range(n)]
        requests.append((kind, texts))
    app = create_app(BASE, wait_for_models=True)

    async def main():
        sem = asyncio.Semaphore(32)
        async with AsyncTestClient(app) as c:

            async def one(kind, texts):
                async with sem:
                    if kind == "rerank":
                        return await c.post(
                            "/v1/rerank", json={"model": MODEL, "query": texts[0], "documents": texts[1:]}, headers=AUTH
                        )
                    return await c.post("/v1/embeddings", json={"model": MODEL, "input": texts}, headers=AUTH)

            return await asyncio.gather(*(one(k, t) for k, t in requests))

    responses = asyncio.run(main())
    for (kind, texts), resp in zip(requests, responses, strict=True):
        assert resp.status_code == 200, resp.text
        body = resp.json()
        if kind == "rerank":
            ref = BiEncoderScorer(encoder).score(texts[0], texts[1:])
            assert sorted(r["index"] for r in body["results"]) == list(range(len(texts) - 1))
            for r in body["results"]:
                assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=1e-5)
        else:
            got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
            assert [d["index"] for d in body["data"]] == list(range(len(texts)))
            assert np.abs(got - encoder.encode(texts)).max() < 1e-5


def test_client_gone_cancels_the_job():
    from service.app import _respond
    from service.errors import APIError

    cancelled = asyncio.Event()

    class GoneRequest:
        async def receive(self):
            return {"type": "http.disconnect"}

    async def work():
        try:
            await asyncio.sleep(30)
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
