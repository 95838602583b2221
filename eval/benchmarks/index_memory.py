#!/usr/bin/env python
"""Memory per vector of an index built from embedding-job shards, and what its document ids cost.

    python -m eval bench index-memory --vectors 1000000 --shard-size 100000

Writes ``--vectors`` seeded random unit vectors (``--dimension``, 384 as MiniLM) with BEIR-like string ids
(``doc-<n>-<hex>``) as an embedding job's parquet shards in a temporary folder, builds an IVF-PQ index
from them with :func:`~embedrank.retrieval.sharded_index.index_from_embeddings` (``--pq-m`` sub-quantizers
of 8 bits), and prints:

- resident memory per vector: of a fresh process that loads the saved index (what holding it costs), and
  of this process after the build (shards freed; it includes the allocator pools the build leaves);
- the index's serialized FAISS size per vector (codes and lists), and its ids' bytes per vector
  (``IdTable.nbytes``) beside what a Python list and dict of the same ids take (``tracemalloc``), the
  layout before ``IdTable``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from eval.harness.stats import rss_mib


def _load_in_fresh_process(saved: Path) -> dict:
    """RSS of a new process before and after ``load_index(saved)``: what holding the index costs, without
    the allocator pools a build leaves behind."""
    import subprocess

    code = (
        "import json, sys; from eval.harness.stats import rss_mib; "
        "from embedrank.retrieval.index import load_index; before = rss_mib(); index = load_index(sys.argv[1]); "
        "print(json.dumps({'before': before, 'after': rss_mib(), 'n': len(index)}))"
    )
    repo = Path(__file__).resolve().parents[2]  # where ``python -c`` finds the eval package
    done = subprocess.run(
        [sys.executable, "-c", code, str(saved)], cwd=repo, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vectors", type=int, default=1_000_000)
    p.add_argument("--shard-size", type=int, default=100_000)
    p.add_argument("--dimension", type=int, default=384)
    p.add_argument("--pq-m", type=int, default=48)
    args = p.parse_args(argv)
    from embedrank.retrieval.embed_job import write_manifest, write_shard
    from embedrank.retrieval.ids import IdTable
    from embedrank.retrieval.index import IndexConfig
    from embedrank.retrieval.sharded_index import index_from_embeddings

    rng = np.random.default_rng(0)
    ids = [f"doc-{i}-{rng.integers(0, 2**32):08x}" for i in range(args.vectors)]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        shards = []
        for number, start in enumerate(range(0, args.vectors, args.shard_size)):
            part = ids[start : start + args.shard_size]
            vectors = rng.standard_normal((len(part), args.dimension), dtype=np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            name = f"part-{number:05d}.parquet"
            write_shard(out / name, part, vectors)
            shards.append({"file": name, "documents": len(part)})
        signature = {"model_id": "synthetic", "dimension": args.dimension}
        write_manifest(out, {"signature": signature, "shard_size": args.shard_size}, shards)
        id_bytes_text = sum(len(d.encode()) for d in ids)

        tracemalloc.start()
        as_list = list(ids)  # copies of the pointers; the strings themselves are counted below
        positions = {d: i for i, d in enumerate(as_list)}
        list_dict = tracemalloc.get_traced_memory()[0]
        del as_list, positions
        tracemalloc.stop()
        strings = sum(sys.getsizeof(d) for d in ids)  # str objects: header + characters
        del ids
        gc.collect()

        before = rss_mib()
        started = time.perf_counter()
        index = index_from_embeddings(out, IndexConfig(kind="pq", pq_m=args.pq_m), workers=2)
        seconds = time.perf_counter() - started
        gc.collect()
        after = rss_mib()
        saved = out / "index"
        index.save(saved)
        faiss_bytes = (saved / "index.faiss").stat().st_size
        loaded = _load_in_fresh_process(saved)
    n = len(index)
    assert isinstance(index.ids, IdTable)
    report = {
        "vectors": n,
        "dimension": args.dimension,
        "index": f"IVF-PQ, pq_m={args.pq_m}, 8 bits, nlist={index.config.nlist or 'auto'}",
        "build_seconds": round(seconds, 1),
        "rss_before_mib": round(before, 1),
        "rss_after_mib": round(after, 1),
        "rss_bytes_per_vector_after_build": round((after - before) * 2**20 / n, 1),
        "rss_bytes_per_vector_loaded": round((loaded["after"] - loaded["before"]) * 2**20 / n, 1),
        "faiss_bytes_per_vector": round(faiss_bytes / n, 1),
        "ids_bytes_per_vector": round(index.ids.nbytes / n, 1),
        "id_text_bytes_per_vector": round(id_bytes_text / n, 1),
        "list_and_dict_bytes_per_vector": round((list_dict + strings) / n, 1),
    }
    print(json.dumps(report, indent=2))
    print(
        f"\n{n:,} vectors: loaded in a fresh process the index holds {report['rss_bytes_per_vector_loaded']} B per "
        f"vector (right after the build, with the allocator pools it leaves: {report['rss_bytes_per_vector_after_build']} B; "
        f"FAISS codes and lists {report['faiss_bytes_per_vector']} B, ids {report['ids_bytes_per_vector']} B "
        f"of which {report['id_text_bytes_per_vector']} B are the ids' characters); the same ids as a Python "
        f"list and dict: {report['list_and_dict_bytes_per_vector']} B per vector"
    )


if __name__ == "__main__":
    sys.exit(run())
