"""ColBERT (PyLate's layout) against PyLate 1.6.0 itself on a tiny seeded BERT with a projection head, on
every backend that exports the transformer; MaxSim against direct computations; the model kind and its errors.

PyLate pins sentence-transformers 5.3, so it runs in its own environment (``.venv-pylate``, built by
``make setup-tests``, which ``make test`` runs, from ``tests/reference/pylate.txt``) and hands its vectors over in a file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedrank.errors import ModelKindError, UnsupportedModelError
from embedrank.math.late import maxsim, maxsim_stacked
from embedrank.models.chunking import Chunking
from embedrank.models.colbert import ColBERTEncoder, ColBERTSettings
from embedrank.models.encoder import Encoder
from embedrank.models.m3 import M3Encoder
from embedrank.models.scorers import load_reranker
from embedrank.registry import resolve
from embedrank.retrieval.late import MultiVectorRetriever
from embedrank.testing.tiny import tiny_bge_m3, tiny_colbert, tiny_model, tiny_stanford_colbert

ROOT = Path(__file__).resolve().parents[2]
PYLATE = ROOT / ".venv-pylate" / "bin" / "python"
QUERIES = ["what is green tea", "seasons on earth and why they change, explained in many more words than fit", "a"]
DOCUMENTS = [
    "Green tea, a drink; it's healthy!",
    "The seasons change because the earth's axis is tilted (23.4 degrees) relative to its orbit around the sun, "
    "so that each hemisphere leans toward the sun for half of the year and away from it for the other half.",
    "?!",
    "Ünïcödé 日本語 text",
    "  leading and trailing spaces  ",
]


def pylate_reference(models: dict[str, str], tmp_path: Path) -> dict[str, dict[str, np.ndarray]]:
    """PyLate's vectors and scores for each named model directory, from one run of its environment."""
    if not PYLATE.is_file():
        if os.environ.get("CI"):
            pytest.fail(
                "the PyLate reference environment .venv-pylate is missing (make setup-tests, which make test runs, builds it)"
            )
        pytest.skip(
            "the PyLate reference environment .venv-pylate is missing (make setup-tests, which make test runs, builds it)"
        )
    source = tmp_path / "in.json"
    source.write_text(json.dumps({"queries": QUERIES, "documents": DOCUMENTS}), encoding="utf-8")
    pairs = [str(x) for name, path in models.items() for x in (path, tmp_path / f"{name}.npz")]
    env = {**os.environ, "PYTHONPATH": ""}
    subprocess.run([str(PYLATE), str(ROOT / "tests/reference/pylate_vectors.py"), str(source), *pairs],
                   check=True, env=env, capture_output=True)  # fmt: skip
    return {name: dict(np.load(tmp_path / f"{name}.npz")) for name in models}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    paths = {
        "default": tiny_colbert(),
        "no-expansion": tiny_colbert(do_query_expansion=False),
        "attend": tiny_colbert(attend_to_expansion_tokens=True),
        "stanford": tiny_stanford_colbert(),  # colbert-ir's checkpoint layout, read by PyLate too
    }
    vectors = pylate_reference(paths, tmp_path_factory.mktemp("pylate"))
    return {name: (path, vectors[name]) for name, path in paths.items()}


@pytest.mark.slow  # runs PyLate's environment in a process
@pytest.mark.parametrize("layout", ["default", "stanford"])
@pytest.mark.parametrize(("backend", "tolerance"), [("torch", 1e-5), ("openvino", 1e-4), ("onnx", 1e-4)])
def test_vectors_and_scores_match_pylate(reference, backend, tolerance, layout):
    path, want = reference[layout]
    model = ColBERTEncoder.from_pretrained(path, backend=backend)
    queries = model.encode_queries(QUERIES, batch_size=2)  # other batches (and padding) than PyLate's
    documents = model.encode_documents(DOCUMENTS, batch_size=2)
    for i, got in enumerate(queries):
        assert got.shape == want[f"q{i}"].shape == (12, 16)  # expanded to query_length with mask tokens
        np.testing.assert_allclose(got, want[f"q{i}"], atol=tolerance)
    for j, got in enumerate(documents):
        assert got.shape == want[f"d{j}"].shape
        np.testing.assert_allclose(got, want[f"d{j}"], atol=tolerance)
    assert documents[1].shape[0] < 40 and documents[2].shape[0] == 3  # punctuation skipped; cut at 40 tokens
    for i, query in enumerate(QUERIES):
        np.testing.assert_allclose(
            model.score(query, DOCUMENTS), want["scores"][i], rtol=tolerance, atol=tolerance * 10
        )


@pytest.mark.slow  # runs PyLate's environment in a process
@pytest.mark.parametrize("settings", ["no-expansion", "attend"])
def test_query_settings_match_pylate(reference, settings):
    path, want = reference[settings]
    model = ColBERTEncoder.from_pretrained(path, backend="torch")
    for i, got in enumerate(model.encode_queries(QUERIES)):
        np.testing.assert_allclose(got, want[f"q{i}"], atol=1e-5)
    np.testing.assert_allclose(model.score(QUERIES[0], DOCUMENTS), want["scores"][0], rtol=1e-5, atol=1e-4)


def test_maxsim_sums_over_the_query_and_scores_equal_direct_computation():
    model = ColBERTEncoder.from_pretrained(tiny_colbert(), backend="torch")
    (q,) = model.encode_queries([QUERIES[0]])
    docs = model.encode_documents(DOCUMENTS)
    direct = [float(np.sum(np.max(q.astype(np.float64) @ d.T.astype(np.float64), axis=1))) for d in docs]
    np.testing.assert_allclose(model.score(QUERIES[0], DOCUMENTS), direct, rtol=1e-6)
    assert maxsim(q, docs[0], reduce="sum") == pytest.approx(maxsim(q, docs[0]) * len(q))


def test_chunked_scores_are_the_best_window():
    model = ColBERTEncoder.from_pretrained(tiny_colbert(), backend="torch")
    long = DOCUMENTS[1] + " " + DOCUMENTS[0] * 6
    chunked = model.score(QUERIES[0], [long], chunking=Chunking(overlap=4))
    offsets = model.encoder.token_offsets([long])[0]
    window = model.chunk_window()
    starts = range(0, len(offsets), window - 4)
    windows = [long[offsets[s][0] : offsets[min(s + window, len(offsets)) - 1][1]] for s in starts]
    assert chunked[0] == pytest.approx(max(model.score(QUERIES[0], windows)), rel=1e-5)
    assert chunked[0] >= model.score(QUERIES[0], [long])[0] - 1e-4


def test_the_kind_is_read_from_the_files_and_other_loaders_refuse_it(tmp_path):
    spec = resolve(tiny_colbert())
    assert (spec.kind, spec.pooling, spec.dimension, spec.max_seq_length) == ("multi-vector", None, 16, 40)
    with pytest.raises(ModelKindError, match="ColBERTEncoder"):
        Encoder.from_pretrained(spec.path)
    with pytest.raises(ModelKindError, match="not a ColBERT model"):
        ColBERTEncoder.from_pretrained(tiny_model("bert"))
    broken = tmp_path / "colbert"
    shutil.copytree(spec.path, broken)
    settings = json.loads((broken / "config_sentence_transformers.json").read_text())
    (broken / "config_sentence_transformers.json").write_text(json.dumps({**settings, "query_prefix": "[NOPE]"}))
    with pytest.raises(UnsupportedModelError, match=r"marker '\[NOPE\]' is not a token"):
        ColBERTEncoder.from_pretrained(str(broken), backend="torch")


def test_a_stanford_checkpoint_is_read_as_pylate_reads_it(tmp_path):
    path = tiny_stanford_colbert()
    spec = resolve(path)
    assert (spec.kind, spec.pooling, spec.dimension, spec.max_seq_length) == ("multi-vector", None, 16, 40)
    with pytest.raises(ModelKindError, match="ColBERTEncoder"):
        Encoder.from_pretrained(path)
    settings = ColBERTSettings.read(path)
    assert (settings.query_prefix, settings.document_prefix) == ("[unused0]", "[unused1]")
    assert (settings.query_length, settings.document_length) == (12, 40)
    model = ColBERTEncoder.from_pretrained(path, backend="torch")
    (row,) = model.tokenize_rows(["tea"], query=True)
    assert row.tokens["input_ids"][1] == model.encoder.tokenizer.convert_tokens_to_ids("[unused0]")
    assert model.dimension == 16 and model.projections[0].bias is None
    bare = tmp_path / "no-metadata"  # PyLate's defaults then, with the Stanford markers
    shutil.copytree(path, bare)
    (bare / "artifact.metadata").unlink()
    defaults = ColBERTSettings.read(bare)
    assert (defaults.query_prefix, defaults.query_length, defaults.document_length) == ("[unused0]", 32, 180)
    assert resolve(str(bare)).max_seq_length == 180
    without = tmp_path / "no-projection"
    shutil.copytree(path, without)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(without / "model.safetensors"))
    del weights["linear.weight"]
    save_file(weights, str(without / "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match=r"without linear\.weight"):
        ColBERTEncoder.from_pretrained(str(without), backend="torch")


def test_settings_default_to_pylates(tmp_path):
    assert ColBERTSettings.read(tmp_path) == ColBERTSettings()
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({"do_query_expansion": False,
                                                                            "attend_to_expansion_tokens": True}))  # fmt: skip
    assert not ColBERTSettings.read(tmp_path).attend_to_expansion_tokens
    assert sys.version_info >= (3, 10)


def test_maxsim_stacked_equals_one_document_at_a_time():
    rng = np.random.default_rng(0)
    query = rng.normal(size=(5, 8))
    documents = [rng.normal(size=(n, 8)) for n in (3, 0, 1, 7, 0)]
    starts = np.concatenate([[0], np.cumsum([len(d) for d in documents])])
    for reduce in ("sum", "mean"):
        want = [maxsim(query, d, reduce=reduce) for d in documents]
        got = maxsim_stacked(query, np.concatenate(documents), starts, reduce=reduce)
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("late", ["colbert", "bge-m3"])
def test_exact_retrieval_and_reranking_equal_direct_scores(late):
    if late == "colbert":
        model: Any = ColBERTEncoder.from_pretrained(tiny_colbert(), backend="torch")
        direct = model.score(QUERIES[1], DOCUMENTS)
    else:
        model = M3Encoder.from_pretrained(tiny_bge_m3(), backend="torch")
        direct = model.score(QUERIES[1], DOCUMENTS)["multi"]
    ids = [f"d{i}" for i in range(len(DOCUMENTS))]
    retriever = MultiVectorRetriever(model, ids, DOCUMENTS, batch_size=2)
    run = retriever.retrieve({"q": QUERIES[1]}, k=3)["q"]
    want = np.argsort(-direct, kind="stable")[:3]
    assert list(run) == [ids[i] for i in want]
    np.testing.assert_allclose(list(run.values()), direct[want], rtol=1e-5)
    scorer = load_reranker(model.spec.path, backend="torch")
    assert scorer.kind == "late-interaction"
    reranked = scorer.score(QUERIES[1], DOCUMENTS)
    np.testing.assert_allclose(
        reranked, direct if late == "colbert" else model.score(QUERIES[1], DOCUMENTS)["combined"], rtol=1e-5
    )


def test_the_service_serves_token_vectors_and_maxsim_and_refuses_what_does_not_apply(fake_service):
    from embedrank.testing.fake import FakeEncoder
    from service.settings import Limits

    model = ColBERTEncoder.from_pretrained(tiny_colbert(), backend="torch")
    with fake_service({"colbert": model, "plain": FakeEncoder()}) as client:  # ColBERT configured first
        (card,) = [c for c in client.get("/v1/models").json()["data"] if c["id"] == "colbert"]
        assert (card["scorer"], sorted(card["capabilities"]), card["dimension"]) == (
            "colbert",
            ["embeddings", "rerank"],
            16,
        )
        for input_type, want in (
            ("search_query", model.encode_queries(QUERIES)),
            (None, model.encode_documents(QUERIES)),
        ):
            body = {"model": "colbert", "input": QUERIES, "embedding_types": ["multivector"], "input_type": input_type}
            response = client.post("/v1/embeddings", json={k: v for k, v in body.items() if v is not None})
            assert response.status_code == 200, response.text
            for i, d in enumerate(response.json()["data"]):
                got = np.array(d["embeddings"]["multivector"])
                assert got.shape == want[i].shape and np.abs(got - want[i]).max() < 1e-5
                mean = want[i].mean(axis=0)
                assert np.abs(np.array(d["embedding"]) - mean / np.linalg.norm(mean)).max() < 1e-5
        rerank = client.post(
            "/v1/rerank", json={"model": "colbert", "query": QUERIES[0], "documents": DOCUMENTS}
        ).json()
        scores = {r["index"]: r["relevance_score"] for r in rerank["results"]}
        np.testing.assert_allclose(
            [scores[i] for i in range(len(DOCUMENTS))], model.score(QUERIES[0], DOCUMENTS), rtol=1e-5
        )
        long = DOCUMENTS[1] * 3
        chunked = client.post(
            "/v1/rerank", json={"model": "colbert", "query": QUERIES[0], "documents": [long], "chunk_overlap": 4}
        ).json()
        assert chunked["results"][0]["relevance_score"] == pytest.approx(
            model.score(QUERIES[0], [long], chunking=Chunking(overlap=4))[0], rel=1e-5
        )
        assert chunked["usage"]["chunked_documents"] == 1
        refused = {
            "no multivector asked": {"model": "colbert", "input": ["x"]},
            "compact types": {"model": "colbert", "input": ["x"], "embedding_types": ["multivector", "int8"]},
            "multivector from another model": {"model": "plain", "input": ["x"], "embedding_types": ["multivector"]},
            "dimensions": {"model": "colbert", "input": ["x"], "embedding_types": ["multivector"], "dimensions": 8},
            "chunking": {"model": "colbert", "input": ["x"], "embedding_types": ["multivector"], "chunking": True},
            "too long": {"model": "colbert", "input": [long], "embedding_types": ["multivector"], "truncate": False},
        }
        for name, body in refused.items():
            response = client.post("/v1/embeddings", json=body)
            assert response.status_code == 400, (name, response.text)
        assert (
            client.post("/v1/embeddings", json=refused["no multivector asked"]).json()["error"]["code"]
            == "output_not_available"
        )
        assert "input[0]" in client.post("/v1/embeddings", json=refused["too long"]).text
        counted = client.post("/v1/tokenize", json={"model": "colbert", "input": [DOCUMENTS[0]], "return_tokens": True})
        assert counted.status_code == 200, counted.text
        (row,) = counted.json()["data"]
        marker = model.encoder.tokenizer.convert_ids_to_tokens(model.prefix_ids[False])
        assert row["tokens"][:2] == ["[CLS]", marker] and row["untruncated_count"] == len(row["tokens"])
        assert len(model.encode_documents([DOCUMENTS[0]])[0]) < len(row["tokens"])  # punctuation gives no vector
        spans = client.post("/tokenize", json={"model": "colbert", "inputs": DOCUMENTS[0]})
        assert spans.status_code == 200, spans.text
        tei = client.post("/embed", json={"inputs": "x"})  # no model named: the dense model answers, not ColBERT
        assert tei.status_code == 200 and len(tei.json()[0]) == FakeEncoder().dimension
        schema = client.get("/openapi.json").json()["components"]["schemas"]["EmbeddingsRequest"]
        enum = schema["properties"]["embedding_types"]["oneOf"][0]["items"]["enum"]
        assert "multivector" in enum and "sparse" not in enum
    with fake_service({"colbert": model}, limits=Limits(max_multivector_tokens=30)) as client:
        body = {"model": "colbert", "input": QUERIES, "embedding_types": ["multivector"], "input_type": "query"}
        response = client.post("/v1/embeddings", json=body)  # 3 expanded queries: 36 token vectors
        assert response.status_code == 400 and "EMBEDRANK_MAX_MULTIVECTOR_TOKENS" in response.text
        assert client.post("/v1/embeddings", json={**body, "input": QUERIES[:2]}).status_code == 200


def test_the_harness_reranks_with_a_colbert_model(tmp_path):
    """eval/run.py --reranker <ColBERT>: the first stage's candidates reordered by MaxSim."""
    from embedrank.evaluation.benchmark import BenchmarkConfig, run_benchmark
    from embedrank.retrieval.data import doc_text, load_beir, write_demo_collection

    root = write_demo_collection(tmp_path)
    path = tiny_colbert()
    cfg = BenchmarkConfig(retriever="bm25", reranker=path, k_retrieve=5, backend="torch", use_cache=False)
    result = run_benchmark(str(root), cfg)
    assert result.system == f"bm25>{Path(path).name.lower()}"
    ds, model = load_beir(root), ColBERTEncoder.from_pretrained(path, backend="torch")
    for qid, ranked in result.run.items():
        assert set(ranked) == set(result.first_stage_run[qid])  # the candidates, reordered
        scores = model.score(ds.queries[qid], [doc_text(ds.corpus[d]) for d in ranked])  # MaxSim, alone
        np.testing.assert_allclose(list(ranked.values()), scores, rtol=1e-5)
