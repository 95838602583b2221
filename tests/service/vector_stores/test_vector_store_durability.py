"""Vector stores through crashes and across replicas, on real server processes and the packaged model (slow).

- One server on its SQLite store, killed with SIGKILL three times at random points while it reads 60 files
  of 8 documents each, then started again: every file ``completed``, each holding its 8 chunks once, in
  order, and a search for each document's own title finds that document exactly once.
- Two replicas on one real PostgreSQL server (and one shared folder): a store made through one is searched
  through the other, and a file attached through the second is found through the first.

A failure prints the random seed of its kill points; ``STORE_KILL_SEED=<seed>`` replays them.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from embedrank.testing.launch import ServerURL, running_server

pytestmark = pytest.mark.slow

KEY = "store-durability-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
TOPICS = ["volcanoes", "tides", "glaciers", "coral reefs", "monsoons", "deserts", "auroras", "earthquakes"]


def title(file: int, doc: int) -> str:
    return f"Report {file}-{doc} on {TOPICS[doc]} in region {file}"


def corpus_file(file: int) -> bytes:
    rows = [
        {
            "_id": f"{file}-{doc}",
            "title": title(file, doc),
            "text": f"Field notes about {TOPICS[doc]} gathered by team {file}.",
        }
        for doc in range(len(TOPICS))
    ]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def upload(server: str, name: str, content: bytes) -> str:
    made = httpx.post(
        f"{server}/v1/files",
        headers=HEADERS,
        data={"purpose": "assistants"},
        files={"file": (name, content)},
        timeout=60,
    )
    assert made.status_code == 200, made.text
    return str(made.json()["id"])


def call(method: str, url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    resp = httpx.request(method, url, headers=HEADERS, json=body, timeout=120)
    assert resp.status_code == 200, (url, resp.text)
    return dict(resp.json())


def wait_counts(server: str, store_id: str, *, completed: int | None = None, timeout: float = 600) -> dict[str, int]:
    """The store's file counts once ``completed`` files are read (None: once none is in progress)."""
    deadline = time.monotonic() + timeout
    while True:
        counts = call("GET", f"{server}/v1/vector_stores/{store_id}")["file_counts"]
        if (completed is None and counts["in_progress"] == 0) or (
            completed is not None and counts["completed"] >= completed
        ):
            return dict(counts)
        assert time.monotonic() < deadline, counts
        time.sleep(0.05)


def kill(server: ServerURL) -> None:
    os.kill(server.pid, signal.SIGKILL)
    server.process.wait(timeout=30)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Any]:
    count = 0

    def start(env: dict[str, str]) -> Any:
        nonlocal count
        count += 1
        # no embedding cache: every chunk costs a forward pass, so the kills land while files are being read
        settings = {"EMBEDRANK_API_KEYS": KEY, "HF_HUB_OFFLINE": "1", "EMBEDRANK_EMBEDDING_CACHE_BYTES": "0", **env}
        return running_server(settings, log_path=str(tmp_path / f"server-{count}.log"))

    yield start


def test_a_server_killed_three_times_while_reading_files_indexes_each_document_once(servers, tmp_path):
    files, seed = 60, int(os.environ.get("STORE_KILL_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    env = {"EMBEDRANK_BATCH_DIR": str(tmp_path / "store")}
    store_id = None
    for low, high in ((0.05, 0.3), (0.35, 0.6), (0.65, 0.9)):
        with servers(env) as server:
            if store_id is None:
                ids = [upload(server, f"reports-{i}.jsonl", corpus_file(i)) for i in range(files)]
                store_id = call("POST", f"{server}/v1/vector_stores", {"name": "reports", "first_stage": "hybrid"})[
                    "id"
                ]
                call("POST", f"{server}/v1/vector_stores/{store_id}/file_batches", {"file_ids": ids})
            counts = wait_counts(server, store_id, completed=int(rng.uniform(low, high) * files))
            time.sleep(rng.uniform(0, 0.3))  # anywhere: mid-file, mid-embedding, mid-write
            kill(server)
        assert counts["in_progress"] > 0, (seed, counts)
    assert store_id is not None
    with servers(env) as server:
        counts = wait_counts(server, store_id)
        assert counts == {"in_progress": 0, "completed": files, "failed": 0, "cancelled": 0, "total": files}, seed
        listed = call("GET", f"{server}/v1/vector_stores/{store_id}/files?limit=100")["data"]
        names = {}
        for file in listed:
            chunks = call("GET", f"{server}/v1/vector_stores/{store_id}/files/{file['id']}/content")["data"]
            names[file["id"]] = [c["text"].split("\n")[0] for c in chunks]
        assert sorted(len(v) for v in names.values()) == [len(TOPICS)] * files, f"seed {seed}"
        for file, doc in rng.sample([(f, d) for f in range(files) for d in range(len(TOPICS))], 80):
            page = call(
                "POST",
                f"{server}/v1/vector_stores/{store_id}/search",
                {"query": title(file, doc), "max_num_results": 50, "ranking_options": {"ranker": "none"}},
            )
            found = [hit["attributes"]["_id"] for hit in page["data"]]
            assert found.count(f"{file}-{doc}") == 1, (seed, file, doc, found[:5])
            assert found[0] == f"{file}-{doc}", (seed, file, doc, found[:5])


def test_two_replicas_on_one_postgresql_serve_one_store(servers, tmp_path, postgres_url):
    env = {"EMBEDRANK_BATCH_DIR": str(tmp_path / "shared"), "EMBEDRANK_BATCH_DATABASE": postgres_url}
    with servers(env) as first, servers(env) as second:
        store_id = call(
            "POST",
            f"{first}/v1/vector_stores",
            {"name": "shared", "file_ids": [upload(first, "a.jsonl", corpus_file(1))]},
        )["id"]
        wait_counts(first, store_id)
        hits = call("POST", f"{second}/v1/vector_stores/{store_id}/search", {"query": title(1, 3)})["data"]
        assert hits[0]["attributes"]["_id"] == "1-3"
        call(
            "POST",
            f"{second}/v1/vector_stores/{store_id}/files",
            {"file_id": upload(second, "b.jsonl", corpus_file(2))},
        )
        wait_counts(first, store_id)
        hits = call("POST", f"{first}/v1/vector_stores/{store_id}/search", {"query": title(2, 5)})["data"]
        assert hits[0]["attributes"]["_id"] == "2-5"
        assert call("GET", f"{first}/v1/vector_stores/{store_id}")["file_counts"]["completed"] == 2
