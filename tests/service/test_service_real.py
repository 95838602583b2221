"""The service on the real packaged model: parity with the in-process Encoder, BiEncoderScorer and
CrossEncoder, real token counts, and real model loading. One app per module; routes and errors in general
are covered on fake models in the other tests of ``tests/service``."""

from __future__ import annotations

import base64

import msgspec
import numpy as np
import pytest
from litestar.testing import TestClient

from embedrank import BiEncoderScorer, CrossEncoder
from service.app import create_app
from service.settings import Auth, ModelEntry, Models, Settings

pytestmark = [pytest.mark.slow, pytest.mark.kernels]  # parity with the library, and between two backends

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
BASE = Settings(
    auth=Auth(api_keys=(KEY,)), models=Models(entries=(ModelEntry(id=MODEL, aliases=("all-MiniLM-L6-v2",)),))
)
DOCS = [
    "Bananas are yellow.",
    "The tilt of Earth's axis causes the seasons.",
    "Seasons change through the year.",
    "Bananas are yellow.",
]


@pytest.fixture(scope="module")
def client(cross_encoder_dir):
    settings = msgspec.structs.replace(
        BASE,
        models=Models(
            entries=(
                *BASE.models.entries,
                ModelEntry(id="my-ce", path=cross_encoder_dir),
                # the same weights a second time, on the torch backend
                ModelEntry(id="minilm-torch", path=MODEL, backend="torch"),
            )
        ),
    )
    with TestClient(create_app(settings, wait_for_models=True)) as c:
        c.headers.update(AUTH)
        yield c


def test_embeddings_equal_the_encoder(client, encoder):
    texts = ["short", "a much longer text about retrieval " * 5, " ", "Ünïcödé 日本語", "mid length text here"]
    body = client.post("/v1/embeddings", json={"model": MODEL, "input": texts}).json()
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    ref = encoder.encode_with_stats(texts)
    assert np.abs(got - ref.embeddings).max() < 1e-5
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == ref.total_tokens
    b64 = client.post("/v1/embeddings", json={"model": MODEL, "input": texts, "encoding_format": "base64"}).json()
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b64["data"]])
    np.testing.assert_array_equal(decoded, got)
    short = client.post("/v1/embeddings", json={"model": MODEL, "input": texts, "dimensions": 64}).json()
    np.testing.assert_allclose([d["embedding"] for d in short["data"]], encoder.encode(texts, dimensions=64), atol=1e-6)


def test_real_truncation_counts(client):
    long = "retrieval " * 400
    resp = client.post("/v1/embeddings", json={"model": MODEL, "input": ["ok", long, long]})
    assert resp.status_code == 200 and resp.headers["x-truncated-inputs"] == "2"
    assert resp.json()["usage"]["total_tokens"] == 256 * 2 + 3
    resp = client.post("/v1/embeddings", json={"model": MODEL, "input": ["ok", long], "truncate": False})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input"
    assert "input[1]" in resp.json()["error"]["message"]


def test_bi_encoder_rerank_equals_the_scorer(client, encoder):
    body = client.post(
        "/v1/rerank", json={"model": MODEL, "query": "what causes the seasons", "documents": DOCS}
    ).json()
    ref = BiEncoderScorer(encoder).score("what causes the seasons", DOCS)
    assert body["results"][0]["index"] == 1
    for r in body["results"]:
        assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=1e-5)


def test_configured_cross_encoder_serves_true_scores(client, cross_encoder_dir):
    body = client.post(
        "/v1/rerank", json={"model": "my-ce", "query": "what causes the seasons", "documents": DOCS}
    ).json()
    ref = CrossEncoder.from_pretrained(cross_encoder_dir).score("what causes the seasons", DOCS)
    for r in body["results"]:
        assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=1e-5)
    assert [r["index"] for r in body["results"]] == sorted(range(4), key=lambda i: (-ref[i], i))
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert cards["my-ce"]["scorer"] == "cross-encoder" and cards[MODEL]["dimension"] == 384
    resp = client.post("/v1/embeddings", json={"model": "my-ce", "input": "x"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "model_wrong_kind"


def test_tokenize_counts_equal_embeddings_usage_on_the_real_model(client, encoder):
    texts = ["ok", "retrieval " * 400, "Ünïcödé 日本語"]
    tok = client.post("/v1/tokenize", json={"model": MODEL, "input": texts, "return_tokens": True}).json()
    usage = client.post("/v1/embeddings", json={"model": MODEL, "input": texts}).json()["usage"]
    assert sum(d["count"] for d in tok["data"]) == usage["prompt_tokens"]
    assert [d["untruncated_count"] for d in tok["data"]] == encoder.count_tokens(texts)
    assert [d["truncated"] for d in tok["data"]] == [False, True, False]
    assert tok["data"][0]["tokens"] == ["[CLS]", "ok", "[SEP]"] and len(tok["data"][1]["tokens"]) == 256


def test_chunked_rerank_equals_the_chunking_scorer(client, encoder):
    from embedrank.models.chunking import Chunking

    docs = ["retrieval " * 300 + "the tilt of the earth axis causes the seasons", *DOCS]
    body = client.post("/v1/rerank", json={"model": MODEL, "query": "what causes the seasons", "documents": docs})
    assert body.status_code == 200 and body.json()["usage"]["chunked_documents"] == 1
    ref = BiEncoderScorer(encoder, chunking=Chunking()).score("what causes the seasons", docs)
    for r in body.json()["results"]:
        assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=1e-5)


def test_compact_vectors_and_chunked_embeddings_equal_the_encoder(client, encoder):
    texts = ["the tilt of the earth causes seasons", "bananas are rich in potassium " * 80]
    body = {"model": MODEL, "input": texts, "embedding_types": ["int8", "ubinary"], "chunking": True}
    resp = client.post("/v1/embeddings", json=body)
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    from embedrank import Chunking

    chunked = encoder.encode_with_stats(texts, chunking=Chunking())
    got = np.array([d["embedding"] for d in data], dtype=np.float32)
    assert np.abs(got - chunked.embeddings).max() < 1e-5
    assert resp.json()["usage"] == {
        "prompt_tokens": chunked.total_tokens,
        "total_tokens": chunked.total_tokens,
        "chunked_inputs": 1,
    }
    # the service's model and the fixture's share the default (seeded) calibration: same ranges
    int8 = np.array([d["embeddings"]["int8"] for d in data], dtype=np.int16)
    ranges = encoder.quantization_ranges()
    from embedrank.math.quantization import quantize

    assert np.abs(int8 - quantize(chunked.embeddings, "int8", ranges).astype(np.int16)).max() <= 1
    assert [d["embeddings"]["ubinary"] for d in data] == quantize(chunked.embeddings, "ubinary").tolist()


def test_models_report_backend_and_the_precision_that_runs(client):
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert {k: cards[MODEL][k] for k in ("backend", "precision", "inference_precision")} == {
        "backend": "openvino",
        "precision": "fp32",
        "inference_precision": "f32",
    }
    assert (cards["minilm-torch"]["backend"], cards["minilm-torch"]["inference_precision"]) == ("torch", "f32")
    assert cards["my-ce"]["backend"] == "openvino"


def test_the_same_weights_on_two_backends_agree(client):
    texts = ["short", "a much longer text about retrieval " * 5, "Ünïcödé 日本語"]
    vectors = {}
    for model in (MODEL, "minilm-torch"):
        body = client.post("/v1/embeddings", json={"model": model, "input": texts}).json()
        vectors[model] = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert np.abs(vectors[MODEL] - vectors["minilm-torch"]).max() < 1e-4


def test_tei_rerank_raw_scores_are_the_logits(client, cross_encoder_dir):
    query, docs = "What causes the seasons?", DOCS
    reference = CrossEncoder.from_pretrained(cross_encoder_dir)
    pairs = [(query, d) for d in docs]
    logits, probabilities = reference.score_pairs(pairs, apply_activation=False), reference.score(query, docs)
    for raw, expected in ((True, logits), (False, probabilities)):
        ranks = client.post("/rerank", json={"query": query, "texts": docs, "raw_scores": raw, "model": "my-ce"}).json()
        got = np.zeros(len(docs), dtype=np.float32)
        for r in ranks:
            got[r["index"]] = r["score"]
        np.testing.assert_allclose(got, expected, atol=1e-5)
    native = client.post("/v1/rerank", json={"model": "my-ce", "query": query, "documents": docs}).json()
    assert sorted(r["relevance_score"] for r in native["results"]) == pytest.approx(sorted(probabilities), abs=1e-6)
