"""SPLADE over long texts: read window by window, each term's weight the max over the windows. The window
vectors are checked against sentence-transformers' SparseEncoder and combined with numpy; the sparse max
and pruning against their dense equivalents."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from embedrank.errors import InvalidInputError
from embedrank.math.sparse import max_rows, prune_rows, to_csr
from embedrank.models.chunking import Chunking, split_windows
from embedrank.models.sparse import SparseEncoder
from embedrank.testing.tiny import tiny_model

LONG = "sparse retrieval reads every window of a long scientific abstract about proteins and cells " * 3
TEXTS = [LONG, "green tea", "a second long text: " + "ranking, fusion and late interaction " * 5]


@pytest.fixture(scope="module")
def short_splade() -> SparseEncoder:
    """A tiny seeded SPLADE reading 16 tokens at a time, so that the long texts split."""
    return SparseEncoder.from_pretrained(tiny_model("bert", "masked-lm"), max_seq_length=16)


def test_max_rows_is_the_columnwise_max_per_owner():
    rng = np.random.default_rng(0)
    dense = rng.random((9, 40)) * (rng.random((9, 40)) < 0.3)
    owners = np.array([0, 0, 0, 2, 2, 3, 3, 3, 3])
    expected = np.zeros((5, 40))
    np.maximum.at(expected, owners, dense)
    got = max_rows(sp.csr_matrix(dense), owners, 5)
    assert got.shape == (5, 40) and got.dtype == np.float32
    np.testing.assert_allclose(got.toarray(), expected, rtol=1e-6)
    assert max_rows(sp.csr_matrix((0, 40)), np.zeros(0, dtype=np.int64), 2).nnz == 0
    with pytest.raises(ValueError, match="owners"):
        max_rows(sp.csr_matrix(dense), owners[:3], 5)


def test_prune_rows_keeps_what_to_csr_keeps():
    rng = np.random.default_rng(1)
    dense = np.round(rng.random((6, 30)), 1) * (rng.random((6, 30)) < 0.5)  # rounded: ties to break
    for k in (1, 3, 30):
        np.testing.assert_array_equal(prune_rows(sp.csr_matrix(dense), k).toarray(), to_csr(dense, k).toarray())
    with pytest.raises(InvalidInputError, match="top_k"):
        prune_rows(sp.csr_matrix(dense), 0)


def test_a_long_text_weighs_each_term_by_its_best_window(short_splade):
    from sentence_transformers.sparse_encoder import SparseEncoder as Reference

    reference = Reference(short_splade.spec.path, device="cpu")
    reference.max_seq_length = 16
    windows = split_windows(TEXTS, short_splade.token_offsets, window=short_splade.chunk_window(), chunking=Chunking())
    assert windows.chunked == 2  # the two long texts split; "green tea" fits one pass
    per_window = reference.encode(windows.texts, convert_to_sparse_tensor=False).numpy()
    expected = np.zeros((len(TEXTS), per_window.shape[1]), dtype=np.float32)
    np.maximum.at(expected, windows.owners, per_window)

    got, counts, cut = short_splade.encode_with_stats(TEXTS, chunking=Chunking(), batch_size=4)
    np.testing.assert_allclose(got.toarray(), expected, rtol=0, atol=1e-5)
    lengths = reference.tokenizer(windows.texts, truncation=True, max_length=16)["input_ids"]
    assert counts == np.bincount(windows.owners, weights=[len(ids) for ids in lengths]).astype(int).tolist()
    assert cut == [False, False, False]  # nothing left out: every token was read
    plain, _, truncated = short_splade.encode_with_stats(TEXTS)
    assert truncated == [True, False, True]
    # one window: as without chunking, up to float rounding (the batches differ, and so may the kernels' sums)
    np.testing.assert_allclose(got[1].toarray(), plain[1].toarray(), rtol=0, atol=1e-6)
    assert (got[0].toarray() >= plain[0].toarray() - 1e-6).all()  # the first window is one of the windows


def test_windows_are_pruned_after_the_max_and_bounded_like_the_dense_windows(short_splade):
    full = short_splade.encode(TEXTS, chunking=Chunking())
    top = short_splade.encode(TEXTS, chunking=Chunking(), top_k=8)
    np.testing.assert_array_equal(top.toarray(), prune_rows(full, 8).toarray())
    assert (top.getnnz(axis=1) == 8).all()
    _, _, cut = short_splade.encode_with_stats(TEXTS, chunking=Chunking(max_chunks=1))
    assert cut == [True, False, True]  # text left out by the bound is flagged, not hidden
    with pytest.raises(InvalidInputError, match="aggregate must be 'max'"):
        short_splade.encode(TEXTS, chunking=Chunking(aggregate="mean"))


def test_the_sparse_retriever_reads_every_window(short_splade):
    from embedrank.retrieval.sparse import SparseRetriever

    docs = {f"d{i}": {"title": "", "text": t} for i, t in enumerate(TEXTS)}
    retriever = SparseRetriever.from_corpus(short_splade, docs, chunking=Chunking())
    expected = short_splade.encode(TEXTS, chunking=Chunking())
    np.testing.assert_array_equal(retriever.vectors.toarray(), expected.toarray())
    run = retriever.retrieve({"q": "proteins and cells"}, k=3)
    scores = retriever.vectors.toarray() @ short_splade.encode(["proteins and cells"]).toarray()[0]
    assert list(run["q"]) == [f"d{i}" for i in np.argsort(-scores, kind="stable") if scores[i] > 0]


@pytest.mark.slow  # runs eval/run.py as a subprocess
def test_the_harness_names_a_windowed_splade_and_fuses_it(short_splade, tmp_path):
    """--sparse-windows: the splade stage reads every window and is named ``splade~windows`` alone and in the
    fusions, whose -cv systems find it; --sparse-max-seq-length sets the window it reads (``splade~N``)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from embedrank.evaluation.benchmark import BenchmarkConfig, run_benchmark
    from embedrank.retrieval.data import load_beir, write_demo_collection
    from embedrank.retrieval.sparse import SparseRetriever

    root = Path(__file__).resolve().parents[2]
    collection = write_demo_collection(tmp_path / "data")
    base = BenchmarkConfig(sparse_model=short_splade.spec.path, sparse_max_seq_length=16, use_cache=False)
    windowed = run_benchmark(
        collection, BenchmarkConfig(**{**base.__dict__, "retriever": "splade", "sparse_windows": True})
    )
    assert windowed.system == "splade~16~windows"
    assert any("every window of a long document (max per term) of 16 tokens" in n for n in windowed.notes)
    ds = load_beir(collection)
    expected = SparseRetriever.from_corpus(short_splade, ds.corpus, chunking=Chunking()).retrieve(ds.queries, 100)
    assert windowed.run == expected
    first = run_benchmark(collection, BenchmarkConfig(**{**base.__dict__, "retriever": "splade"}))
    assert first.system == "splade~16" and first.run != windowed.run  # the demo's documents are longer than 16 tokens
    assert windowed.to_json()["sparse_windows"] and first.to_json()["sparse_max_seq_length"] == 16

    out = subprocess.run(
        [sys.executable, str(root / "eval" / "run.py"), "--sparse-model", short_splade.spec.path,
         "--sparse-max-seq-length", "16", "--sparse-windows", "--retriever", "bm25", "splade", "hybrid:bm25+splade",
         "--fusion-cv", "2", "--fresh-bm25", "--no-cache", "--run-dir", str(tmp_path / "runs"),
         "--test", "hybrid:bm25+splade~16~windows-cv", "--baseline", "bm25", "--json-out", str(tmp_path / "r.json")],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert {r["system"] for r in report["runs"]} >= {"splade~16~windows", "hybrid:bm25+splade~16~windows"}
    assert {c["system"] for c in report["comparisons"]} == {"hybrid:bm25+splade~16~windows-cv"}
