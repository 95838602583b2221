"""The corpus-embedding job on Ray Data and shard builds as Ray tasks, on a local Ray instance
(``ray.init(num_cpus=2)``) over real collections from ../shared/data. Needs the ``ray`` extra (CI installs it)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from embedrank.errors import InvalidInputError
from embedrank.retrieval.embed_job import embed_collection, iter_corpus, read_embeddings
from embedrank.retrieval.index import IndexConfig, load_index
from embedrank.retrieval.sharded_index import index_from_embeddings

pytestmark = pytest.mark.slow
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def ray_local():
    import ray
    import ray.cloudpickle

    # test hooks run inside the actors: ship this module's functions by value (tests/ is not importable there)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # Ray starts its workers at nice 15: on a machine busy with anything at the normal priority they get a few
    # percent of a core (the tests took 18+ minutes beside two busy loops); these workers are the test itself
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config={"worker_niceness": 0})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(written_corpus):
    return written_corpus  # 82 documents


@pytest.fixture(scope="module")
def local_job(tmp_path_factory, corpus, encoder):
    out = tmp_path_factory.mktemp("local")
    embed_collection(encoder, corpus, out, shard_size=30)
    return out


def _ray_job(corpus, out, **kw):
    from embedrank.retrieval.embed_ray import embed_collection_ray

    options = {"shard_size": 30, "concurrency": 2, "num_cpus": 0.75, "rows_per_call": 16} | kw
    return embed_collection_ray(MODEL, corpus, out, **options)


def _assert_same_job(got: Path, want: Path) -> None:
    got_ids, got_vectors = read_embeddings(got)
    want_ids, want_vectors = read_embeddings(want)
    assert got_ids == want_ids and len(set(got_ids)) == len(got_ids)
    np.testing.assert_allclose(got_vectors, want_vectors, atol=1e-6)
    manifest, expected = (json.loads((d / "manifest.json").read_text()) for d in (got, want))
    assert manifest == expected


def test_ray_output_equals_the_local_runner(ray_local, corpus, local_job, tmp_path):
    result = _ray_job(corpus, tmp_path / "ray")
    assert (result.documents, result.shards_written, result.shards_reused) == (82, 3, 0)
    _assert_same_job(tmp_path / "ray", local_job)
    assert read_embeddings(local_job)[0] == [doc_id for doc_id, _ in iter_corpus(corpus)]


def _kill_actor_once(ids: list[str], marker: str = "") -> None:
    """Kill the actor process the first time it sees document 41 (a test hook run inside the actor)."""
    if "41" in ids and not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        os._exit(1)


def _record(ids: list[str], log: str = "") -> None:
    with open(log, "a") as f:
        f.write("\n".join(ids) + "\n")


def test_a_killed_actor_is_retried_and_no_document_is_lost_or_duplicated(ray_local, corpus, local_job, tmp_path):
    import functools

    marker = tmp_path / "killed"
    hook = functools.partial(_kill_actor_once, marker=str(marker))
    result = _ray_job(corpus, tmp_path / "ray", on_batch=hook)
    assert marker.is_file(), "the hook did not fire: the test proved nothing"
    assert int(marker.read_text()) != os.getpid()  # it was an actor that died, not this process
    assert result.documents == 82
    _assert_same_job(tmp_path / "ray", local_job)


def test_ray_resumes_a_local_job_without_recomputing_written_shards(ray_local, corpus, local_job, tmp_path, encoder):
    out = tmp_path / "job"

    def crash(index):
        if index == 1:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError):
        embed_collection(encoder, corpus, out, shard_size=30, on_shard=crash)
    import functools

    log = tmp_path / "encoded.txt"
    result = _ray_job(corpus, out, on_batch=functools.partial(_record, log=str(log)))
    assert (result.shards_written, result.shards_reused) == (1, 2)
    encoded = log.read_text().split()
    assert sorted(encoded) == sorted(read_embeddings(local_job)[0][60:])  # only the last shard's documents
    _assert_same_job(out, local_job)
    with pytest.raises(InvalidInputError, match="other settings"):
        _ray_job(corpus, out, shard_size=40)


def test_a_parquet_corpus_gives_the_same_output(ray_local, corpus, local_job, tmp_path, encoder):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    table = pa.table({k: [str(r.get(k, "")) for r in records] for k in ("_id", "title", "text")})
    pq.write_table(table, tmp_path / "corpus.parquet", row_group_size=25)
    assert list(iter_corpus(tmp_path / "corpus.parquet")) == list(iter_corpus(corpus))
    # read_parquet lists files in a task of 1 CPU: leave it one beside the actors
    _ray_job(tmp_path / "corpus.parquet", tmp_path / "ray", num_cpus=0.5)
    got, want = read_embeddings(tmp_path / "ray"), read_embeddings(local_job)
    assert got[0] == want[0]
    np.testing.assert_allclose(got[1], want[1], atol=1e-6)


def test_shard_builds_as_ray_tasks_equal_the_threaded_build(ray_local, local_job, tmp_path):
    config = IndexConfig(kind="ivf", nlist=4, nprobe=2)
    threaded = index_from_embeddings(local_job, config)
    on_ray = index_from_embeddings(local_job, config, runner="ray")
    index_from_embeddings(local_job, config, runner="ray", on_disk=tmp_path / "ix")
    on_disk = load_index(tmp_path / "ix", model_id=MODEL)
    _, vectors = read_embeddings(local_job)
    want = threaded.search(vectors[:20], 10)
    for index in (on_ray, on_disk):
        got = index.search(vectors[:20], 10)
        assert got[1] == want[1] and index.ids == threaded.ids
        for a, b in zip(got[0], want[0], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_cli_with_the_ray_runner(ray_local, corpus, local_job, tmp_path, capsys):
    from embedrank.embed import main

    shutil.copy(corpus, tmp_path / "corpus.jsonl")
    argv = [str(tmp_path / "corpus.jsonl"), "--output", str(tmp_path / "o"), "--shard-size", "30", "--runner", "ray"]
    assert main([*argv, "--concurrency", "2", "--num-cpus", "0.75"]) == 0
    assert "82 documents" in capsys.readouterr().out
    got, want = read_embeddings(tmp_path / "o"), read_embeddings(local_job)
    assert got[0] == want[0]
    assert main([*argv, "--concurrency", "0"]) == 2


def test_the_defaults_are_sized_from_the_cluster_and_finish_on_two_cpus(ray_local, corpus, local_job, tmp_path):
    from embedrank.retrieval.embed_ray import embed_collection_ray

    # Ray's own defaults once (2 actors x 1 CPU + 0.25 for reading on 2 CPUs) never started; no numbers here
    result = embed_collection_ray(MODEL, corpus, tmp_path / "ray", shard_size=30, rows_per_call=16)
    assert result.documents == 82
    _assert_same_job(tmp_path / "ray", local_job)


def test_a_plan_the_cluster_cannot_schedule_is_refused_with_its_numbers(ray_local, corpus, tmp_path, capsys):
    from embedrank.embed import main

    with pytest.raises(InvalidInputError, match=r"2 actors x 1 CPU \+ 0.25 CPU for reading = 2.25 CPUs.*has 2"):
        _ray_job(corpus, tmp_path / "a", concurrency=2, num_cpus=1.0)
    with pytest.raises(InvalidInputError, match="largest node 2"):
        _ray_job(corpus, tmp_path / "b", concurrency=1, num_cpus=3.0)
    argv = [str(corpus), "--output", str(tmp_path / "c"), "--runner", "ray", "--num-cpus", "1"]
    assert main([*argv, "--concurrency", "2"]) == 2
    assert "Ray would wait for them forever" in capsys.readouterr().err
