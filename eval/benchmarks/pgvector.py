#!/usr/bin/env python
"""A vector store's dense search inside PostgreSQL with pgvector, against the index each replica holds in memory
(what the service does): the figures behind searching stores from the replicas rather than in the database.

For each size, the same seeded clustered 384-dimension unit vectors as ``eval/benchmarks/store_index.py`` (MiniLM's
size) go into a table ``chunks (id integer, embedding vector(384))`` (``COPY``) of PostgreSQL 16.2 with pgvector
0.6.2, both from the ``pgserver`` wheel on PyPI (``pip install -e ".[pgvector]"``), started on the loopback for
the run with its table in shared buffers. Single-query searches for the top 10 by inner product
(``ORDER BY embedding <#> $1 LIMIT 10``, a prepared statement over a psycopg connection, as a replica would
send them), alternate
with the service's own :class:`~embedrank.retrieval.store.StoreIndex` in process, A B A B: each exact (a scan;
PostgreSQL's parallel workers allowed) and through HNSW with the same parameters (M 32, construction 200,
search 128: the library's defaults; pgvector's ``m``, ``ef_construction``, ``hnsw.ef_search``). Printed per
size and system: p50 and p99 latency in milliseconds, the HNSW build time (pgvector: ``CREATE INDEX`` with one
parallel worker beside the leader on 2 cores), recall@10 against the exact search, and the bytes a chunk takes
(the table and its indexes; in memory: the vectors, and FAISS's HNSW graph).

    python -m eval bench pgvector                          # about 10 minutes on 2 cores
    python -m eval bench pgvector --sizes 2000 --queries 20
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from embedrank.retrieval.store import StoreIndex
from embedrank.testing.postgres import running_postgres
from eval.harness.stats import percentile
from eval.harness.synthetic import DIMENSION, clusters, store, vectors

HNSW = {"m": 32, "ef_construction": 200, "ef_search": 128}
"""The library's HNSW defaults (:class:`~embedrank.retrieval.index_base.IndexConfig`), given to both."""
SERVER = {
    "shared_buffers": "4GB",
    "maintenance_work_mem": "4GB",  # pgvector builds HNSW in memory when it fits
    "max_parallel_maintenance_workers": "1",
    "jit": "off",
}


def pgserver_bindir() -> Path:
    """The PostgreSQL binaries of the ``pgserver`` wheel (found without importing it: its import touches the
    user's runtime folder)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit('pgserver is not installed: pip install -e ".[pgvector]"')
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def literal(v: np.ndarray) -> str:
    """pgvector's text form of one vector."""
    return "[" + ",".join(f"{x:.8g}" for x in v) + "]"


def searcher(url: str, queries: np.ndarray, *, scan: bool) -> Callable[[int], list[int]]:
    """The top-10 search of query ``i`` of ``queries`` in the ``chunks`` table, over a connection of its own: a
    scan of every row, or through the HNSW index (set once for the connection). The queries' text forms are made
    before the clock starts, as the in-memory search gets its vectors ready-made."""
    import psycopg

    db = psycopg.connect(url, autocommit=True)
    db.execute(f"SET enable_indexscan = {'off' if scan else 'on'}")
    db.execute(f"SET hnsw.ef_search = {HNSW['ef_search']}")
    search = "SELECT id FROM chunks ORDER BY embedding <#> %s::vector LIMIT 10"
    texts = [literal(q) for q in queries]
    return lambda i: [r[0] for r in db.execute(search, (texts[i],), prepare=True).fetchall()]


def in_memory(index: StoreIndex, queries: np.ndarray) -> Callable[[int], list[int]]:
    return lambda i: [int(d) for d in index.dense(queries[i : i + 1], None, 10)["0"]]


def measure(db: Any, url: str, x: np.ndarray, queries: np.ndarray) -> None:
    """Load ``x`` into the table, build both HNSW indexes, search ``queries`` A B A B; print a row per system."""
    n = len(x)
    db.execute("DROP TABLE IF EXISTS chunks")
    db.execute(f"CREATE TABLE chunks (id integer PRIMARY KEY, embedding vector({DIMENSION}))")
    with db.cursor().copy("COPY chunks (id, embedding) FROM STDIN") as copy:
        for i, v in enumerate(x):
            copy.write_row((i, literal(v)))
    db.execute("VACUUM ANALYZE chunks")
    table_bytes = db.execute("SELECT pg_total_relation_size('chunks')").fetchone()[0]
    exact, ann = store(x, "flat"), store(x, "hnsw")
    t0 = time.perf_counter()
    ann.approximate()
    ann.wait_built()
    builds = {"in memory HNSW": time.perf_counter() - t0}
    t0 = time.perf_counter()
    db.execute(
        "CREATE INDEX chunks_hnsw ON chunks USING hnsw (embedding vector_ip_ops) "
        f"WITH (m = {HNSW['m']}, ef_construction = {HNSW['ef_construction']})"
    )
    builds["pgvector HNSW"] = time.perf_counter() - t0
    hnsw_bytes = db.execute("SELECT pg_relation_size('chunks_hnsw')").fetchone()[0]
    systems = {
        "pgvector exact": searcher(url, queries, scan=True),
        "in memory exact": in_memory(exact, queries),
        "pgvector HNSW": searcher(url, queries, scan=False),
        "in memory HNSW": in_memory(ann, queries),
    }
    for run in systems.values():  # warm: plans prepared, pages in shared buffers
        for i in range(min(5, len(queries))):
            run(i)
    times: dict[str, list[float]] = {name: [] for name in systems}
    found: dict[str, list[set[int]]] = {name: [] for name in systems}
    for i in range(len(queries)):
        for name, run in systems.items():  # A B A B
            t = time.perf_counter()
            hits = run(i)
            times[name].append((time.perf_counter() - t) * 1000)
            found[name].append(set(hits))
    graph = ann.approximate()
    assert graph is not None
    sizes = {
        "pgvector exact": table_bytes / n,
        "in memory exact": 4 * DIMENSION,  # the chunks' float32 vectors
        "pgvector HNSW": (table_bytes + hnsw_bytes) / n,
        "in memory HNSW": 4 * DIMENSION + float(graph.bytes_per_vector),  # the vectors, and FAISS's own copy and graph
    }
    for name in systems:
        recall = statistics.mean(len(a & b) / 10 for a, b in zip(found[name], found["in memory exact"], strict=True))
        build = f"{builds[name]:.1f}" if name in builds else ""
        p50, p99 = statistics.median(times[name]), percentile(times[name], 99)
        print(f"| {n:,} | {name} | {p50:.2f} | {p99:.2f} | {build} | {recall:.3f} | {sizes[name]:,.0f} |")


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 200_000], help="chunks per store")
    p.add_argument("--queries", type=int, default=200, help="searches per size and system (default 200)")
    args = p.parse_args(argv)
    import psycopg

    rng = np.random.default_rng(0)
    with (
        running_postgres(bindir=pgserver_bindir(), settings=SERVER) as url,
        psycopg.connect(url, autocommit=True) as db,
    ):
        db.execute("CREATE EXTENSION vector")
        (version,) = db.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()  # type: ignore[misc]
        (server,) = db.execute("SHOW server_version").fetchone()  # type: ignore[misc]
        print(f"PostgreSQL {server}, pgvector {version}; top 10 by inner product, one query at a time, A B A B")
        print("| chunks | system | p50 ms | p99 ms | HNSW build s | recall@10 | bytes per chunk |")
        print("|---|---|---|---|---|---|---|")
        for n in args.sizes:
            centres = clusters(rng)
            measure(db, url, vectors(n, centres, rng), vectors(args.queries, centres, rng))
    return 0


if __name__ == "__main__":
    sys.exit(run())
