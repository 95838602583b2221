"""The local corpus-embedding job (parquet shards + manifest, streaming, resumable)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedrank.errors import InvalidInputError
from embedrank.retrieval.embed_job import embed_collection, iter_corpus, read_embeddings

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def corpus(tmp_path, written_corpus):
    lines = written_corpus.read_text(encoding="utf-8").splitlines()[:50]
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_an_interrupted_job_resumes_without_recomputing_and_equals_the_encoder(corpus, tmp_path, encoder, monkeypatch):
    out = tmp_path / "emb"

    def crash_after_second(index):
        if index == 1:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        embed_collection(encoder, corpus, out, shard_size=20, on_shard=crash_after_second)
    assert sorted(p.name for p in out.glob("*.parquet")) == ["part-00000.parquet", "part-00001.parquet"]
    assert not (out / "manifest.json").exists()

    calls = []
    original = encoder.encode_document
    monkeypatch.setattr(
        encoder, "encode_document", lambda texts, **kw: calls.append(len(texts)) or original(texts, **kw)
    )
    result = embed_collection(encoder, corpus, out, shard_size=20)
    assert (result.documents, result.shards_written, result.shards_reused) == (50, 1, 2) and calls == [10]

    ids, vectors = read_embeddings(out)
    expected_ids, texts = zip(*iter_corpus(corpus), strict=True)
    assert ids == list(expected_ids) and len(set(ids)) == 50
    np.testing.assert_allclose(vectors, original(list(texts)), atol=1e-6)
    manifest = json.loads((out / "manifest.json").read_text())
    signature = manifest["signature"]
    assert signature["dimension"] == 384 and signature["normalize"] is True and manifest["documents"] == 50
    assert signature["pooling"] == "mean" and signature["precision"] == "fp32" and signature["prompt"] == ""
    assert [s["documents"] for s in manifest["shards"]] == [20, 20, 10]
    with pytest.raises(InvalidInputError, match="shard_size"):
        embed_collection(encoder, corpus, out, shard_size=25)


def test_cli_and_a_bad_corpus(corpus, tmp_path):
    cmd = [sys.executable, "-m", "embedrank.embed", str(corpus), "--output", str(tmp_path / "o"), "--shard-size", "30"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "50 documents" in done.stdout and "2 shards written" in done.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "1", "text": "ok"}\nnot json\n')
    with pytest.raises(InvalidInputError, match=r"bad\.jsonl:2"):
        list(iter_corpus(bad))


def test_prebuilt_embeddings_replace_encoding_in_retrieval_and_eval(tmp_path, encoder):
    from embedrank.errors import IndexMismatchError
    from embedrank.retrieval.data import load_beir, write_demo_collection
    from embedrank.retrieval.pipeline import DenseRetriever

    collection = write_demo_collection(tmp_path / "data")
    ds = load_beir(collection)
    embed_collection(encoder, collection, tmp_path / "emb", shard_size=4)
    prebuilt = DenseRetriever.from_embeddings(encoder, tmp_path / "emb", corpus=ds.corpus)
    encoded = DenseRetriever.from_corpus(encoder, ds.corpus, cache=False)
    assert prebuilt.corpus_embeddings.cache == "prebuilt"
    a, b = prebuilt.retrieve(ds.queries, 3), encoded.retrieve(ds.queries, 3)
    assert {q: list(r) for q, r in a.items()} == {q: list(r) for q, r in b.items()}
    with pytest.raises(IndexMismatchError, match="1 documents missing"):
        DenseRetriever.from_embeddings(encoder, tmp_path / "emb", corpus={**ds.corpus, "new": {"text": "x"}})
    cmd = [sys.executable, str(ROOT / "eval" / "run.py"), str(collection), "--embeddings", str(tmp_path / "emb")]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "embedding cache: prebuilt" in done.stdout
    # a saved index (here a sharded build of the job) replaces encoding too, and keeps the model guard
    from embedrank.retrieval.sharded_index import index_from_embeddings

    index_from_embeddings(tmp_path / "emb").save(tmp_path / "ix")
    loaded = DenseRetriever.from_index(encoder, tmp_path / "ix", corpus=ds.corpus)
    assert loaded.corpus_embeddings.cache == "index"
    c = loaded.retrieve(ds.queries, 3)
    assert {q: list(r) for q, r in c.items()} == {q: list(r) for q, r in b.items()}
    with pytest.raises(IndexMismatchError, match="1 documents missing"):
        DenseRetriever.from_index(encoder, tmp_path / "ix", corpus={**ds.corpus, "new": {"text": "x"}})
    done = subprocess.run([*cmd[:-1], str(tmp_path / "ix")], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "embedding cache: index" in done.stdout


@pytest.mark.parametrize(
    ("field", "other"),
    [
        ("model_id", "another/model"),
        ("dimension", 128),
        ("pooling", "cls"),
        ("normalize", False),
        ("max_seq_length", 128),
        ("prompt", "passage: "),
        ("precision", "openvino:int8"),
    ],
)
def test_vectors_made_otherwise_are_refused_in_every_place_they_are_kept(tmp_path, encoder, field, other):
    """One signature is written into the job manifest and the saved index, and checked in one place: every
    difference is refused, in embeddings and in indexes alike, and a field not recorded counts as one."""
    from embedrank.errors import IndexMismatchError
    from embedrank.retrieval.data import load_beir, write_demo_collection
    from embedrank.retrieval.index_base import META_FILE
    from embedrank.retrieval.pipeline import DenseRetriever

    collection = write_demo_collection(tmp_path / "data")
    ds = load_beir(collection)
    embed_collection(encoder, collection, tmp_path / "emb", shard_size=4)
    DenseRetriever.from_corpus(encoder, ds.corpus, cache=False).index.save(tmp_path / "ix")
    for directory, name in ((tmp_path / "emb", "manifest.json"), (tmp_path / "ix", META_FILE)):
        record = json.loads((directory / name).read_text())
        assert record["signature"]["pooling"] == "mean"
        record["signature"][field] = other
        (directory / name).write_text(json.dumps(record))
    with pytest.raises(IndexMismatchError, match=f"{field}: {other!r} there"):
        DenseRetriever.from_embeddings(encoder, tmp_path / "emb")
    with pytest.raises(IndexMismatchError, match=rf"{field}: {other!r} there|model|dimension"):
        DenseRetriever.from_index(encoder, tmp_path / "ix")
    from embedrank.models.signature import EmbeddingSignature

    manifest = json.loads((tmp_path / "emb" / "manifest.json").read_text())
    manifest["signature"] = EmbeddingSignature.of(encoder).to_dict()
    del manifest["signature"]["pooling"]  # vectors that do not say how they were pooled are not trusted
    (tmp_path / "emb" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexMismatchError, match="pooling: not recorded there"):
        DenseRetriever.from_embeddings(encoder, tmp_path / "emb")
