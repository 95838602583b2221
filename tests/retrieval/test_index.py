"""Index backends against the exact numpy oracle; save/load, metadata checks, training errors."""

from __future__ import annotations

import numpy as np
import pytest

from embedrank.errors import IndexMismatchError, IndexTrainingError, InvalidInputError
from embedrank.retrieval.index import FaissIndex, IndexConfig, NumpyIndex, build_index, load_index, recall_at_k
from embedrank.retrieval.pipeline import DenseRetriever


def _random(n, d=32, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


@pytest.mark.parametrize("metric", ["cosine", "dot", "l2"])
def test_flat_equals_numpy_oracle_random(metric):
    x, q = _random(500), _random(20, seed=1)
    ids = [f"doc{i}" for i in range(500)]
    exact = build_index(32, kind="numpy", metric=metric)
    flat = build_index(32, kind="flat", metric=metric)
    for index in (exact, flat):
        index.add(ids[:300], x[:300])  # incremental adds
        index.add(ids[300:], x[300:])
    s1, i1 = exact.search(q, 10)
    s2, i2 = flat.search(q, 10)
    assert i1 == i2
    np.testing.assert_allclose(s1, s2, rtol=1e-4, atol=1e-4)


def test_save_load_roundtrip_and_metadata_checks(tmp_path):
    x = _random(300)
    ids = [str(i) for i in range(300)]
    for kind in ("numpy", "flat", "hnsw", "ivf", "pq"):
        index = build_index(
            32, kind=kind, metric="cosine", model_id="m1", nlist=8 if kind in ("ivf", "pq") else None, pq_nbits=4
        )
        index.add(ids, x)
        before = index.search(x[:5], 5)
        path = index.save(tmp_path / kind)
        loaded = load_index(path, model_id="m1", dimension=32)
        assert len(loaded) == 300 and loaded.config.kind == kind
        after = loaded.search(x[:5], 5)
        assert before[1] == after[1]
        np.testing.assert_allclose(before[0], after[0], rtol=1e-5, atol=1e-5)
        with pytest.raises(IndexMismatchError, match="'m1'"):
            load_index(path, model_id="other-model")
        with pytest.raises(IndexMismatchError, match="384"):
            load_index(path, dimension=384)
        with pytest.raises(IndexMismatchError, match="dimension 16"):
            loaded.search(_random(2, d=16), 3)
    with pytest.raises(IndexMismatchError, match="not an embedrank index"):
        load_index(tmp_path)


def test_training_needs_enough_vectors():
    with pytest.raises(IndexTrainingError, match="nlist=64"):
        build_index(32, kind="ivf", nlist=64).add([str(i) for i in range(10)], _random(10))
    with pytest.raises(IndexTrainingError, match="256"):
        build_index(32, kind="pq", nlist=4, pq_nbits=8).add([str(i) for i in range(100)], _random(100))
    auto = build_index(32, kind="pq", nlist=4)  # code size chosen from the data: 16 centroids for 100 vectors
    auto.add([str(i) for i in range(100)], _random(100))
    assert len(auto) == 100


def test_bad_ids():
    index = build_index(32, kind="flat")
    index.add(["a", "b"], _random(2))
    with pytest.raises(InvalidInputError, match="duplicate"):
        index.add(["a"], _random(1))
    with pytest.raises(InvalidInputError, match="3 ids for 2"):
        index.add(["x", "y", "z"], _random(2))


def test_factory_and_protocol():
    index = build_index(32, kind="factory", factory="IVF4,Flat", metric="dot")
    index.add([str(i) for i in range(200)], _random(200))
    assert isinstance(index, FaissIndex) and len(index) == 200
    assert [row.shape for row in index.search(_random(1), 3)[0]] == [(3,)]
    from embedrank.retrieval.index import VectorIndex

    assert isinstance(NumpyIndex(8), VectorIndex) and isinstance(index, VectorIndex)
    assert IndexConfig().kind == "flat"


@pytest.mark.slow
@pytest.mark.data
def test_real_embeddings_flat_equals_oracle_and_ann_recall(scifact_sample_dense):
    ds, doc_vectors, query_vectors = scifact_sample_dense
    ids = list(ds.corpus)
    exact = build_index(384, kind="numpy")
    exact.add(ids, doc_vectors)
    _, truth = exact.search(query_vectors, 10)
    flat = build_index(384, kind="flat")
    flat.add(ids, doc_vectors)
    s_flat, got = flat.search(query_vectors, 10)
    assert got == truth
    np.testing.assert_allclose(s_flat, exact.search(query_vectors, 10)[0], atol=1e-5)
    for kind in ("ivf", "hnsw"):
        ann = build_index(384, kind=kind)
        ann.add(ids, doc_vectors)
        _, approx = ann.search(query_vectors, 10)
        recall = recall_at_k(approx, truth)
        assert recall >= 0.95, f"{kind} recall@10 vs exact = {recall:.3f}"


# Every kind, with settings that make the approximate ones return short rows (an IVF probe that reaches fewer
# than k vectors, k larger than the corpus), against the exact numpy oracle.
KINDS = {
    "flat": {},
    "ivf": {"nlist": 20, "nprobe": 1},
    "pq": {"nlist": 20, "nprobe": 1, "pq_m": 8, "pq_nbits": 4},
    "hnsw": {"hnsw_m": 4, "ef_search": 4},
    "factory": {"factory": "IVF20,Flat"},
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("k", [5, 100, 1000])
def test_every_kind_against_the_oracle_including_short_rows(kind, k):
    x, q = _random(400, seed=2), _random(12, seed=3)
    ids = [f"d{i}" for i in range(400)]
    exact = build_index(32, kind="numpy")
    exact.add(ids, x)
    ann = build_index(32, kind=kind, **KINDS[kind])
    ann.add(ids, x)
    if kind == "factory":
        ann.set_search_params(nprobe=1)
    scores, got = ann.search(q, k)
    ref_scores, ref_ids = exact.search(q, len(ids))
    assert len(scores) == len(got) == 12
    short = 0
    for row_scores, row_ids, true_scores, true_ids in zip(scores, got, ref_scores, ref_ids, strict=True):
        assert len(row_scores) == len(row_ids) <= min(k, 400)
        assert len(set(row_ids)) == len(row_ids)  # no id twice, no padding id
        assert np.all(np.diff(row_scores) <= 1e-6)  # best first
        truth = dict(zip(true_ids, true_scores, strict=True))
        if kind != "pq":  # PQ scores are approximate by design; the others score exactly
            np.testing.assert_allclose(row_scores, [truth[d] for d in row_ids], atol=1e-5)
        short += len(row_ids) < min(k, 400)
    if kind in ("ivf", "pq", "factory") and k >= 100:
        assert short > 0  # nprobe=1 reaches one of 20 lists: the case that used to break
    if kind in ("ivf", "factory"):  # probing every list is exact search
        ann.set_search_params(nprobe=20)
        _, full_ids = ann.search(q, k)
        assert full_ids == [row[: min(k, 400)] for row in ref_ids]


@pytest.mark.parametrize("kind", ["numpy", "flat", "hnsw", "ivf", "pq", "sq8", "binary"])
def test_skipped_rows_are_never_returned_and_the_rest_are_searched_as_before(kind):
    """``skip`` leaves rows out of every kind's search (FAISS's ID selector, with the index's own ``nprobe`` or
    ``efSearch``): what is returned equals the oracle over the other rows (approximate kinds: mostly), and a
    skip of the wrong shape is refused."""
    x, q = _random(400, seed=4), _random(10, seed=5)
    ids = [f"d{i}" for i in range(400)]
    skip = np.zeros(400, dtype=bool)
    skip[::3] = True
    config = {"ivf": {"nlist": 10, "nprobe": 10}, "pq": {"nlist": 10, "nprobe": 10, "pq_m": 8, "pq_nbits": 4}}
    index = build_index(32, kind=kind, metric="dot", **config.get(kind, {}))
    index.add(ids, x)
    oracle = build_index(32, kind="numpy", metric="dot")
    oracle.add([d for d, s in zip(ids, skip, strict=True) if not s], x[~skip])
    _, got = index.search(q, 10, skip=skip)
    _, want = oracle.search(q, 10)
    assert all(not skip[int(d[1:])] for row in got for d in row)
    if kind == "pq":  # its scores are approximate: the truth is its own ranking of every row, skipped ones left out
        want = [[d for d in row if not skip[int(d[1:])]][:10] for row in index.search(q, 400)[1]]
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, want, strict=True)])
    assert overlap == 1.0 if kind in ("numpy", "flat", "ivf", "sq8", "pq") else overlap >= 0.6, overlap
    _, unskipped = index.search(q, 10)
    assert any(skip[int(d[1:])] for row in unskipped for d in row)  # the same search without skip finds them
    every = np.ones(400, dtype=bool)
    assert index.search(q, 10, skip=every)[1] == [[] for _ in range(10)]
    with pytest.raises(InvalidInputError, match="skip must be"):
        index.search(q, 10, skip=skip[:-1])


class _FakeEncoder:
    """Just enough of an Encoder for DenseRetriever: fixed query vectors."""

    model_id = "fake"
    dimension = 32

    def encode_query(self, texts, batch_size=32):
        return _random(len(texts), seed=3)


def test_dense_retriever_accepts_short_rows():
    index = build_index(32, kind="ivf", nlist=20, nprobe=1)
    index.add([f"d{i}" for i in range(400)], _random(400, seed=2))
    run = DenseRetriever(_FakeEncoder(), index).retrieve({f"q{i}": "x" for i in range(12)}, 100)
    assert all(0 < len(docs) <= 100 for docs in run.values())
    assert any(len(docs) < 100 for docs in run.values())


@pytest.mark.parametrize("kind", ["numpy", "flat", "hnsw", "ivf"])
def test_reconstruct_returns_the_searched_vectors(kind):
    x = _random(300)
    index = build_index(32, kind=kind, nlist=8 if kind == "ivf" else None)
    index.add([str(i) for i in range(300)], x)
    got = index.reconstruct(["7", "3", "299"])
    expected = x[[7, 3, 299]] / np.linalg.norm(x[[7, 3, 299]], axis=1, keepdims=True)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    pq = build_index(32, kind="pq", nlist=4)
    pq.add([str(i) for i in range(300)], x)
    assert pq.reconstruct(["1"]) is None  # lossy codes are not the stored vectors


def test_each_index_class_loads_its_own_kind_and_refuses_another(tmp_path):
    from embedrank.errors import IndexMismatchError
    from embedrank.retrieval.binary_index import BinaryIndex

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(20, 16)).astype(np.float32)
    ids = [f"d{i}" for i in range(20)]
    for kind, cls in (("numpy", NumpyIndex), ("flat", FaissIndex), ("binary", BinaryIndex)):
        index = build_index(16, IndexConfig(kind=kind), model_id="m")
        index.add(ids, vectors)
        index.save(tmp_path / kind)
        again = cls.load(tmp_path / kind, model_id="m")
        assert type(again) is cls and again.ids == ids
        assert [h for h in again.search(vectors[:2], 3)[1]] == [h for h in index.search(vectors[:2], 3)[1]]
    with pytest.raises(IndexMismatchError, match="holds a 'numpy' index"):
        FaissIndex.load(tmp_path / "numpy")
    with pytest.raises(IndexMismatchError, match="holds a 'flat' index"):
        BinaryIndex.load(tmp_path / "flat")


def ast_imports(path):
    import ast

    return {n.module for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom) and n.module}


def test_index_modules_import_in_one_direction():
    import ast
    from pathlib import Path

    import embedrank.retrieval

    root = Path(embedrank.retrieval.__file__).parent
    imported = {
        name: {
            n.module
            for n in ast.walk(ast.parse((root / f"{name}.py").read_text()))
            if isinstance(n, ast.ImportFrom) and n.module
        }
        for name in ("index_base", "index", "binary_index")
    }
    # the base sits on the id table only (a leaf: it imports nothing of embedrank)
    assert {m for m in imported["index_base"] if m.startswith("embedrank.retrieval")} <= {"embedrank.retrieval.ids"}
    assert not any(m.startswith("embedrank") for m in ast_imports(root / "ids.py"))
    assert "embedrank.retrieval.index" not in imported["binary_index"]  # binary_index sits on the base only
