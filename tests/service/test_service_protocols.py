"""The protocols other clients speak, on weightless fakes (fast suite): Cohere's embed and v2 rerank, TEI's
routes, the bare aliases, token-id input and JSON null as absent. Each answer is checked against the native
route's answer for the same input, so the adapters cannot drift from the core."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from embedrank.serving.engine import CPU_BATCH_SIZE, CPU_BATCH_TOKENS
from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder
from service.settings import Settings, SettingsError
from service.token_ids import cl100k_base

pytestmark = pytest.mark.kernel_free

EMB, CE = "fake-encoder", "fake-ce"
TEXTS = ["the cat sat on the mat", "dogs bark at night"]
LONG = " ".join(f"w{i}" for i in range(40))  # 42 fake tokens: over the 16-token window


@pytest.fixture(scope="module")
def client(fake_service):
    models = {EMB: FakeEncoder(EMB, dimension=32, max_seq_length=16), CE: FakeCrossEncoder(CE, max_seq_length=16)}
    with fake_service(models) as c:
        yield c


def native(client, texts, **extra):
    resp = client.post("/v1/embeddings", json={"model": EMB, "input": texts, **extra})
    assert resp.status_code == 200, resp.text
    return np.array([d["embedding"] for d in resp.json()["data"]], dtype=np.float32)


def error(resp, status, param=None, code=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert param is None or err["param"] == param, err
    assert code is None or err["code"] == code, err
    return err


# -- Cohere ---------------------------------------------------------------------------------------------
def test_cohere_v1_embed_answers_floats_as_the_native_route(client):
    resp = client.post("/v1/embed", json={"model": EMB, "texts": TEXTS, "input_type": "search_document"})
    body = resp.json()
    assert resp.status_code == 200 and body["response_type"] == "embeddings_floats"
    np.testing.assert_allclose(body["embeddings"], native(client, TEXTS), atol=1e-7)
    assert body["texts"] == TEXTS and body["meta"]["billed_units"]["input_tokens"] > 0
    assert body["meta"]["api_version"]["version"] == "1" and "warnings" not in body["meta"]


def test_cohere_embed_by_type_and_v2_defaults(client):
    body = client.post(
        "/v1/embed", json={"model": EMB, "texts": TEXTS, "embedding_types": ["float", "int8", "ubinary", "base64"]}
    ).json()
    assert body["response_type"] == "embeddings_by_type"
    vectors = native(client, TEXTS)
    compact = client.post(
        "/v1/embeddings", json={"model": EMB, "input": TEXTS, "embedding_types": ["int8", "ubinary"]}
    ).json()["data"]
    assert body["embeddings"]["int8"] == [d["embeddings"]["int8"] for d in compact]
    assert body["embeddings"]["ubinary"] == [d["embeddings"]["ubinary"] for d in compact]
    decoded = [np.frombuffer(base64.b64decode(b), dtype="<f4") for b in body["embeddings"]["base64"]]
    np.testing.assert_allclose(decoded, vectors, atol=1e-7)
    v2 = client.post("/v2/embed", json={"model": EMB, "texts": TEXTS, "input_type": "search_query"}).json()
    assert v2["response_type"] == "embeddings_by_type" and set(v2["embeddings"]) == {"float"}
    assert v2["meta"]["api_version"]["version"] == "2"
    short = client.post("/v2/embed", json={"model": EMB, "texts": TEXTS, "output_dimension": 24}).json()
    np.testing.assert_allclose(short["embeddings"]["float"], native(client, TEXTS, dimensions=24), atol=1e-7)


def test_cohere_truncate_end_start_and_none(client):
    words = LONG.split()
    end = client.post("/v1/embed", json={"model": EMB, "texts": [LONG]})
    assert end.headers["x-truncated-inputs"] == "1" and "truncated" in end.json()["meta"]["warnings"][0]
    np.testing.assert_allclose(end.json()["embeddings"], native(client, [" ".join(words[:14])]), atol=1e-7)
    start = client.post("/v1/embed", json={"model": EMB, "texts": [LONG, "short"], "truncate": "START"})
    assert start.status_code == 200 and start.headers["x-truncated-inputs"] == "1"
    expected = native(client, [" ".join(words[-14:]), "short"])  # the last 14 words fill the window
    np.testing.assert_allclose(start.json()["embeddings"], expected, atol=1e-7)
    error(  # each error names a field of Cohere's body
        client.post("/v2/embed", json={"model": EMB, "texts": ["ok"], "output_dimension": 100_000}),
        400,
        "output_dimension",
    )
    error(
        client.post("/v1/embed", json={"model": EMB, "texts": ["ok", LONG], "truncate": "NONE"}),
        400,
        "texts",  # the field Cohere's body has (it has no input)
        "input_too_long",
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"images": ["data:image/png;base64,AAAA"]}, "images"),
        ({"inputs": [{"content": []}]}, "inputs"),
        ({"max_tokens": 4}, "max_tokens"),  # below the model's window
        ({"texts": []}, "texts"),
        ({"truncate": "MIDDLE"}, "truncate"),
        ({"embedding_types": ["float16"]}, "embedding_types"),
    ],
)
def test_cohere_embed_refuses_what_it_cannot_do(client, body, param):
    error(client.post("/v2/embed", json={"model": EMB, "texts": TEXTS, **body}), 400, param)


def test_cohere_v2_rerank_is_the_native_rerank_with_meta(client):
    body = {"model": CE, "query": "cat mat", "documents": TEXTS, "top_n": 1, "max_tokens_per_doc": None}
    v2 = client.post("/v2/rerank", json=body).json()
    v1 = client.post("/v1/rerank", json={k: v for k, v in body.items() if v is not None}).json()
    assert v2["results"] == v1["results"] and len(v2["results"]) == 1
    assert v2["meta"]["billed_units"]["input_tokens"] == v2["usage"]["total_tokens"]


# -- JSON null is absent ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": EMB, "input": "x", "dimensions": None, "user": None, "encoding_format": None}),
        ("/v1/embeddings", {"model": EMB, "input": "x", "truncate": None, "chunking": None, "priority": None}),
        ("/v1/rerank", {"model": CE, "query": "q", "documents": ["d"], "top_n": None, "max_tokens_per_doc": None}),
        ("/v1/rerank", {"model": CE, "query": "q", "documents": ["d"], "return_documents": None, "truncate": None}),
        ("/v1/tokenize", {"model": EMB, "input": "x", "return_tokens": None, "prompt_name": None}),
        ("/v2/embed", {"model": EMB, "texts": ["x"], "embedding_types": None, "truncate": None, "images": None}),
        ("/embed", {"inputs": "x", "normalize": None, "truncate": None, "model": None, "dimensions": None}),
        ("/rerank", {"query": "q", "texts": ["d"], "raw_scores": None, "return_text": None, "model": None}),
        ("/tokenize", {"inputs": "x", "add_special_tokens": None, "prompt_name": None}),
    ],
)
def test_null_means_absent_on_every_route(client, path, body):
    with_nulls = client.post(path, json=body)
    without = client.post(path, json={k: v for k, v in body.items() if v is not None})
    assert with_nulls.status_code == without.status_code == 200, with_nulls.text
    strip = ("id",)
    a, b = with_nulls.json(), without.json()
    if isinstance(a, dict):
        a, b = ({k: v for k, v in d.items() if k not in strip} for d in (a, b))
    assert a == b


def test_null_for_a_required_field_is_a_missing_field(client):
    error(client.post("/v1/embeddings", json={"model": EMB, "input": None}), 400, "input", "missing_field")


# -- TEI --------------------------------------------------------------------------------------------------
def test_tei_embed_is_a_bare_array_normalized_unless_asked_not_to(client):
    resp = client.post("/embed", json={"inputs": TEXTS})
    assert resp.status_code == 200 and isinstance(resp.json(), list)
    np.testing.assert_allclose(resp.json(), native(client, TEXTS), atol=1e-7)
    raw = np.array(client.post("/embed", json={"inputs": TEXTS, "normalize": False}).json())
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)  # the fake's pooled counts, before normalization
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), native(client, TEXTS), atol=1e-6)
    single = client.post("/", json={"inputs": TEXTS[0], "model": EMB}).json()
    np.testing.assert_allclose(single, native(client, TEXTS[:1]), atol=1e-7)


def test_tei_truncation_direction_and_refusal(client):
    left = client.post("/embed", json={"inputs": [LONG], "truncation_direction": "Left"})
    np.testing.assert_allclose(left.json(), native(client, [" ".join(LONG.split()[-14:])]), atol=1e-7)
    error(client.post("/embed", json={"inputs": [LONG], "truncate": False}), 400, "inputs", "input_too_long")
    error(client.post("/embed", json={"inputs": [[1, 2]]}), 400, "inputs")  # ids are not read on TEI routes
    error(client.post("/embed", json={"inputs": "x", "model": CE}), 400, "model", "model_wrong_kind")


def test_tei_rerank_shape_and_the_cohere_shape_on_the_same_path(client):
    tei = client.post("/rerank", json={"query": "cat mat", "texts": TEXTS, "return_text": True}).json()
    cohere = client.post("/v1/rerank", json={"model": CE, "query": "cat mat", "documents": TEXTS}).json()
    assert [r["index"] for r in tei] == [r["index"] for r in cohere["results"]]
    assert [r["score"] for r in tei] == pytest.approx([r["relevance_score"] for r in cohere["results"]])
    assert [r["text"] for r in tei] == [TEXTS[r["index"]] for r in tei]
    assert client.post("/", json={"query": "cat mat", "texts": TEXTS}).json() == [
        {k: v for k, v in r.items() if k != "text"} for r in tei
    ]
    vllm = client.post("/rerank", json={"model": CE, "query": "cat mat", "documents": TEXTS}).json()
    assert vllm["results"] == cohere["results"]
    error(client.post("/rerank", json={"query": "q", "texts": ["d"], "truncation_direction": "Left"}), 400)
    assert client.post("/rerank", json={"query": "q", "texts": ["d"], "raw_scores": True}).status_code == 200


def test_tei_tokenize_and_info(client):
    rows = client.post("/tokenize", json={"inputs": ["hello big world"]}).json()
    assert [t["text"] for t in rows[0]] == ["[CLS]", "hello", "big", "world", "[SEP]"]
    assert rows[0][1] == {"id": rows[0][1]["id"], "text": "hello", "special": False, "start": 0, "stop": 5}
    assert rows[0][0]["special"] and rows[0][0]["start"] is None
    bare = client.post("/tokenize", json={"inputs": "hello", "add_special_tokens": False}).json()
    assert [t["text"] for t in bare[0]] == ["hello"]
    info = client.get("/info").json()
    assert info["served_model_name"] == EMB and info["max_input_length"] == 16
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["auto_truncate"] is True
    assert (info["max_batch_tokens"], info["max_batch_requests"]) == (CPU_BATCH_TOKENS, CPU_BATCH_SIZE)  # in use


# -- aliases and token ids --------------------------------------------------------------------------------
def test_bare_embeddings_alias(client):
    resp = client.post("/embeddings", json={"model": EMB, "input": TEXTS})
    np.testing.assert_allclose([d["embedding"] for d in resp.json()["data"]], native(client, TEXTS))


def test_token_id_input_is_read_as_cl100k_base(client):
    encoding = cl100k_base()
    ids = [encoding.encode(t) for t in TEXTS]
    np.testing.assert_allclose(native(client, ids), native(client, TEXTS), atol=1e-7)  # LangChain's default
    np.testing.assert_allclose(native(client, ids[0]), native(client, TEXTS[:1]), atol=1e-7)  # one flat array
    text = "naïve café — 東京 🎉"
    assert native(client, [encoding.encode(text)]).tolist() == native(client, [text]).tolist()
    err = error(client.post("/v1/embeddings", json={"model": EMB, "input": [ids[0], [100261]]}), 400, "input")
    assert "input[1]" in err["message"] and "100261" in err["message"]


def test_token_ids_can_be_switched_off(fake_service):
    settings = Settings.from_env({"EMBEDRANK_API_KEYS": "k", "EMBEDRANK_TOKEN_IDS": "off"})
    assert settings.server.decodes_token_ids is False
    with fake_service({EMB: FakeEncoder(EMB)}, key="k", settings=settings) as client:
        err = error(client.post("/v1/embeddings", json={"model": EMB, "input": [[9906]]}), 400, "input")
        assert "EMBEDRANK_TOKEN_IDS" in err["message"]
        schema = client.get("/openapi.json").json()["components"]["schemas"]["EmbeddingsRequest"]
        assert "integer" not in str(schema["properties"]["input"])
    with pytest.raises(SettingsError, match="EMBEDRANK_TOKEN_IDS"):
        Settings.from_env({"EMBEDRANK_TOKEN_IDS": "p50k_base"})


def test_the_bundled_encoding_is_checked_against_tiktokens_hash():
    import hashlib

    from service.token_ids import CL100K_SHA256, encoding_file

    assert hashlib.sha256(encoding_file().read_bytes()).hexdigest() == CL100K_SHA256
    assert cl100k_base().encode("Hello world") == [9906, 1917]


# -- sparse (SPLADE) models -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sparse_client(fake_service):
    from embedrank.testing.fake import FakeSparseEncoder

    models = {
        "fake-sparse": FakeSparseEncoder("fake-sparse", vocab_size=1000, max_seq_length=16),
        EMB: FakeEncoder(EMB),
    }
    with fake_service(models) as c:
        yield c


def test_embed_sparse_answers_tei_shape_from_the_model(sparse_client):
    from embedrank.testing.fake import FakeSparseEncoder

    rows = sparse_client.post("/embed_sparse", json={"inputs": ["green tea benefits", "tea"]}).json()
    reference = FakeSparseEncoder("x", vocab_size=1000, max_seq_length=16)
    expected = reference.weights_rows(reference.tokenize_rows(["green tea benefits", "tea"])).values
    for row, weights in zip(rows, expected, strict=True):
        assert [p["index"] for p in row] == sorted(p["index"] for p in row) == np.flatnonzero(weights).tolist()
        np.testing.assert_allclose([p["value"] for p in row], weights[weights > 0], rtol=1e-6)
    assert len(rows[1]) == 1
    cards = {m["id"]: m for m in sparse_client.get("/v1/models").json()["data"]}
    assert cards["fake-sparse"]["capabilities"] == ["embeddings", "sparse"] and cards["fake-sparse"]["scorer"] is None
    assert cards["fake-sparse"]["outputs"] == ["sparse"] and cards[EMB]["outputs"] == ["dense"]
    assert cards["fake-sparse"]["dimension"] == 1000
    assert sparse_client.get("/info").json()["model_type"] == {"embedding": {"pooling": "splade"}}


def test_embed_sparse_applies_the_prompt_of_the_input_type(fake_service):
    """TEI's /embed_sparse with input_type "query" embeds the model's query prompt with the text, as
    /v1/embeddings does (it used to pick the query route but apply a prompt only for prompt_name)."""
    import dataclasses

    from embedrank.testing.fake import FakeSparseEncoder

    model = FakeSparseEncoder("prompted", vocab_size=1000, max_seq_length=16)
    model.spec = dataclasses.replace(model.spec, prompts={"query": "search for: "})
    with fake_service({"prompted": model}) as client:
        plain = client.post("/embed_sparse", json={"inputs": "apple"}).json()[0]
        query = client.post("/embed_sparse", json={"inputs": "apple", "input_type": "query"}).json()[0]
        named = client.post("/embed_sparse", json={"inputs": "apple", "prompt_name": "query"}).json()[0]
        v1 = client.post(
            "/v1/embeddings",
            json={"model": "prompted", "input": "apple", "input_type": "query", "embedding_types": ["sparse"]},
        )
    expected = model.weights_rows(model.tokenize_rows(["search for: apple"])).values[0]
    assert len(plain) == 1 and query == named
    assert [p["index"] for p in query] == np.flatnonzero(expected).tolist()
    assert v1.status_code == 200, v1.text


def test_embed_sparse_refusals(sparse_client):
    long = " ".join(f"w{i}" for i in range(40))
    error(
        sparse_client.post("/embed_sparse", json={"inputs": long, "truncate": False}), 400, "inputs", "input_too_long"
    )
    assert sparse_client.post("/embed_sparse", json={"inputs": long}).headers["x-truncated-inputs"] == "1"
    error(sparse_client.post("/embed_sparse", json={"inputs": "x", "truncation_direction": "Left"}), 400)
    error(sparse_client.post("/embed_sparse", json={"inputs": "x", "model": EMB}), 400, "model", "model_wrong_kind")
    err = error(sparse_client.post("/v1/rerank", json={"model": "fake-sparse", "query": "x", "documents": ["y"]}), 400, "model")  # fmt: skip
    assert "sparse" in err["message"]


def test_v1_embeddings_answers_a_splade_with_sparse_vectors(sparse_client):
    from embedrank.testing.fake import FakeSparseEncoder

    texts = ["green tea benefits", "tea", "the tilt of the earth causes seasons"]
    reference = FakeSparseEncoder("x", vocab_size=1000, max_seq_length=16)
    expected = reference.weights_rows(reference.tokenize_rows(texts)).values
    tei = sparse_client.post("/embed_sparse", json={"inputs": texts}).json()
    for fmt, empty in (("float", []), ("base64", "")):
        body = {"model": "fake-sparse", "input": texts, "embedding_types": ["sparse"], "encoding_format": fmt}
        resp = sparse_client.post("/v1/embeddings", json=body)
        assert resp.status_code == 200, resp.text
        data = resp.json()["data"]
        for d, weights, row in zip(data, expected, tei, strict=True):
            assert d["embedding"] == empty  # no dense vector: documented as empty
            sparse = d["embeddings"]["sparse"]
            assert sparse["indices"] == np.flatnonzero(weights).tolist() == [p["index"] for p in row]
            np.testing.assert_allclose(sparse["values"], weights[weights > 0], rtol=1e-6)
        usage = resp.json()["usage"]
        assert usage["prompt_tokens"] == sum(len(t.split()) + 2 for t in texts)
    both = {"model": "fake-sparse", "input": texts[:1], "embedding_types": ["float", "sparse"]}
    assert sparse_client.post("/v1/embeddings", json=both).json()["data"][0]["embeddings"]["float"] == []
    counts = sparse_client.post("/v1/tokenize", json={"model": "fake-sparse", "input": texts}).json()
    assert [d["count"] for d in counts["data"]] == [5, 3, 9]
    spans = sparse_client.post("/tokenize", json={"model": "fake-sparse", "inputs": "green tea"}).json()
    assert [t["text"] for t in spans[0]] == ["[CLS]", "green", "tea", "[SEP]"]


def test_v1_embeddings_refuses_what_a_splade_cannot_give(sparse_client):
    long = " ".join(f"w{i}" for i in range(40))
    sparse = {"model": "fake-sparse", "input": ["x"], "embedding_types": ["sparse"]}
    refused = {
        "no sparse asked": ({"model": "fake-sparse", "input": ["x"]}, "embedding_types"),
        "compact types": ({**sparse, "embedding_types": ["sparse", "int8"]}, "embedding_types"),
        "sparse from a dense model": ({**sparse, "model": EMB}, "embedding_types"),
        "dimensions": ({**sparse, "dimensions": 8}, "dimensions"),
        "chunking": ({**sparse, "chunking": True}, "chunking"),
        "too long": ({**sparse, "input": ["x", long], "truncate": False}, "input"),
    }
    for case, (body, param) in refused.items():
        resp = sparse_client.post("/v1/embeddings", json=body)
        assert resp.status_code == 400, (case, resp.text)
        assert resp.json()["error"]["param"] == param, (case, resp.json())
    err = error(
        sparse_client.post("/v1/embeddings", json=refused["no sparse asked"][0]), 400, code="output_not_available"
    )
    assert '["sparse"]' in err["message"] and "/embed_sparse" in err["message"]
    cut = sparse_client.post("/v1/embeddings", json={**sparse, "input": [long]})
    assert cut.status_code == 200 and cut.headers["x-truncated-inputs"] == "1"
    # the dense model stays the default of the routes whose bodies name no model
    assert len(sparse_client.post("/embed", json={"inputs": "x"}).json()[0]) == 32
    schema = sparse_client.get("/openapi.json").json()["components"]["schemas"]["EmbeddingsRequest"]
    enum = schema["properties"]["embedding_types"]["oneOf"][0]["items"]["enum"]
    assert "sparse" in enum and "multivector" not in enum
    assert schema["properties"]["dimensions"]["oneOf"][0]["maximum"] == 32  # not the vocabulary


def test_the_schema_allows_only_false_raw_scores_when_a_served_reranker_has_several_labels(fake_service):
    import dataclasses

    several = FakeCrossEncoder("labels")
    several.spec = dataclasses.replace(several.spec, num_labels=3)
    for model, only_false in ((FakeCrossEncoder("one"), False), (several, True)):
        with fake_service({model.model_id: model}) as client:
            schema = client.get("/openapi.json").json()["components"]["schemas"]["TEIRerankRequest"]
            raw = schema["properties"]["raw_scores"]  # a value or null (TEI's optional fields)
            assert (
                {"enum": [False], "description": "Only false: a served model has several labels"} in raw["anyOf"]
            ) == only_false
