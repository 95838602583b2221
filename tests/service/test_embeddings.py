"""The OpenAI embeddings route on weightless fakes: vectors, encodings, truncation, and every malformed or
loosely typed body a 400 that names its field."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest

from tests.service.fakes import CE, ENCODER, MODEL, assert_error, embed

pytestmark = pytest.mark.kernel_free


def test_embeddings_single_string(client):
    resp = embed(client, input="hello world")
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert body["data"] == [{"object": "embedding", "index": 0, "embedding": body["data"][0]["embedding"]}]
    np.testing.assert_allclose(body["data"][0]["embedding"], ENCODER.encode(["hello world"])[0], atol=1e-7)
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}  # 2 words + 2 special tokens
    assert resp.headers["x-truncated-inputs"] == "0"


def test_embeddings_list_order_values_and_usage(client):
    texts = ["short", "a much longer text about retrieval", " ", "Ünïcödé 日本語", "mid length text"]
    body = embed(client, input=texts).json()
    assert [d["index"] for d in body["data"]] == list(range(len(texts)))
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, ENCODER.encode(texts), atol=1e-7)
    tokens = sum(ENCODER.count_tokens(texts))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_embeddings_base64_dimensions_user_and_extra_fields(client):
    texts = ["alpha beta", "beta gamma delta"]
    floats = embed(client, input=texts).json()["data"]
    b64 = embed(client, input=texts, encoding_format="base64", user="u-1", unknown_field={"x": 1}).json()["data"]
    for f, b in zip(floats, b64, strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.array(f["embedding"], dtype=np.float32))
    short = embed(client, input=texts, dimensions=8).json()["data"]
    full = ENCODER.encode(texts)[:, :8]
    expected = full / np.maximum(np.linalg.norm(full, axis=1, keepdims=True), 1e-12)
    np.testing.assert_allclose([d["embedding"] for d in short], expected, atol=1e-6)


def test_alias_is_accepted(client):
    resp = client.post("/v1/embeddings", json={"model": "fe", "input": "x"})
    assert resp.status_code == 200 and resp.json()["model"] == "fe"


def test_truncation_is_reported_or_refused_naming_the_input(client):
    long = "retrieval " * 40
    resp = embed(client, input=["ok", long, long])
    assert resp.status_code == 200 and resp.headers["x-truncated-inputs"] == "2"
    assert resp.json()["usage"]["total_tokens"] == 16 * 2 + 3
    err = assert_error(embed(client, input=["ok", long], truncate=False), 400, "input_too_long", "input")
    assert "input[1]" in err["message"] and "16" in err["message"]


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
    err = assert_error(client.post("/v1/embeddings", json=body), 400, code, param)
    assert param in err["message"]


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
    err = assert_error(resp, 400, code, param)
    if param:
        assert param in err["message"]


def test_input_42_says_what_was_wrong(client):
    err = assert_error(embed(client, input=42), 400, "invalid_type", "input")
    assert err["message"] == "input must be a string or an array of strings, got an integer"


def test_chunk_overlap_over_half_the_window_is_refused_before_any_work(client):
    text = "! " * 4100
    for overlap in (2**31 - 1, 8):  # the schema's bound, then over half of this model's 14-token window
        body = {"model": MODEL, "input": text, "chunking": True, "chunk_overlap": overlap}
        err = assert_error(client.post("/v1/embeddings", json=body), 400, param="chunk_overlap")
        assert "chunk_overlap" in err["message"]
    ok = client.post("/v1/embeddings", json={"model": MODEL, "input": text, "chunking": True}).json()
    assert ok["usage"]["total_tokens"] <= 2 * 4100 + 2 * ok["usage"]["chunked_inputs"] * 600  # at most doubled
    rerank = {"model": CE, "query": "word " * 6, "documents": [text], "chunk_overlap": 6}
    assert_error(client.post("/v1/rerank", json=rerank), 400, "chunk_overlap_too_large", "chunk_overlap")
    assert client.post("/v1/rerank", json={**rerank, "chunk_overlap": None}).status_code == 200


def test_vectors_are_written_at_float32_precision_on_every_embedding_route(client):
    texts = ["the tilt of the earth causes seasons", "bananas are rich in potassium"]
    want = ENCODER.encode(texts).astype(np.float32)  # (2, 32)

    def numbers(raw: str) -> list[str]:
        return re.findall(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", raw)

    bodies = {
        "openai": embed(client, input=texts),
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
