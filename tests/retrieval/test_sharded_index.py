"""A FAISS index built shard by shard against one trained index, then merged."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedrank.errors import IndexMismatchError, InvalidInputError
from embedrank.retrieval.embed_job import shard_name, write_shard
from embedrank.retrieval.index import IndexConfig, build_index, load_index
from embedrank.retrieval.sharded_index import build_shard, index_from_embeddings, merge_shards, train_empty


def _vectors(n=3000, d=32, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(40, d))
    x = centers[rng.integers(0, 40, n)] + 0.5 * rng.normal(size=(n, d))
    return x.astype(np.float32), [f"doc{i}" for i in range(n)]


@pytest.mark.parametrize(
    "config",
    [IndexConfig(kind="ivf", nlist=32, nprobe=6), IndexConfig(kind="pq", nlist=16, pq_m=8), IndexConfig(kind="sq8")],
    ids=lambda c: c.kind,
)
def test_merged_shards_search_exactly_like_one_index(config):
    x, ids = _vectors()
    trained = train_empty(x[::3], config, model_id="m")
    shards = [build_shard(trained, ids[a:b], x[a:b]) for a, b in ((0, 1000), (1000, 2200), (2200, 3000))]
    merged = merge_shards(shards)
    single = build_shard(trained, ids, x)
    queries = np.random.default_rng(1).normal(size=(25, 32)).astype(np.float32)
    got, want = merged.search(queries, 10), single.search(queries, 10)
    assert got[1] == want[1]
    for a, b in zip(got[0], want[0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(merged) == 3000 and merged.ids == ids and len(trained) == 0


def test_merged_index_saves_loads_and_guards_the_model(tmp_path):
    x, ids = _vectors(n=600)
    trained = train_empty(x, IndexConfig(kind="ivf", nlist=8), model_id="m")
    merged = merge_shards([build_shard(trained, ids[:300], x[:300]), build_shard(trained, ids[300:], x[300:])])
    loaded = load_index(merged.save(tmp_path / "ix"), model_id="m")
    assert loaded.search(x[:5], 3)[1] == merged.search(x[:5], 3)[1]
    with pytest.raises(IndexMismatchError, match="model"):
        load_index(tmp_path / "ix", model_id="another-model")
    with pytest.raises(InvalidInputError, match="two shards"):
        merge_shards([build_shard(trained, ids[:10], x[:10]), build_shard(trained, ids[5:15], x[5:15])])
    with pytest.raises(InvalidInputError, match="mergeable FAISS kind"):
        train_empty(x, IndexConfig(kind="binary"))


def test_index_from_an_embedding_job_directory(tmp_path):
    x, ids = _vectors(n=1000)
    shards = []
    for i, start in enumerate(range(0, 1000, 300)):
        write_shard(tmp_path / shard_name(i), ids[start : start + 300], x[start : start + 300])
        shards.append({"file": shard_name(i), "documents": len(ids[start : start + 300])})
    manifest = {"signature": {"model_id": "m", "dimension": 32}, "documents": 1000, "shards": shards}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    index = index_from_embeddings(tmp_path, IndexConfig(kind="flat"), sample_size=200)
    exact = build_index(32, kind="numpy")
    exact.add(ids, x)
    assert index.ids == ids and index.model_id == "m"
    assert index.search(x[:20], 5)[1] == exact.search(x[:20], 5)[1]
    ivf = index_from_embeddings(tmp_path, IndexConfig(kind="ivf", nlist=8), sample_size=400)
    assert len(ivf) == 1000 and ivf.search(x[:1], 1)[1] == [["doc0"]]


def _job_dir(path, x, ids, size=300):
    path.mkdir()
    shards = []
    for i, start in enumerate(range(0, len(ids), size)):
        write_shard(path / shard_name(i), ids[start : start + size], x[start : start + size])
        shards.append({"file": shard_name(i), "documents": len(ids[start : start + size])})
    manifest = {"signature": {"model_id": "m", "dimension": x.shape[1]}, "documents": len(ids), "shards": shards}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


@pytest.mark.parametrize("kind", ["ivf", "pq"])
def test_an_on_disk_merge_loads_and_searches_like_the_in_memory_merge(tmp_path, kind):
    x, ids = _vectors(n=2000)
    job = _job_dir(tmp_path / "job", x, ids, size=450)
    config = IndexConfig(kind=kind, nlist=16, nprobe=4, pq_m=8)
    in_memory = index_from_embeddings(job, config, sample_size=1000)
    on_disk = index_from_embeddings(job, config, sample_size=1000, on_disk=tmp_path / "ix")
    assert sorted(p.name for p in (tmp_path / "ix").iterdir()) == [
        "embedrank_index.json",
        "ids.offsets.npy",
        "ids.utf8",
        "index.faiss",
        "index.ivfdata",
    ]
    moved = (tmp_path / "ix").rename(tmp_path / "moved")  # the lists are found next to index.faiss
    loaded = load_index(moved, model_id="m")
    queries = np.random.default_rng(2).normal(size=(30, 32)).astype(np.float32)
    want = in_memory.search(queries, 10)
    for got in (on_disk.search(queries, 10), loaded.search(queries, 10)):
        assert got[1] == want[1]
        for a, b in zip(got[0], want[0], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6)
    assert loaded.ids == ids and len(loaded) == 2000
    with pytest.raises(InvalidInputError, match="IVF kind"):
        index_from_embeddings(job, IndexConfig(kind="sq8"), on_disk=tmp_path / "no")
