"""A FAISS index built shard by shard and merged into one, as FAISS's own sharded IVF recipe does.

1. :func:`train_empty`: train the index (IVF centroids, PQ codebooks) once, on a sample of the vectors.
2. :func:`build_shard`: each shard of vectors goes into its own copy of that trained, empty index
   (shards are independent: processes, threads or Ray tasks can build them in parallel).
3. :func:`merge_shards`: ``merge_from`` moves every shard's inverted lists into the first, shifting the
   shards' row numbers so that the string ids stay aligned.

The merged index searches exactly like one built in a single process on the same trained index with the
same vectors in the same order; it saves and loads with :func:`~embedrank.retrieval.index.load_index` and
keeps the model-mismatch guard. :func:`index_from_embeddings` does all three over the shards of a corpus
embedding job (:mod:`embedrank.retrieval.embed_job`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.retrieval.embed_job import read_shard
from embedrank.retrieval.index import FaissIndex, IndexConfig


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


def merge_shards(shards: Sequence[FaissIndex]) -> FaissIndex:
    """One index holding every shard's vectors, in shard order (the first shard is extended in place)."""
    import faiss

    if not shards:
        raise InvalidInputError("nothing to merge")
    merged = shards[0]
    for shard in shards[1:]:
        if (shard.dimension, shard.config, shard.model_id) != (merged.dimension, merged.config, merged.model_id):
            raise InvalidInputError("shards differ in dimension, configuration or model")
        duplicated = set(shard.ids) & set(merged._positions)
        if duplicated:
            raise InvalidInputError(f"document {sorted(duplicated)[0]!r} is in two shards")
        # IVF lists store row numbers (shift them); flat codes are appended in order (FAISS refuses a shift)
        merged._index.merge_from(shard._index, len(merged) if faiss.try_extract_index_ivf(merged._index) else 0)
        merged._commit(list(shard.ids))
    return merged


def index_from_embeddings(
    directory: str | Path,
    config: IndexConfig | None = None,
    *,
    sample_size: int = 100_000,
    workers: int = 2,
    seed: int = 0,
) -> FaissIndex:
    """Train on a seeded sample of a corpus embedding job's vectors, build one index per parquet shard
    (``workers`` threads; FAISS releases the GIL) and merge them."""
    root = Path(directory)
    manifest = json.loads((root / "manifest.json").read_text())
    cfg = config or IndexConfig(kind="ivf")
    files = [root / s["file"] for s in manifest["shards"]]

    def read(file: Path) -> tuple[list[str], np.ndarray]:
        return read_shard(file, manifest["dimension"])

    rng = np.random.default_rng(seed)
    share = min(1.0, sample_size / max(1, manifest["documents"]))
    sample = []
    for file in files:  # a fixed share of every shard: the sample is spread over the whole corpus
        _, vectors = read(file)
        keep = rng.random(len(vectors)) < share
        sample.append(vectors[keep])
    trained = train_empty(np.vstack(sample), cfg, model_id=manifest["model_id"])

    def shard(file: Path) -> FaissIndex:
        return build_shard(trained, *read(file))

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        shards = list(pool.map(shard, files))
    return merge_shards(shards)
