"""``python -m service --fronts N`` on real processes: two fronts share the port and answer as one process does;
``/metrics`` counts every process; the batch jobs, the vector stores' files and their searches run once, in the engine
process (a store's index held there, once); an engine process killed makes the fronts
answer 503 with Retry-After (``/health`` too) until it is back; a front killed is replaced; SIGTERM stops every
process and exits 0; a start that cannot succeed exits 3."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedrank.testing.fake import FakeEncoder
from embedrank.testing.launch import REPO, ServerURL, free_port, replica_command, running_server

pytestmark = pytest.mark.slow  # real servers as subprocesses

KEY = "replica-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
ENV = {
    "EMBEDRANK_MODELS": "fake=fake:encoder,jina=fake:encoder-with-adapters,reranker=fake:cross-encoder-with-adapters",
    "EMBEDRANK_API_KEYS": KEY,
    "HF_HUB_OFFLINE": "1",
}


def children(pid: int) -> list[int]:
    """The processes ``pid`` started, from ``/proc``."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def command_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def roles(server: ServerURL) -> dict[str, list[int]]:
    """The replica's children by role: ``engine`` and ``front``."""
    out: dict[str, list[int]] = {"engine": [], "front": []}
    for pid in children(server.pid):
        with_role = command_of(pid)
        out["engine" if "service.replica.engine" in with_role else "front"].append(pid)
    return out


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def embed(server: str, texts: list[str], timeout: float = 30) -> httpx.Response:
    return httpx.post(
        f"{server}/v1/embeddings", headers=HEADERS, json={"model": "fake", "input": texts}, timeout=timeout
    )


def wait_for(check, timeout: float = 60.0, every: float = 0.1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "not in time"
        time.sleep(every)


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerURL]:
    """One replica for the tests of this module (those that kill one of its processes check it recovers)."""
    from embedrank.testing.tiny_images import tiny_image_text

    folder = tmp_path_factory.mktemp("replica")
    models = f"{ENV['EMBEDRANK_MODELS']},clip={tiny_image_text('clip')}"
    env = {
        **ENV,
        "EMBEDRANK_MODELS": models,
        "EMBEDRANK_BACKEND": "torch",
        "EMBEDRANK_BATCH_DIR": str(folder / "batches"),
    }
    with running_server(env, fronts=2, log_path=str(folder / "replica.log")) as server:
        yield server


def test_two_fronts_share_the_port_and_answer_as_one_process(replica):
    fake = FakeEncoder("fake")
    texts = ["the cat sat", "on the mat", "tokens and more tokens"]
    got = embed(replica, texts)
    assert got.status_code == 200, got.text
    vectors = np.array([d["embedding"] for d in got.json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(vectors, fake.encode(texts), atol=1e-6)
    fronts = roles(replica)["front"]
    assert len(fronts) == 2 and len(roles(replica)["engine"]) == 1
    before = {pid: cpu_ticks(pid) for pid in fronts}
    with httpx.Client(headers=HEADERS, timeout=30) as one, httpx.Client(headers=HEADERS, timeout=30) as other:
        for i in range(200):  # new connections are spread over both fronts by the kernel
            client = one if i % 2 else other
            client.headers["Connection"] = "close"
            assert (
                client.post(f"{replica}/v1/embeddings", json={"model": "fake", "input": [f"t {i}"]}).status_code == 200
            )
    assert all(cpu_ticks(pid) > before[pid] for pid in fronts), "a front took no connection"
    models = httpx.get(f"{replica}/v1/models", headers=HEADERS, timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["fake", "jina", "reranker", "clip"]


def test_an_image_text_models_images_are_read_by_a_front_never_by_the_engine_process(replica):
    """A front reads and preprocesses the images; the engine process, which never decodes one, embeds their pixels
    as the library does; an image bomb is refused by the front, and the engine process runs on."""
    import base64
    import io

    from embedrank.models.image_text import ImageTextEncoder
    from embedrank.testing.hostile_files import png_claiming
    from embedrank.testing.tiny_images import drawn_image, tiny_image_text

    picture = drawn_image("circle", (30, 60, 220))
    out = io.BytesIO()
    picture.save(out, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
    body = {"model": "clip", "input": [url, "a blue circle"]}
    got = httpx.post(f"{replica}/v1/embeddings", headers=HEADERS, json=body, timeout=60)
    assert got.status_code == 200, got.text
    vectors = np.array([d["embedding"] for d in got.json()["data"]], dtype=np.float32)
    library = ImageTextEncoder.from_pretrained(tiny_image_text("clip"), backend="torch")
    np.testing.assert_allclose(vectors[0], library.encode_images([picture])[0], atol=1e-5)
    np.testing.assert_allclose(vectors[1], library.encode(["a blue circle"])[0], atol=1e-5)
    (engine,) = roles(replica)["engine"]
    bomb = "data:image/png;base64," + base64.b64encode(png_claiming(100_000, 100_000)).decode()
    refused = httpx.post(
        f"{replica}/v1/embeddings", headers=HEADERS, json={"model": "clip", "input": [bomb]}, timeout=60
    )
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "request_too_large", refused.text
    assert roles(replica)["engine"] == [engine]
    assert httpx.post(f"{replica}/v1/embeddings", headers=HEADERS, json=body, timeout=60).status_code == 200


def test_a_front_sends_each_rows_adapter_and_int8_takes_its_ranges(replica):
    """Rows tokenized in a front carry their adapter to the engine process; an adapter's int8 ranges are fitted
    through the engine (the front's model has no weights)."""
    from embedrank.math.quantization import quantize
    from embedrank.testing.fake import fake_model

    fake = fake_model("jina", "fake:encoder-with-adapters")
    texts = ["the cat sat", "on the mat"]
    for adapter in ("text-matching", "retrieval.passage", None):
        fields = {"adapter": adapter} if adapter else {}
        body = {"model": "jina", "input": texts, "embedding_types": ["int8"], **fields}
        got = httpx.post(f"{replica}/v1/embeddings", headers=HEADERS, json=body, timeout=30)
        assert got.status_code == 200, got.text
        data = got.json()["data"]
        vectors = np.array([d["embedding"] for d in data], dtype=np.float32)
        np.testing.assert_allclose(vectors, fake.encode(texts, adapter=adapter), atol=1e-6)
        int8 = np.array([d["embeddings"]["int8"] for d in data], dtype=np.int8)
        ranges = fake.quantization_ranges(adapter=adapter)
        np.testing.assert_array_equal(int8, quantize(fake.encode(texts, adapter=adapter), "int8", ranges))


def test_a_reranking_requests_adapter_reaches_the_engine_process_with_its_rows(replica):
    from embedrank.testing.fake import fake_model

    fake = fake_model("reranker", "fake:cross-encoder-with-adapters")
    query, documents = "reset my password", ["reset it under settings", "the office is closed"]
    for adapter in ("legal", "support", None):
        body = {"model": "reranker", "query": query, "documents": documents, "adapter": adapter}
        got = httpx.post(f"{replica}/v1/rerank", headers=HEADERS, json=body, timeout=30)
        assert got.status_code == 200, got.text
        scores = [r["relevance_score"] for r in sorted(got.json()["results"], key=lambda r: r["index"])]
        want = fake.score_rows(fake.tokenize_rows([(query, d) for d in documents], adapter=adapter)).values
        np.testing.assert_allclose(scores, want, atol=1e-6)
    body = {"model": "reranker", "query": query, "documents": documents, "adapter": "medical"}
    refused = httpx.post(f"{replica}/v1/rerank", headers=HEADERS, json=body, timeout=30)
    assert refused.status_code == 400 and "its adapters: support, legal" in refused.text, refused.text


def test_a_front_answers_small_requests_without_waiting_on_its_socket(replica):
    """Its connections are TCP with Nagle's algorithm off: 100 one-text requests one after the other on one connection
    take milliseconds each, where each would wait about 40 ms for the client's delayed acknowledgement otherwise (a
    bound with slack: 100 x 40 ms is 4 s)."""
    with httpx.Client(headers=HEADERS, timeout=30) as client:
        client.post(f"{replica}/v1/embeddings", json={"model": "fake", "input": ["warm"]})
        started = time.monotonic()
        for i in range(100):
            client.post(f"{replica}/v1/embeddings", json={"model": "fake", "input": [f"t {i}"]})
        assert time.monotonic() - started < 3.0


def metric(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_metrics_count_every_process_of_the_replica(replica):
    time.sleep(2.5)  # every front has reported what earlier tests sent
    before = httpx.get(f"{replica}/metrics", headers=HEADERS, timeout=10).text
    counted = metric(before, "embedrank_requests_total", route="/v1/embeddings", status="200")
    for i in range(40):  # a connection each: both fronts take some
        assert embed(replica, [f"text {i}"]).status_code == 200
    time.sleep(2.5)  # every front has reported since
    for _ in range(6):  # whichever front answers the scrape, the replica's figures
        text = httpx.get(f"{replica}/metrics", headers=HEADERS, timeout=10).text
        assert metric(text, "embedrank_requests_total", route="/v1/embeddings", status="200") == counted + 40
        assert metric(text, "embedrank_batch_size_count", model="fake") >= 1  # the engine process's
        assert metric(text, "embedrank_tokens_total", model="fake") >= 40 * 3


def test_a_batch_a_vector_stores_file_and_its_searches_run_once_in_the_engine_process(replica):
    lines = b"".join(
        json.dumps(
            {
                "custom_id": f"l{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "fake", "input": f"t {i}"},
            }
        ).encode()
        + b"\n"
        for i in range(20)
    )
    upload = httpx.post(
        f"{replica}/v1/files",
        headers=HEADERS,
        data={"purpose": "batch"},
        files={"file": ("in.jsonl", lines, "application/jsonl")},
        timeout=30,
    )
    assert upload.status_code == 200, upload.text
    body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
    batch = httpx.post(f"{replica}/v1/batches", headers=HEADERS, json=body, timeout=30).json()

    def finished():  # type: ignore[no-untyped-def]
        got = httpx.get(f"{replica}/v1/batches/{batch['id']}", headers=HEADERS, timeout=30).json()
        return got if got["status"] in ("completed", "failed") else None

    done = wait_for(finished, timeout=120, every=0.3)
    assert done["status"] == "completed" and done["request_counts"]["completed"] == 20, done
    content = httpx.get(f"{replica}/v1/files/{done['output_file_id']}/content", headers=HEADERS, timeout=30)
    assert [json.loads(x)["custom_id"] for x in content.content.splitlines()] == [f"l{i}" for i in range(20)]

    doc = httpx.post(
        f"{replica}/v1/files",
        headers=HEADERS,
        data={"purpose": "assistants"},
        files={"file": ("notes.txt", b"cats sit on mats\n\nfoxes jump over dogs", "text/plain")},
        timeout=30,
    ).json()
    store = httpx.post(
        f"{replica}/v1/vector_stores", headers=HEADERS, json={"name": "s", "file_ids": [doc["id"]]}, timeout=30
    ).json()

    def indexed():  # type: ignore[no-untyped-def]
        got = httpx.get(f"{replica}/v1/vector_stores/{store['id']}", headers=HEADERS, timeout=30).json()
        return got if got["file_counts"]["completed"] == 1 else None

    wait_for(indexed, timeout=120, every=0.3)
    search = f"{replica}/v1/vector_stores/{store['id']}/search"
    found = httpx.post(search, headers=HEADERS, json={"query": "cats"}, timeout=30)
    assert found.status_code == 200 and found.json()["data"], found.text
    for _ in range(8):  # a connection each: both fronts take some, and the engine process searches for them
        assert httpx.post(search, headers=HEADERS, json={"query": "cats"}, timeout=30).json() == found.json()
    time.sleep(1.5)  # every front has reported since
    text = httpx.get(f"{replica}/metrics", headers=HEADERS, timeout=10).text
    assert metric(text, "embedrank_vector_store_indexes_held") == 1  # once for the replica, not once per front
    assert metric(text, "embedrank_vector_store_chunks_held") >= 1
    deleted = httpx.delete(f"{replica}/v1/vector_stores/{store['id']}", headers=HEADERS, timeout=30)
    assert deleted.status_code == 200, deleted.text
    text = httpx.get(f"{replica}/metrics", headers=HEADERS, timeout=10).text  # the engine process's figures: now
    assert metric(text, "embedrank_vector_store_indexes_held") == 0  # the front told it


def test_a_killed_engine_process_makes_the_fronts_answer_503_until_it_is_back(replica):
    (engine,) = roles(replica)["engine"]
    os.kill(engine, signal.SIGKILL)
    refused = wait_for(lambda: (r := embed(replica, ["x"])).status_code == 503 and r, timeout=30)
    assert refused.headers["Retry-After"] and refused.json()["error"]["code"] == "not_ready"
    wait_for(lambda: httpx.get(f"{replica}/health", timeout=5).status_code == 503, timeout=30)
    # each front is ready again once it has seen its engine process answer (within half a second of each other)
    wait_for(lambda: all(embed(replica, ["back"]).status_code == 200 for _ in range(10)), timeout=90, every=0.3)
    # ready again once every front has told the engine process it is (each does every second)
    wait_for(lambda: all(httpx.get(f"{replica}/health", timeout=5).status_code == 200 for _ in range(10)), timeout=30)
    assert roles(replica)["engine"] != [engine]


def connections(pid: int, port: int) -> int:
    """TCP connections to ``port`` that process ``pid`` has accepted and holds open (from ``/proc``)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    held = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port, state, inode = int(fields[1].rsplit(":", 1)[1], 16), fields[3], fields[9]
            held += local_port == port and state == "01" and inode in inodes  # 01: established
    return held


def test_a_killed_front_is_replaced_and_its_replacement_takes_connections_once_ready(replica):
    fronts = roles(replica)["front"]
    os.kill(fronts[0], signal.SIGKILL)
    replaced = wait_for(lambda: (now := roles(replica)["front"]) and len(now) == 2 and fronts[0] not in now and now)
    assert fronts[1] in replaced
    (new,) = set(replaced) - {fronts[1]}
    port = int(replica.rsplit(":", 1)[1])
    with contextlib.ExitStack() as held:  # a connection each, kept open, until the new front holds one of them
        statuses = []
        while not connections(new, port):
            client = held.enter_context(httpx.Client(headers=HEADERS, timeout=30))
            statuses.append(client.post(f"{replica}/v1/embeddings", json={"model": "fake", "input": ["y"]}).status_code)
            assert len(statuses) < 2000, "the new front took no connection"
            time.sleep(0.01)
    assert set(statuses) == {200}, statuses  # the new front took none before it could answer them
    wait_for(lambda: all(httpx.get(f"{replica}/health", timeout=5).status_code == 200 for _ in range(10)), timeout=30)


def test_sigterm_stops_every_process_and_exits_0(tmp_path):
    env = {**os.environ, **ENV, "EMBEDRANK_BATCH_DIR": str(tmp_path / "b"), "EMBEDRANK_DRAIN_SECONDS": "5"}
    port = free_port()
    with running_server(env, fronts=2, port=port, inherit_env=False) as server:
        everyone = [server.pid, *children(server.pid)]
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=30) == 0
        assert time.monotonic() - started < 5 + 5
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in everyone[1:]), timeout=10)


def test_a_replica_that_cannot_start_exits_3(tmp_path):
    env = {**os.environ, **ENV, "EMBEDRANK_MODELS": "broken=fake:no-such-fake"}
    proc = subprocess.run(
        replica_command(free_port(), 2), cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 3, proc.stderr
    assert "embedrank: cannot start:" in proc.stderr
