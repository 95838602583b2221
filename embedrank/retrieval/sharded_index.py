"""A FAISS index built shard by shard and merged into one, as FAISS's own sharded IVF recipe does.

1. :func:`train_empty`: train the index (IVF centroids, PQ codebooks) once, on a sample of the vectors.
2. :func:`build_shard`: each shard of vectors goes into its own copy of that trained, empty index
   (shards are independent: processes, threads or Ray tasks can build them in parallel).
3. :func:`merge_shards`: ``merge_from`` moves every shard's inverted lists into the first, shifting the
   shards' row numbers so that the string ids stay aligned.

The merged index searches exactly like one built in a single process on the same trained index with the
same vectors in the same order; it saves and loads with :func:`~embedrank.retrieval.index.load_index` and
keeps the model-mismatch guard. :func:`index_from_embeddings` does all three over the shards of a corpus
embedding job (:mod:`embedrank.retrieval.embed_job`), with the shard builds on threads or as Ray tasks.

When the merged index would not fit in memory, :func:`merge_shards_on_disk` merges IVF shards with FAISS's
``faiss.contrib.ondisk.merge_ondisk`` instead: the inverted lists go to one ``index.ivfdata`` file that
searches memory-map, next to ``index.faiss``; the directory loads with ``load_index`` like any other.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.retrieval.embed_job import read_manifest, read_shard
from embedrank.retrieval.ids import IdTable
from embedrank.retrieval.index import FaissIndex, IndexConfig

Runner = Literal["threads", "ray"]


def train_empty(sample: np.ndarray, config: IndexConfig, *, model_id: str | None = None) -> FaissIndex:
    """An empty FAISS index of ``config`` trained on ``sample`` ``(S, D)``."""
    if config.kind in ("numpy", "binary", "hnsw"):
        raise InvalidInputError(
            f"a sharded build needs a mergeable FAISS kind (flat, ivf, pq, sq8), got {config.kind!r}"
        )
    x = np.atleast_2d(np.asarray(sample, dtype=np.float32))
    index = FaissIndex(x.shape[1], config, model_id=model_id)
    if index._index is None:
        index._index = index._build(n_train=x.shape[0])
    if not index._index.is_trained:
        index._index.train(index._prepare(x, "sample"))
    return index


def build_shard(trained: FaissIndex, ids: Sequence[str], vectors: np.ndarray) -> FaissIndex:
    """A copy of the trained, empty ``trained`` index holding ``ids``/``vectors``."""
    import faiss

    if len(trained):
        raise InvalidInputError("build shards from an empty trained index")
    shard = FaissIndex(trained.dimension, trained.config, model_id=trained.model_id)
    shard._index = faiss.clone_index(trained._index)
    shard.add(ids, vectors)
    return shard


def _unseen(merged: IdTable, shard: Sequence[str]) -> list[str]:
    """``shard``'s ids as a list, refused if one of them is already in ``merged`` (or twice in ``shard``)."""
    ids = list(shard)
    duplicated = merged.first_duplicate(ids)
    if duplicated is not None:
        raise InvalidInputError(f"document {duplicated!r} is in two shards")
    return ids


def merge_shards(shards: Sequence[FaissIndex]) -> FaissIndex:
    """One index holding every shard's vectors, in shard order (the first shard is extended in place)."""
    import faiss

    if not shards:
        raise InvalidInputError("nothing to merge")
    merged = shards[0]
    for shard in shards[1:]:
        if (shard.dimension, shard.config, shard.model_id) != (merged.dimension, merged.config, merged.model_id):
            raise InvalidInputError("shards differ in dimension, configuration or model")
        shard_ids = _unseen(merged.ids, shard.ids)
        # IVF lists store row numbers (shift them); flat codes are appended in order (FAISS refuses a shift)
        merged._index.merge_from(shard._index, len(merged) if faiss.try_extract_index_ivf(merged._index) else 0)
        merged._commit(shard_ids)
    return merged


def merge_shards_on_disk(trained: FaissIndex, shards: Iterator[FaissIndex], directory: str | Path) -> FaissIndex:
    """Merge IVF ``shards`` (consumed one at a time: each is written to a file, then dropped) into a saved index
    in ``directory`` whose inverted lists live on disk (``index.ivfdata``, memory-mapped when searching)."""
    import faiss
    from faiss.contrib.ondisk import merge_ondisk

    if faiss.try_extract_index_ivf(trained._index) is None:
        raise InvalidInputError(f"an on-disk merge needs an IVF kind (ivf, pq), got {trained.config.kind!r}")
    out = Path(directory)
    parts = out / "shards.tmp"
    parts.mkdir(parents=True, exist_ok=True)
    ids = IdTable()
    files = []
    try:
        for number, shard in enumerate(shards):
            # give the shard's rows their global numbers (merge_ondisk's own shift_ids numbers them wrongly
            # in faiss 1.15: rows of later shards collide with earlier ones)
            shifted = faiss.clone_index(trained._index)
            shifted.merge_from(shard._index, len(ids))
            ids.extend(_unseen(ids, shard.ids))
            files.append(str(parts / f"{number:05d}.faiss"))
            faiss.write_index(shifted, files[-1])
            del shifted, shard
        merged = FaissIndex(trained.dimension, trained.config, model_id=trained.model_id)
        merged.signature = trained.signature
        merged._index = faiss.clone_index(trained._index)
        merge_ondisk(merged._index, files, str(out / "index.ivfdata"))
        merged.ids = ids
        merged.save(out)
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    return merged


def _to_bytes(index: FaissIndex) -> Any:
    import faiss

    return faiss.serialize_index(index._index)


def _from_bytes(data: Any, ids: list[str], config: IndexConfig, dimension: int, model_id: str | None) -> FaissIndex:
    import faiss

    index = FaissIndex(dimension, config, model_id=model_id)
    index._index = faiss.deserialize_index(data)
    index._commit(ids)
    return index


def _ray_build(
    trained: Any, file: str, config: IndexConfig, dimension: int, model_id: str | None
) -> tuple[list[str], Any]:
    """A Ray task: one shard's index, built from the serialized trained index, returned serialized."""
    ids, vectors = read_shard(file, dimension)
    return ids, _to_bytes(build_shard(_from_bytes(trained, [], config, dimension, model_id), ids, vectors))


def _build_shards(
    trained: FaissIndex, files: list[Path], dimension: int, runner: Runner, workers: int
) -> Iterator[FaissIndex]:
    """Every shard file's index, in order, built ``workers`` at a time on threads or as Ray tasks."""
    if runner == "ray":
        from embedrank.retrieval.embed_ray import import_ray

        ray = import_ray()
        started = not ray.is_initialized()
        if started:
            ray.init(include_dashboard=False, log_to_driver=False)
        try:
            task = ray.remote(_ray_build)
            trained_ref = ray.put(_to_bytes(trained))
            spec = (trained.config, dimension, trained.model_id)
            pending = [task.remote(trained_ref, str(f), *spec) for f in files]
            for ref in pending:  # in shard order; Ray runs them as CPUs allow
                ids, data = ray.get(ref)
                yield _from_bytes(data, ids, *spec)
        finally:
            if started:
                ray.shutdown()
        return
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        yield from pool.map(lambda f: build_shard(trained, *read_shard(f, dimension)), files)


def index_from_embeddings(
    directory: str | Path,
    config: IndexConfig | None = None,
    *,
    sample_size: int = 100_000,
    workers: int = 2,
    seed: int = 0,
    runner: Runner = "threads",
    on_disk: str | Path | None = None,
) -> FaissIndex:
    """Train on a seeded sample of a corpus embedding job's vectors, build one index per parquet shard
    (``runner="threads"``: ``workers`` threads, FAISS releases the GIL; ``"ray"``: one Ray task per shard, on
    the Ray instance already started or a local one) and merge them: in memory, or with ``on_disk=DIR`` into a
    saved index whose inverted lists stay on disk."""
    root = Path(directory)
    manifest = read_manifest(root)
    signature = manifest["signature"]
    cfg = config or IndexConfig(kind="ivf")
    files = [root / s["file"] for s in manifest["shards"]]

    def read(file: Path) -> tuple[list[str], np.ndarray]:
        return read_shard(file, signature["dimension"])

    rng = np.random.default_rng(seed)
    share = min(1.0, sample_size / max(1, manifest["documents"]))
    sample = []
    for file in files:  # a fixed share of every shard: the sample is spread over the whole corpus
        _, vectors = read(file)
        keep = rng.random(len(vectors)) < share
        sample.append(vectors[keep])
    trained = train_empty(np.vstack(sample), cfg, model_id=signature["model_id"])
    trained.signature = signature  # the merged index records the vectors' embedding signature
    shards = _build_shards(trained, files, signature["dimension"], runner, workers)
    if on_disk is not None:
        return merge_shards_on_disk(trained, shards, on_disk)
    merged = merge_shards(list(shards))
    merged.signature = signature
    return merged
