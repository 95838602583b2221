"""Batches through crashes, on real server processes and the packaged model (slow: each starts servers).

- One server on its SQLite store, killed with SIGKILL at random points of a 2,000-line batch, three times,
  then started again: the output holds every ``custom_id`` exactly once, in input order, each line the
  direct answer.
- Two replicas on one real PostgreSQL server (and one shared folder) run one batch together; one is killed
  with SIGKILL mid-way; the other finishes it once the dead one's claims run out.

A failure prints the random seed of its kill points; ``BATCH_KILL_SEED=<seed>`` replays them.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from embedrank.testing.launch import ServerURL, running_server

pytestmark = pytest.mark.slow

KEY = "durability-key"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TEXTS = [f"passage {i}: notes on topic {i % 17} with {i % 5} details" for i in range(200)]
HEADERS = {"Authorization": f"Bearer {KEY}"}


def batch_input(n: int) -> bytes:
    return b"".join(
        json.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": MODEL, "input": TEXTS[i % len(TEXTS)]},
            }
        ).encode()
        + b"\n"
        for i in range(n)
    )


def start_batch(server: str, n: int) -> str:
    files = {"file": ("in.jsonl", batch_input(n), "application/jsonl")}
    upload = httpx.post(f"{server}/v1/files", headers=HEADERS, data={"purpose": "batch"}, files=files, timeout=60)
    assert upload.status_code == 200, upload.text
    body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
    created = httpx.post(f"{server}/v1/batches", headers=HEADERS, json=body, timeout=30)
    assert created.status_code == 200, created.text
    return str(created.json()["id"])


def batch_of(server: str, batch_id: str) -> dict[str, Any]:
    got = httpx.get(f"{server}/v1/batches/{batch_id}", headers=HEADERS, timeout=30)
    assert got.status_code == 200, got.text
    return dict(got.json())


def wait_until(server: str, batch_id: str, done: int | None = None, timeout: float = 600) -> dict[str, Any]:
    """The batch once ``done`` lines are recorded (``None``: once it is finished)."""
    deadline = time.monotonic() + timeout
    while True:
        batch = batch_of(server, batch_id)
        counts = batch["request_counts"]
        if batch["status"] in ("completed", "failed", "expired", "cancelled"):
            return batch
        if done is not None and counts["completed"] + counts["failed"] >= done:
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.05 if done is not None else 0.5)


def check_output(server: str, batch: dict[str, Any], n: int, context: str) -> None:
    """Every line once, in input order, each the direct answer to its text."""
    assert batch["status"] == "completed", (context, batch)
    assert batch["request_counts"] == {"total": n, "completed": n, "failed": 0}, (context, batch)
    assert batch["error_file_id"] is None, context
    content = httpx.get(f"{server}/v1/files/{batch['output_file_id']}/content", headers=HEADERS, timeout=120)
    lines = [json.loads(x) for x in content.content.splitlines()]
    assert [line["custom_id"] for line in lines] == [f"line-{i}" for i in range(n)], context
    direct = httpx.post(f"{server}/v1/embeddings", headers=HEADERS, json={"model": MODEL, "input": TEXTS}, timeout=60)
    expected = np.array([d["embedding"] for d in direct.json()["data"]])
    got = np.array([line["response"]["body"]["data"][0]["embedding"] for line in lines])
    assert all(line["response"]["status_code"] == 200 for line in lines), context
    want = expected[np.arange(n) % len(TEXTS)]
    cosines = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() >= 0.9999, (context, float(cosines.min()))


def kill(server: ServerURL) -> None:
    os.kill(server.pid, signal.SIGKILL)
    server.process.wait(timeout=30)


def seed_of_this_run() -> int:
    return int(os.environ.get("BATCH_KILL_SEED") or random.randrange(2**32))


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Any]:
    """Starts servers with ``env`` (added to the key and offline settings), logs in ``tmp_path``."""
    count = 0

    def start(env: dict[str, str]) -> Any:
        nonlocal count
        count += 1
        log = tmp_path / f"server-{count}.log"
        # no embedding cache: with it, lines whose texts were seen finish almost at once, and a kill meant for
        # the middle of the batch could land after its end; every line costs a forward pass here
        settings = {"EMBEDRANK_API_KEYS": KEY, "HF_HUB_OFFLINE": "1", "EMBEDRANK_EMBEDDING_CACHE_BYTES": "0", **env}
        return running_server(settings, log_path=str(log))

    yield start


def test_a_server_killed_three_times_mid_batch_loses_nothing_and_does_nothing_twice(servers, tmp_path):
    n, seed = 2_000, seed_of_this_run()
    rng = random.Random(seed)
    env = {"EMBEDRANK_BATCH_DIR": str(tmp_path / "batches")}
    batch_id = None
    for low, high in ((0.05, 0.3), (0.35, 0.6), (0.65, 0.9)):  # three kills, each at a random point
        with servers(env) as server:
            batch_id = batch_id or start_batch(server, n)
            batch = wait_until(server, batch_id, done=int(rng.uniform(low, high) * n))
            time.sleep(rng.uniform(0, 0.5))  # anywhere: mid-chunk, between a part's write and its record, …
            kill(server)
        counts = batch["request_counts"]
        assert batch["status"] == "in_progress" and 0 < counts["completed"] < n, (seed, batch)
    assert batch_id is not None
    with servers(env) as server:
        batch = wait_until(server, batch_id)
        check_output(server, batch, n, f"seed {seed}")
    left = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "batches" / "parts").rglob("*"))
    assert not left, f"parts left after finalizing (seed {seed}): {left[:10]}"


def lines_recorded(server: str) -> int:
    text = httpx.get(f"{server}/metrics", headers=HEADERS, timeout=30).text
    found = re.search(r"^embedrank_batch_lines_recorded_total (\S+)$", text, re.M)
    return int(float(found[1])) if found else 0


def test_two_replicas_on_one_postgresql_finish_a_batch_one_killed_midway(servers, tmp_path, postgres_url):
    n, seed = 1_500, seed_of_this_run()
    rng = random.Random(seed)
    env = {
        "EMBEDRANK_BATCH_DIR": str(tmp_path / "shared"),  # what replicas must share: the files folder
        "EMBEDRANK_BATCH_DATABASE": postgres_url,
        "EMBEDRANK_BATCH_LEASE_SECONDS": "3",  # a dead replica's chunks are taken over 3 s after its last renewal
    }
    with servers(env) as first, servers(env) as second:
        batch_id = start_batch(first, n)
        deadline = time.monotonic() + 300
        while not (lines_recorded(first) and lines_recorded(second)):  # both work on it
            assert time.monotonic() < deadline, "the replicas did not both take part"
            time.sleep(0.1)
        wait_until(second, batch_id, done=int(rng.uniform(0.3, 0.6) * n))
        by_first, by_second = lines_recorded(first), lines_recorded(second)
        kill(first)  # it may record a few more chunks between that count and its death: no exact sum holds
        batch = wait_until(second, batch_id)
        check_output(second, batch, n, f"seed {seed}")
        assert by_first > 0 and lines_recorded(second) > by_second, (by_first, by_second, lines_recorded(second))
