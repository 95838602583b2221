"""Prompts and token counts through the service, on fake models: query/document prompts (``input_type``, ``prompt_name``)
and ``POST /v1/tokenize``, including every bad value."""

from __future__ import annotations

import numpy as np
import pytest

from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder

pytestmark = pytest.mark.kernel_free

KEY = "k"
PROMPTED = FakeEncoder("e5-like", dimension=32, max_seq_length=16, prompts={"query": "query: ", "passage": "passage: "})
PLAIN = FakeEncoder("plain", dimension=32, max_seq_length=16)


@pytest.fixture(scope="module")
def client(fake_service):
    models = {"e5-like": PROMPTED, "plain": PLAIN, "ce": FakeCrossEncoder("ce", max_seq_length=16)}
    with fake_service(models, key=KEY) as c:
        yield c


def _vector(resp) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    return np.array(resp.json()["data"][0]["embedding"], dtype=np.float32)


@pytest.mark.parametrize(
    ("fields", "prefix"),
    [
        ({"input_type": "query"}, "query: "),
        ({"input_type": "search_query"}, "query: "),
        ({"input_type": "search_document"}, "passage: "),
        ({"input_type": "document"}, "passage: "),
        ({"prompt_name": "passage"}, "passage: "),
        ({"input_type": "clustering"}, ""),  # the model has no clustering prompt: none
        ({}, ""),  # no default prompt
    ],
)
def test_input_type_and_prompt_name_select_the_models_prompt(client, fields, prefix):
    text = "tilt of the earth axis"
    resp = client.post("/v1/embeddings", json={"model": "e5-like", "input": text, **fields})
    np.testing.assert_allclose(_vector(resp), PROMPTED.encode([prefix + text])[0], atol=1e-6)
    assert resp.json()["usage"]["prompt_tokens"] == PROMPTED.count_tokens([prefix + text], prompt="")[0]


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"prompt_name": "doc"}, "prompt_name", ["'doc'", "passage", "query"]),
        ({"input_type": "question"}, "input_type", ["input_type"]),
        ({"input_type": "query", "prompt_name": "query"}, "prompt_name", ["not both"]),
        ({"prompt_name": 3}, "prompt_name", ["string"]),
    ],
)
def test_bad_prompt_fields_are_400_naming_the_field(client, fields, param, words):
    resp = client.post("/v1/embeddings", json={"model": "e5-like", "input": "x", **fields})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param
    for word in words:
        assert word in err["message"]


def test_unknown_prompt_name_on_a_model_without_prompts(client):
    resp = client.post("/v1/embeddings", json={"model": "plain", "input": "x", "prompt_name": "query"})
    assert resp.status_code == 400 and "prompts: none" in resp.json()["error"]["message"]
    ok = client.post("/v1/embeddings", json={"model": "plain", "input": "x", "input_type": "search_query"})
    np.testing.assert_allclose(_vector(ok), PLAIN.encode(["x"])[0], atol=1e-6)


def test_models_list_their_prompts(client):
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert cards["e5-like"]["prompts"] == {"query": "query: ", "passage": "passage: "}
    assert cards["plain"]["prompts"] == {}


def test_bi_encoder_rerank_uses_query_and_document_prompts(client):
    docs = ["the earth axis is tilted", "bananas are yellow"]
    resp = client.post("/v1/rerank", json={"model": "e5-like", "query": "why seasons", "documents": docs})
    assert resp.status_code == 200, resp.text
    q = PROMPTED.encode(["query: why seasons"])[0]
    d = PROMPTED.encode([f"passage: {t}" for t in docs])
    expected = d @ q
    got = {r["index"]: r["relevance_score"] for r in resp.json()["results"]}
    np.testing.assert_allclose([got[0], got[1]], expected, atol=1e-6)


# -- POST /v1/tokenize --------------------------------------------------------------------------------
def test_tokenize_counts_equal_embeddings_usage(client):
    texts = ["short one", "a much longer text " * 10]
    tok = client.post("/v1/tokenize", json={"model": "e5-like", "input": texts, "input_type": "query"})
    assert tok.status_code == 200, tok.text
    body = tok.json()
    assert body["model"] == "e5-like" and body["max_tokens"] == 16 and "tokens" not in body["data"][0]
    emb = client.post("/v1/embeddings", json={"model": "e5-like", "input": texts, "input_type": "query"}).json()
    assert sum(d["count"] for d in body["data"]) == emb["usage"]["prompt_tokens"]
    assert [d["truncated"] for d in body["data"]] == [False, True]
    assert body["data"][1]["untruncated_count"] == PROMPTED.count_tokens(["query: " + texts[1]], prompt="")[0] > 16


def test_tokenize_returns_tokens_on_request(client):
    body = client.post("/v1/tokenize", json={"model": "plain", "input": "hello world", "return_tokens": True}).json()
    assert body["data"] == [
        {
            "index": 0,
            "count": 4,
            "untruncated_count": 4,
            "truncated": False,
            "tokens": ["[CLS]", "hello", "world", "[SEP]"],
        }
    ]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "plain", "input": ""}, 400, "input"),
        ({"model": "plain", "input": []}, 400, "input"),
        ({"model": "plain", "input": 42}, 400, "input"),
        ({"model": "plain", "input": "x", "return_tokens": "yes"}, 400, "return_tokens"),
        ({"model": "ce", "input": "x"}, 400, None),  # a cross-encoder has no single-text tokenization here
        ({"model": "nope", "input": "x"}, 404, None),
        ({"input": "x"}, 400, "model"),
    ],
)
def test_tokenize_bad_requests(client, body, status, param):
    resp = client.post("/v1/tokenize", json=body)
    assert resp.status_code == status, resp.text
    if param:
        assert resp.json()["error"]["param"] == param


def test_tokenize_needs_a_key(client):
    resp = client.post("/v1/tokenize", json={"model": "plain", "input": "x"}, headers={"Authorization": "Bearer no"})
    assert resp.status_code == 401


# -- chunked reranking (/v1/rerank) -------------------------------------------------------------------
LONG = "the garden opens early . " * 8 + "liquid nitrogen boils at minus 196 degrees"  # answer past 16 tokens


@pytest.mark.parametrize("model", ["plain", "ce"])
def test_rerank_chunks_long_documents_by_default(client, model):
    query = "when does liquid nitrogen boil"
    docs = [LONG, "helium fills balloons"]
    chunked = client.post("/v1/rerank", json={"model": model, "query": query, "documents": docs})
    first = client.post("/v1/rerank", json={"model": model, "query": query, "documents": docs, "max_chunks_per_doc": 1})
    assert chunked.status_code == first.status_code == 200, chunked.text
    assert chunked.json()["results"][0]["index"] == 0 and chunked.json()["usage"]["chunked_documents"] == 1
    assert chunked.headers["x-truncated-inputs"] == "0" and first.headers["x-truncated-inputs"] == "1"
    scores = {r["index"]: r["relevance_score"] for r in first.json()["results"]}
    assert scores[0] < chunked.json()["results"][0]["relevance_score"]  # the first window misses the answer
    assert first.json()["usage"]["chunked_documents"] == 0


def test_chunk_aggregation_and_token_bound(client):
    base = {"model": "ce", "query": "when does liquid nitrogen boil", "documents": [LONG]}
    score = {
        how: client.post("/v1/rerank", json={**base, "chunk_aggregation": how}).json()["results"][0]["relevance_score"]
        for how in ("max", "mean", "first")
    }
    assert score["first"] < score["mean"] < score["max"]
    bounded = client.post("/v1/rerank", json={**base, "max_tokens_per_doc": 10})
    assert bounded.headers["x-truncated-inputs"] == "1"  # text past 10 tokens left out, and said so
    refused = client.post("/v1/rerank", json={**base, "max_tokens_per_doc": 10, "truncate": False})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "documents"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_chunks_per_doc", 0),
        ("max_chunks_per_doc", "2"),
        ("max_tokens_per_doc", 0),
        ("chunk_overlap", -1),
        ("chunk_aggregation", "median"),
    ],
)
def test_bad_chunking_fields_are_400_naming_the_field(client, field, value):
    resp = client.post("/v1/rerank", json={"model": "ce", "query": "q", "documents": ["d"], field: value})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == field
