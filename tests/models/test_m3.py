"""bge-m3's dense vector, lexical weights and multi-vectors against FlagEmbedding's ``BGEM3FlagModel`` on a
tiny seeded XLM-R with seeded heads in bge-m3's layout, on every backend that exports the transformer; the
late-interaction and lexical scores against direct computations."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import scipy.sparse as sp

from embedrank.errors import UnsupportedModelError
from embedrank.math.late import lexical_scores, maxsim, maxsim_scores, token_max_weights, weighted_sum
from embedrank.models.m3 import M3Encoder
from embedrank.testing.tiny import tiny_bge_m3, tiny_model

TEXTS = [
    "green tea health benefits",
    "what causes the seasons on earth and why do they change",
    "a b",
    "Ünïcödé 日本語 text",
    "tea tea tea green green",
]


@pytest.fixture(scope="module")
def reference():
    from FlagEmbedding import BGEM3FlagModel

    path = tiny_bge_m3()
    model = BGEM3FlagModel(path, use_fp16=False, devices="cpu")
    out = model.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True, max_length=120)
    pairs = [[TEXTS[0], t] for t in TEXTS[1:]]  # one pair per batch: FlagEmbedding pads a batch's passages
    scores = model.compute_score(pairs, max_query_length=120, max_passage_length=120, batch_size=1,
                                 weights_for_different_modes=[0.4, 0.2, 0.4])  # fmt: skip
    return path, out, scores


@pytest.mark.parametrize(("backend", "tolerance"), [("torch", 1e-5), ("openvino", 1e-4), ("onnx", 1e-4)])
def test_three_outputs_match_flagembedding(reference, backend, tolerance):
    path, want, want_scores = reference
    m3 = M3Encoder.from_pretrained(path, backend=backend)
    got = m3.encode(TEXTS, batch_size=2)  # batches of different padding than FlagEmbedding's
    assert np.abs(got.dense - want["dense_vecs"]).max() < tolerance
    assert sum(len(w) for w in want["lexical_weights"]) > len(TEXTS)  # the heads give real weights
    for i, weights in enumerate(want["lexical_weights"]):
        row = got.sparse[i]
        ours = {str(k): float(v) for k, v in zip(row.indices, row.data, strict=True)}
        assert ours.keys() == weights.keys(), i
        assert max(abs(ours[k] - float(w)) for k, w in weights.items()) < tolerance
        assert got.multi[i].shape == want["colbert_vecs"][i].shape
        assert np.abs(got.multi[i] - want["colbert_vecs"][i]).max() < tolerance
    tokens = m3.encoder.tokenizer(TEXTS, truncation=True, max_length=120)["input_ids"]
    assert got.token_counts == [len(t) for t in tokens] and not any(got.truncated)
    scores = m3.score(TEXTS[0], TEXTS[1:])
    for ours, theirs in (("dense", "dense"), ("sparse", "sparse"), ("multi", "colbert"), ("combined", "colbert+sparse+dense")):  # fmt: skip
        assert np.abs(scores[ours] - np.array(want_scores[theirs])).max() < tolerance * 10, ours


def test_a_model_without_the_heads_is_named():
    with pytest.raises(UnsupportedModelError, match=r"sparse_linear\.pt, colbert_linear\.pt missing"):
        M3Encoder.from_pretrained(tiny_model("xlm-roberta"))


def test_a_missing_head_is_named(tmp_path):
    path = tmp_path / "m3"
    shutil.copytree(tiny_bge_m3(), path)
    (path / "colbert_linear.pt").unlink()
    with pytest.raises(UnsupportedModelError, match=r"colbert_linear\.pt missing"):
        M3Encoder.from_pretrained(str(path))


def test_scores_equal_direct_computations():
    rng = np.random.default_rng(0)
    query, documents = rng.normal(size=(4, 8)), [rng.normal(size=(n, 8)) for n in (1, 5, 9)]
    direct = [np.mean([max(q @ d for d in doc) for q in query]) for doc in documents]
    assert np.allclose(maxsim_scores(query, documents), direct, atol=1e-6)
    assert maxsim(query, np.zeros((0, 8))) == 0.0
    weights = rng.uniform(-1, 1, size=(3, 7)).astype(np.float32)
    ids = rng.integers(0, 6, size=(3, 7))
    mask = np.ones((3, 7), int)
    mask[2, 4:] = 0
    got = token_max_weights(weights, ids, mask, vocab_size=6, drop=[0]).toarray()
    for b in range(3):
        for v in range(6):
            kept = [w for w, i, m in zip(weights[b], ids[b], mask[b], strict=True) if i == v and m and w > 0 and v != 0]
            assert got[b, v] == pytest.approx(max(kept, default=0.0))
    q, d = sp.csr_matrix(got[:1]), sp.csr_matrix(got)
    assert np.allclose(lexical_scores(q, d), got @ got[0], atol=1e-6)
    with pytest.raises(ValueError, match="one weight per score"):
        weighted_sum([np.zeros(2)], [0.5, 0.5])


def test_the_service_serves_every_output_and_refuses_what_does_not_apply(fake_service):
    from embedrank.testing.fake import FakeEncoder
    from service.settings import Limits

    m3 = M3Encoder.from_pretrained(tiny_bge_m3(), backend="torch")
    want = m3.encode(TEXTS)
    with fake_service({"m3": m3, "plain": FakeEncoder()}) as client:
        (card,) = [c for c in client.get("/v1/models").json()["data"] if c["id"] == "m3"]
        assert (card["scorer"], sorted(card["capabilities"])) == ("bge-m3", ["embeddings", "rerank", "sparse"])
        body = {"model": "m3", "input": TEXTS, "embedding_types": ["sparse", "multivector", "int8"]}
        response = client.post("/v1/embeddings", json=body)
        assert response.status_code == 200, response.text
        data = response.json()["data"]
        assert np.abs(np.array([d["embedding"] for d in data]) - want.dense).max() < 1e-5
        for i, d in enumerate(data):
            sparse = d["embeddings"]["sparse"]
            assert sparse["indices"] == want.sparse[i].indices.tolist()
            assert np.allclose(sparse["values"], want.sparse[i].data, atol=1e-6)
            assert np.abs(np.array(d["embeddings"]["multivector"]) - want.multi[i]).max() < 1e-5
            assert len(d["embeddings"]["int8"]) == want.dense.shape[1]
        counted = client.post("/v1/tokenize", json={"model": "m3", "input": TEXTS[:2]})
        assert counted.status_code == 200 and [d["untruncated_count"] for d in counted.json()["data"]] == [
            len(t) for t in m3.encoder.tokenizer(TEXTS[:2])["input_ids"]
        ]
        assert client.post("/tokenize", json={"model": "m3", "inputs": TEXTS[0]}).status_code == 200
        tei = client.post("/embed_sparse", json={"model": "m3", "inputs": TEXTS[:2]}).json()
        assert [[v["index"] for v in row] for row in tei] == [want.sparse[i].indices.tolist() for i in range(2)]
        rerank = client.post("/v1/rerank", json={"model": "m3", "query": TEXTS[0], "documents": TEXTS[1:]}).json()
        scores = {r["index"]: r["relevance_score"] for r in rerank["results"]}
        combined = m3.score(TEXTS[0], TEXTS[1:])["combined"]
        assert np.abs(np.array([scores[i] for i in range(len(TEXTS) - 1)]) - combined).max() < 1e-5
        refused = {
            "sparse from another model": client.post(
                "/v1/embeddings", json={"model": "plain", "input": ["x"], "embedding_types": ["sparse"]}
            ),
            "chunking": client.post("/v1/embeddings", json={"model": "m3", "input": ["x"], "chunking": True}),
            "rerank windows": client.post(
                "/v1/rerank", json={"model": "m3", "query": "q", "documents": ["d"], "chunk_overlap": 8}
            ),
        }
        for name, response in refused.items():
            assert response.status_code == 400, (name, response.text)
        assert "bge-m3 models have" in refused["sparse from another model"].json()["error"]["message"]
        assert refused["sparse from another model"].json()["error"]["code"] == "output_not_available"
        schema = client.get("/openapi.json").json()["components"]["schemas"]["EmbeddingsRequest"]
        assert {"sparse", "multivector"} <= set(schema["properties"]["embedding_types"]["oneOf"][0]["items"]["enum"])
    with fake_service({"plain": FakeEncoder()}) as client:  # no bge-m3 served: the schema does not offer them
        schema = client.get("/openapi.json").json()["components"]["schemas"]["EmbeddingsRequest"]
        assert "sparse" not in schema["properties"]["embedding_types"]["oneOf"][0]["items"]["enum"]
    with fake_service({"m3": m3}, limits=Limits(max_multivector_tokens=10)) as client:
        body = {"model": "m3", "input": TEXTS, "embedding_types": ["multivector"]}
        response = client.post("/v1/embeddings", json=body)
        assert response.status_code == 400 and "EMBEDRANK_MAX_MULTIVECTOR_TOKENS" in response.text
        assert client.post("/v1/embeddings", json={**body, "input": ["a b"]}).status_code == 200
