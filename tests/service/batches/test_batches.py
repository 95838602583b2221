"""Batch jobs below HTTP: the store (claims, exactly-once chunks, owners), the input file's checks, and the
worker running lines as the direct requests would run, through a crash, a cancel and an expiry; each on
both databases (SQLite, and a real PostgreSQL server: slow, it starts one)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from embedrank.serving.engine import EngineConfig
from embedrank.serving.pool import ModelEntry, ModelPool
from service.batches.lines import read_input
from service.batches.store import SCHEMA, BatchRow, BatchStore, Chunk
from service.batches.worker import BatchWorker
from service.context import Context
from service.endpoints import BY_PATH
from service.errors import to_api_error
from service.settings import Auth, Engine, Settings
from service.storage.database import PostgresDatabase, SqliteDatabase

pytestmark = pytest.mark.kernel_free

SETTINGS = Settings(auth=Auth(api_keys=("k",)), engine=Engine(tune_malloc=False))
OWNER = "owner-a"
TEXTS = ["green tea", "black coffee with milk", "a cup of cocoa", "sparkling water", "fresh orange juice"]


def line(custom_id: str, body: dict[str, Any], url: str = "/v1/embeddings", method: str = "POST") -> bytes:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body}).encode() + b"\n"


def embeddings_file(n: int, *, bad: set[int] = frozenset()) -> bytes:
    return b"".join(
        line(f"req-{i}", {"model": "enc", "input": [] if i in bad else [TEXTS[i % 5], TEXTS[(i + 1) % 5]]})
        for i in range(n)
    )


def new_batch(
    store: BatchStore, content: bytes, endpoint: str = "/v1/embeddings", window_seconds: int = 86400
) -> BatchRow:
    """A batch of ``OWNER`` over ``content`` uploaded as its input file."""
    file = store.files.add_file(OWNER, "in.jsonl", "batch", content)
    return store.create_batch(
        OWNER,
        endpoint=endpoint,
        input_file_id=file.id,
        completion_window="24h",
        window_seconds=window_seconds,
        metadata=None,
    )


def read_lines(store: BatchStore, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in store.files.file_path(file_id).read_bytes().splitlines()]


def pool() -> ModelPool:
    return ModelPool(
        (ModelEntry(id="enc", path="fake:encoder"), ModelEntry(id="rer", path="fake:cross-encoder")),
    )


async def serve(
    store: BatchStore, until: Callable[[], bool], models: ModelPool | None = None, **options: Any
) -> BatchWorker:
    """Run a worker over ``models`` (default: fake ones) until ``until()`` holds (or 30 s), then stop it as a
    crash would. A model of ``models`` that cannot be loaded is left out, as with ``serve-others``."""
    models = models or pool()
    models.start(models.load(keep_going=True), EngineConfig(max_wait_ms=1))
    worker = BatchWorker(store, lambda: models, SETTINGS, poll_seconds=0.01, **options)
    task = asyncio.create_task(worker.run())
    for _ in range(3000):
        if until():
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await models.drain(1.0)
    return worker


def finished(store: BatchStore, batch_id: str) -> Callable[[], bool]:
    return lambda: store.get_batch(None, batch_id).status in ("completed", "failed", "cancelled", "expired")


async def direct(body: dict[str, Any], url: str = "/v1/embeddings") -> tuple[int, Any]:
    """What the direct request to ``url`` answers (the same decoding and core call as its route)."""
    from service.decoding import decode_strict

    models = pool()
    models.start(models.load(), EngineConfig(max_wait_ms=1))
    endpoint = BY_PATH[url]
    try:
        out, _ = await endpoint.call(
            decode_strict(json.dumps(body).encode(), endpoint.body), Context.of(models, SETTINGS)
        )
        return 200, json.loads(msgspec.json.encode(out))
    except Exception as exc:
        error = to_api_error(exc)
        return error.status, {
            "error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}
        }
    finally:
        await models.drain(1.0)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def store(request, tmp_path):
    """A store in ``tmp_path`` on SQLite, or on a database of its own on the session's PostgreSQL server."""
    database = PostgresDatabase(request.getfixturevalue("postgres_url")) if request.param == "postgres" else None
    store = BatchStore.at(tmp_path, database)
    yield store
    store.close()


def test_the_input_file_is_checked_line_by_line_before_anything_runs():
    good = line("a", {"input": "x"})
    cases = {
        b"{not json\n": "invalid_json_line",
        b'{"custom_id": "a", "method": "POST"}\n': "invalid_request_line",
        line("", {"input": "x"}): "missing_custom_id",
        good + line("a", {"input": "y"}): "duplicate_custom_id",
        line("a", {"input": "x"}, method="GET"): "invalid_method",
        line("a", {"input": "x"}, url="/v1/rerank"): "mismatched_url",
        line("a", "a text, not a request body"): "invalid_request_line",
        b"\n \n": "empty_file",
    }
    for content, code in cases.items():
        errors = read_input("b", content, "/v1/embeddings", chunk_lines=4, max_lines=10).errors
        assert [e["code"] for e in errors] == [code], (content, errors)
    errors = read_input("b", good + b"\n" + b"{oops\n", "/v1/embeddings", chunk_lines=4, max_lines=10).errors
    assert errors == [{"code": "invalid_json_line", "message": "the line is not valid JSON", "param": None, "line": 3}]
    assert read_input("b", embeddings_file(11), "/v1/embeddings", chunk_lines=4, max_lines=10).errors[0]["code"] == (
        "too_many_lines"
    )
    checked = read_input("b", embeddings_file(10), "/v1/embeddings", chunk_lines=4, max_lines=10)
    assert [(c.first_line, c.lines) for c in checked.chunks] == [(0, 4), (4, 4), (8, 2)]
    assert checked.chunks[-1].end_byte == len(embeddings_file(10))


def test_objects_belong_to_their_owner(store, tmp_path):
    batch = new_batch(store, b"x\n")
    file = store.files.get_file(OWNER, batch.input_file_id)
    assert store.files.get_file("owner-b", file.id) is None and store.get_batch("owner-b", batch.id) is None
    assert store.files.list_files("owner-b").rows == [] and store.list_batches("owner-b").rows == []
    assert store.cancel("owner-b", batch.id) is None and store.get_batch(OWNER, batch.id).status == "validating"
    assert not store.files.delete_file("owner-b", file.id) and store.files.file_path(file.id).exists()
    assert store.active_batches(OWNER) == 1 and store.active_batches("owner-b") == 0


def test_a_chunk_is_recorded_once_by_the_worker_that_holds_it(store, tmp_path):
    batch = new_batch(store, embeddings_file(3))
    assert store.start(batch.id, [Chunk(batch.id, 0, 0, 3, 0, len(embeddings_file(3)))])
    claimed = store.claim("w1", lease_seconds=-1)  # a lease that has already run out: w2 may take the chunk
    assert claimed is not None and store.claim("w2", lease_seconds=60) == claimed
    assert not store.finish("w1", claimed, b"late\n", b"", 3, 0)  # w1 lost it: nothing recorded, no part left
    assert store.finish("w2", claimed, b"out\n", b"", 3, 0)
    assert not store.finish("w2", claimed, b"again\n", b"", 3, 0)
    assert store.get_batch(OWNER, batch.id).completed == 3
    (chunk,) = store.chunks(batch.id)
    parts = sorted(p.name for p in (tmp_path / "parts" / batch.id).iterdir())
    assert parts == [f"{chunk.part}.err", f"{chunk.part}.out"] and chunk.part.startswith("0.w2.")
    assert store.part_path(batch.id, chunk.part, "out").read_bytes() == b"out\n"
    assert store.claim("w3", 60) is None


def test_lines_run_as_the_direct_requests_and_a_bad_line_gets_the_direct_error(store, tmp_path):
    content = embeddings_file(40, bad={7}) + line("rerank-typo", {"model": "enc", "inputs": ["x"]})
    batch = new_batch(store, content)
    worker = asyncio.run(serve(store, finished(store, batch.id), chunk_lines=8))
    done = store.get_batch(OWNER, batch.id)
    assert (done.status, done.total, done.completed, done.failed) == ("completed", 41, 39, 2)
    assert worker.lines_done == 41 and done.completed_at and done.in_progress_at and done.finalizing_at
    output, errors = read_lines(store, done.output_file_id), read_lines(store, done.error_file_id)
    assert [o["custom_id"] for o in output] == [f"req-{i}" for i in range(40) if i != 7]  # input order, once each
    assert {e["custom_id"] for e in errors} == {"req-7", "rerank-typo"}
    for i in (0, 13, 39):
        status, body = asyncio.run(direct({"model": "enc", "input": [TEXTS[i % 5], TEXTS[(i + 1) % 5]]}))
        got = next(o for o in output if o["custom_id"] == f"req-{i}")["response"]
        assert got["status_code"] == status == 200
        assert [d["embedding"] for d in got["body"]["data"]] == [d["embedding"] for d in body["data"]]
    for custom_id, body in (
        ("req-7", {"model": "enc", "input": []}),
        ("rerank-typo", {"model": "enc", "inputs": ["x"]}),
    ):
        status, expected = asyncio.run(direct(body))
        got = next(e for e in errors if e["custom_id"] == custom_id)["response"]
        assert got["body"]["error"].pop("request_id") == got["request_id"]  # the line's own request id
        assert (got["status_code"], got["body"]) == (status, expected) and status == 400
    assert not (tmp_path / "parts" / batch.id).exists()  # the parts are joined and gone


def test_an_unexpected_failure_of_a_line_is_a_500_line_and_is_logged_with_its_request_id(monkeypatch, caplog):
    from service.batches import lines

    async def broken(data, ctx):
        raise RuntimeError("a bug in the core")

    import dataclasses

    monkeypatch.setitem(lines.BATCH, "/v1/embeddings", dataclasses.replace(lines.BATCH["/v1/embeddings"], call=broken))
    (request,) = lines.request_lines(line("req-0", {"model": "enc", "input": "x"}))
    with caplog.at_level("ERROR", logger="embedrank.service"):
        status, body, request_id = asyncio.run(lines.run_line(request, Context(pool(), SETTINGS, cached=True)))
    assert status == 500 and json.loads(body)["error"]["code"] == "internal_error"
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert request_id in record.getMessage() and "req-0" in record.getMessage()
    assert record.exc_info and isinstance(record.exc_info[1], RuntimeError)


def test_a_worker_whose_models_are_not_ready_claims_nothing_and_the_batch_expires(store):
    """While its models load (or after loading failed) a replica claims no chunk: a claim renewed while waiting
    would keep the lines from a ready replica and the batch from ever expiring."""
    from embedrank.errors import NotReadyError

    def loading() -> ModelPool:
        raise NotReadyError("service is loading")

    batch = new_batch(store, embeddings_file(3), window_seconds=1)
    worker = BatchWorker(store, loading, SETTINGS, poll_seconds=0.01)

    async def run_until_finished() -> None:
        task = asyncio.create_task(worker.run())
        for _ in range(1000):
            if finished(store, batch.id)():
                break
            assert all(c.state != "claimed" for c in store.chunks(batch.id))
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run_until_finished())
    done = store.get_batch(OWNER, batch.id)
    assert done.status == "expired" and worker.lines_done == 0
    assert [e["error"]["code"] for e in read_lines(store, done.error_file_id)] == ["batch_expired"] * 3


def test_a_chunk_whose_models_stop_being_ready_is_given_back_unrecorded(store):
    from embedrank.errors import NotReadyError

    batch = new_batch(store, embeddings_file(4))
    models = pool()
    ready = {"calls": 0}

    def draining_after_two_lines() -> ModelPool:
        ready["calls"] += 1
        if ready["calls"] > 2:
            raise NotReadyError("service is draining")
        return models

    worker = BatchWorker(store, draining_after_two_lines, SETTINGS, chunk_lines=4)

    async def one_chunk() -> None:
        models.start(models.load(), EngineConfig(max_wait_ms=1))
        await worker.validate(store.get_batch(None, batch.id))
        chunk = store.claim(worker.name, 60)
        await asyncio.wait_for(worker.run_chunk(chunk), 30)
        await models.drain(1.0)

    asyncio.run(one_chunk())
    (chunk,) = store.chunks(batch.id)
    assert (chunk.state, chunk.claimed_by) == ("pending", None) and worker.lines_done == 0
    assert store.claim("another-replica", 60) is not None  # a ready replica takes it at once


def test_a_line_for_a_model_that_failed_to_load_gets_the_direct_503_and_the_batch_completes(store, broken_model):
    """With ``on_model_failure = "serve-others"``, a line naming the model that could not be loaded gets the
    direct request's 503 error body (waiting would not bring the model); the other lines run."""
    entries = (ModelEntry(id="enc", path="fake:encoder"), ModelEntry(id="broken", path=broken_model))
    content = embeddings_file(2) + line("to-broken", {"model": "broken", "input": "x"})
    batch = new_batch(store, content)
    asyncio.run(serve(store, finished(store, batch.id), ModelPool(entries)))
    done = store.get_batch(OWNER, batch.id)
    assert (done.status, done.completed, done.failed) == ("completed", 2, 1)
    (error,) = read_lines(store, done.error_file_id)
    assert error["response"]["status_code"] == 503
    assert error["response"]["body"]["error"]["code"] == "model_unavailable"
    assert "could not be loaded" in error["response"]["body"]["error"]["message"]


def test_a_reranking_batch_answers_as_the_direct_request(store, tmp_path):
    body = {"model": "rer", "query": "hot drinks", "documents": TEXTS, "top_n": 3}
    batch = new_batch(store, line("r", body, url="/v2/rerank"), "/v2/rerank")
    asyncio.run(serve(store, finished(store, batch.id)))
    (out,) = read_lines(store, store.get_batch(OWNER, batch.id).output_file_id)
    status, expected = asyncio.run(direct(body, "/v2/rerank"))
    assert out["response"]["body"]["results"] == expected["results"] and status == 200


def test_a_crash_in_the_middle_loses_nothing_and_does_nothing_twice(store, tmp_path):
    batch = new_batch(store, embeddings_file(300))
    recorded = lambda: sum(c.state == "done" for c in store.chunks(batch.id))  # noqa: E731
    for stop_after in (3, 9):  # two crashes, each with chunks in flight
        asyncio.run(serve(store, lambda n=stop_after: recorded() >= n, chunk_lines=10, concurrency=3))
        assert store.get_batch(OWNER, batch.id).status == "in_progress"
        store.release_claims()  # a single server starting again: no claim of the dead process holds
    asyncio.run(serve(store, finished(store, batch.id), chunk_lines=10, concurrency=3))
    done = store.get_batch(OWNER, batch.id)
    output = read_lines(store, done.output_file_id)
    assert done.status == "completed" and done.completed == 300 and done.failed == 0
    assert [o["custom_id"] for o in output] == [f"req-{i}" for i in range(300)]


def test_a_cancelled_batch_keeps_what_it_finished_and_an_expired_one_says_what_never_ran(store, tmp_path):
    batch = new_batch(store, embeddings_file(100))
    recorded = lambda: sum(c.state == "done" for c in store.chunks(batch.id))  # noqa: E731
    asyncio.run(serve(store, lambda: recorded() >= 2, chunk_lines=10, concurrency=1))
    assert store.cancel(OWNER, batch.id).status == "cancelling"
    store.release_claims()
    asyncio.run(serve(store, finished(store, batch.id)))
    done = store.get_batch(OWNER, batch.id)
    assert done.status == "cancelled" and done.cancelled_at and done.cancelling_at
    output = read_lines(store, done.output_file_id)
    assert len(output) == done.completed >= 20 and len({o["custom_id"] for o in output}) == len(output)

    expiring = new_batch(store, embeddings_file(100), window_seconds=0)
    asyncio.run(serve(store, finished(store, expiring.id)))
    done = store.get_batch(OWNER, expiring.id)
    errors = read_lines(store, done.error_file_id)
    assert done.status == "expired" and done.expired_at and done.output_file_id is None
    assert [e["custom_id"] for e in errors] == [f"req-{i}" for i in range(100)]
    assert errors[0]["response"] is None and errors[0]["error"]["code"] == "batch_expired"


def test_a_malformed_input_file_fails_the_batch_with_its_errors(store, tmp_path):
    batch = new_batch(store, embeddings_file(2) + b"{oops\n")
    asyncio.run(serve(store, finished(store, batch.id)))
    done = store.get_batch(OWNER, batch.id)
    assert done.status == "failed" and done.failed_at
    assert done.errors == [
        {"code": "invalid_json_line", "message": "the line is not valid JSON", "param": None, "line": 3}
    ]


def test_a_line_that_is_not_utf_8_fails_its_own_batch_and_every_other_batch_runs(store, tmp_path):
    """Invalid UTF-8 in a line's custom_id, method or url is that line's error, never the worker's: the other
    key's batch, created after it, completes."""
    poison = [
        b'{"custom_id": "a\xff", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}\n',
        b'{"custom_id": "b", "method": "PO\xffST", "url": "/v1/embeddings", "body": {"input": "x"}}\n',
        b'{"custom_id": "c", "method": "POST", "url": "/v1/\xc3(", "body": {"input": "x"}}\n',
    ]
    bad = new_batch(store, embeddings_file(2) + b"".join(poison))
    file = store.files.add_file("owner-b", "in.jsonl", "batch", embeddings_file(3))
    other = store.create_batch(
        "owner-b", endpoint="/v1/embeddings", input_file_id=file.id, completion_window="24h",
        window_seconds=86400, metadata=None,
    )  # fmt: skip
    asyncio.run(serve(store, lambda: finished(store, bad.id)() and finished(store, other.id)()))
    assert store.get_batch("owner-b", other.id).status == "completed"
    failed = store.get_batch(OWNER, bad.id)
    errors = failed.errors
    assert failed.status == "failed" and [(e["code"], e["line"]) for e in errors] == [
        ("invalid_json_line", 3),
        ("invalid_json_line", 4),
        ("invalid_json_line", 5),
    ]
    assert "not UTF-8" in errors[0]["message"]


def test_a_batch_whose_checking_fails_is_failed_after_a_few_tries_and_holds_up_no_other(store, tmp_path, monkeypatch):
    from service.batches import worker as worker_module

    bad = new_batch(store, embeddings_file(2))
    good = new_batch(store, embeddings_file(3))
    checked = worker_module.read_input

    def read_input(batch_id: str, *args: Any, **kwargs: Any) -> Any:
        if batch_id == bad.id:
            raise MemoryError("a reason of this batch's own")
        return checked(batch_id, *args, **kwargs)

    monkeypatch.setattr(worker_module, "read_input", read_input)
    asyncio.run(serve(store, lambda: finished(store, bad.id)() and finished(store, good.id)()))
    assert store.get_batch(OWNER, good.id).status == "completed"
    failed = store.get_batch(OWNER, bad.id)
    assert failed.status == "failed" and failed.errors == [
        {
            "code": "validation_failed",
            "message": "the input file could not be checked (MemoryError: a reason of this batch's own)",
            "param": None,
            "line": None,
        }
    ]


def test_workers_claiming_at_once_never_share_a_chunk_or_a_finalizing(store):
    """Eight workers (threads, each with its connection) claim until nothing is left: every chunk is claimed by
    exactly one of them; of two claims on finalizing the same batch, one wins."""
    from concurrent.futures import ThreadPoolExecutor

    content = embeddings_file(400)
    batch = new_batch(store, content)
    size = len(content) // 400
    assert store.start(batch.id, [Chunk(batch.id, n, n * 2, 2, n * 2 * size, (n + 1) * 2 * size) for n in range(200)])

    def claim_25(worker: str) -> list[int]:  # 8 workers x 25: every chunk, if no two ever take the same one
        claimed = [store.claim(worker, lease_seconds=600) for _ in range(25)]
        return [chunk.number for chunk in claimed if chunk is not None]

    with ThreadPoolExecutor(8) as pool:
        claims = list(pool.map(claim_25, [f"w{i}" for i in range(8)]))
    assert sorted(n for got in claims for n in got) == list(range(200)) and store.claim("late", 600) is None

    row = store.get_batch(None, batch.id)
    with ThreadPoolExecutor(2) as pool:
        won = list(pool.map(lambda w: store.claim_finalizing(w, row, "completed", 600), ["a", "b"]))
    assert sorted(won) == [False, True]
    assert store.ready_to_finalize() == []  # claimed: no other worker finalizes it while the claim holds
    assert store.ready_to_finalize(now=time.time() + 601)[0][1] == "completed"  # its claim ran out: taken over
    claimed = store.chunks(batch.id)[0]
    chunk = Chunk(batch.id, 0, claimed.first_line, 2, claimed.start_byte, claimed.end_byte)
    assert not store.finish(claimed.claimed_by, chunk, b"x\n", b"", 2, 0)  # being finalized: too late


def _started(store: BatchStore, owner: str, chunks: int) -> dict[str, Any]:
    """A batch of ``owner`` in progress, ``chunks`` chunks of two lines each."""
    content = embeddings_file(chunks * 2)
    file = store.files.add_file(owner, "in.jsonl", "batch", content)
    batch = store.create_batch(
        owner, endpoint="/v1/embeddings", input_file_id=file.id, completion_window="24h", window_seconds=86400,
        metadata=None,
    )  # fmt: skip
    size = len(content) // (chunks * 2)
    parts = [Chunk(batch.id, n, n * 2, 2, n * 2 * size, (n + 1) * 2 * size) for n in range(chunks)]
    assert store.start(batch.id, parts)
    return batch


def test_claims_take_turns_between_owners_so_a_small_batch_runs_beside_large_ones(store):
    """One key's two large batches came first; another key's one-chunk batch is claimed second, not after the
    large ones: the owner with the fewest chunks running goes next, then the one with the oldest batch."""
    large = [_started(store, OWNER, 10), _started(store, OWNER, 10)]
    small = _started(store, "owner-b", 1)
    claimed = [store.claim(f"w{i}", lease_seconds=600) for i in range(4)]
    assert [c.batch_id for c in claimed] == [large[0].id, small.id, large[0].id, large[0].id]
    assert store.finish("w0", claimed[0], b"{}\n{}\n", b"", 2, 0)  # a chunk of the first key ends: it runs 2 now
    third = _started(store, "owner-c", 2)
    # running now: the first key 2, the second 1 (its only chunk), the third none
    assert store.claim("w4", lease_seconds=600).batch_id == third.id
    assert store.claim("w5", lease_seconds=600).batch_id == third.id  # the second key has nothing left to claim
    assert store.claim("w6", lease_seconds=600).batch_id == large[0].id  # 2 running each: the oldest batch's key


def test_a_round_validates_one_batch_per_key_so_another_keys_batch_starts_at_once(store):
    """One key's three new batches and then another key's one: the first round of the worker validates the first
    key's oldest and the other key's, and claims their chunks, before the first key's other two."""
    mine = [new_batch(store, embeddings_file(4)) for _ in range(3)]
    file = store.files.add_file("owner-b", "in.jsonl", "batch", embeddings_file(2))
    theirs = store.create_batch(
        "owner-b", endpoint="/v1/embeddings", input_file_id=file.id, completion_window="24h",
        window_seconds=86400, metadata=None,
    )  # fmt: skip
    worker = BatchWorker(store, pool, SETTINGS)
    assert asyncio.run(worker._housekeeping())
    status = {b.id: store.get_batch(None, b.id).status for b in [*mine, theirs]}
    assert [status[b.id] for b in mine] == ["in_progress", "validating", "validating"]
    assert status[theirs.id] == "in_progress"


def test_the_lines_of_a_file_are_read_a_block_at_a_time_with_their_numbers_and_offsets():
    """Lines that are not blank, with their number and first byte, as splitting the whole file would give them,
    whatever the block size (a line longer than a block, blank runs across blocks, no final newline); the file
    is never read whole."""
    import io
    import random

    from service.batches.lines import written_lines

    def expected(content: bytes) -> list[tuple[int, bytes]]:
        return [(n, raw.strip()) for n, raw in enumerate(content.split(b"\n"), start=1) if raw.strip()]

    random.seed(7)
    pieces = [b"", b" ", b"\t", b"\r", b"{}", b'  {"a": 1}', b"x" * 9]
    for _ in range(2000):
        content = b"\n".join(random.choice(pieces) for _ in range(random.randint(0, 12)))
        block = random.randint(1, 8)
        got = list(written_lines(io.BytesIO(content), block))
        assert [(n, line.strip()) for n, _, line in got] == expected(content), (content, block)
        assert all(content[start : start + len(line)] == line for _, start, line in got)

    sizes: list[int] = []

    class Reads(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            sizes.append(-1 if size is None else size)
            return super().read(size)

    blank = Reads(b"\n" * 5_000_000 + line("a", {"input": "x"}))
    checked = read_input("b", blank, "/v1/embeddings", chunk_lines=10, max_lines=10)
    assert [(c.first_line, c.lines) for c in checked.chunks] == [(0, 1)]
    assert all(0 < size <= 1 << 20 for size in sizes) and len(sizes) > 4  # a block at a time, never read()


def test_files_without_a_row_and_rows_without_a_file_are_removed_once_old_enough(store):
    """What a crash or an outage leaves (a file whose row was never written, a temporary file, a row whose file
    went) is removed by the worker's first round, and counted; a file younger than the grace period (an upload
    whose row is being written) and every file with its row are kept."""
    import os

    kept = store.files.add_file(OWNER, "in.jsonl", "batch", embeddings_file(2))
    lost = store.files.add_file(OWNER, "lost.jsonl", "batch", embeddings_file(2))
    store.files.file_path(lost.id).unlink()  # its file went: the row is left
    old = time.time() - 3600
    stray, partial, young = (store.storage.root / "files" / n for n in ("file-stray", ".file-x.1a2b.tmp", "file-young"))
    for path in (stray, partial, young):
        path.write_bytes(b"{}\n")
    for path in (stray, partial):
        os.utime(path, (old, old))
    with store.storage.write() as db:  # the lost row is an hour old too
        db.execute("UPDATE files SET created_at = ? WHERE id = ?", (int(old), lost.id))
    worker = BatchWorker(store, pool, SETTINGS)
    asyncio.run(worker._housekeeping())
    assert worker.orphans_removed == 3
    assert not stray.exists() and not partial.exists() and young.exists()
    assert store.files.get_file(OWNER, lost.id) is None and store.files.get_file(OWNER, kept.id) is not None
    assert store.files.file_path(kept.id).exists()
    asyncio.run(worker._housekeeping())  # not again before sweep_seconds
    assert worker.orphans_removed == 3 and store.files.remove_orphans(grace_seconds=0) == 1  # the young one, now


def test_a_crash_while_finalizing_or_cleaning_up_is_finished_at_the_next_start(store, tmp_path):
    """A single server killed while it finalized a batch finalizes it again as soon as it starts (not after
    its claim on finalizing runs out), and part folders a crash left behind a closed batch are found."""
    content = embeddings_file(4)
    batch = new_batch(store, content)
    size = len(content) // 4
    assert store.start(batch.id, [Chunk(batch.id, n, n * 2, 2, n * 2 * size, (n + 1) * 2 * size) for n in (0, 1)])
    for _ in range(2):
        chunk = store.claim("dead", lease_seconds=600)
        assert chunk is not None and store.finish("dead", chunk, b"", b"", 2, 0)
    assert store.claim_finalizing("dead", store.get_batch(None, batch.id), "completed", 600)  # then it dies
    assert store.ready_to_finalize() == []  # another replica would wait for the claim to run out
    store.release_claims()  # the single server starting again: no claim of the dead process holds
    assert [(b.id, ending) for b, ending in store.ready_to_finalize()] == [(batch.id, "completed")]
    asyncio.run(serve(store, finished(store, batch.id)))
    assert store.get_batch(None, batch.id).status == "completed"

    closed, running = store.storage.root / "parts" / batch.id, store.storage.root / "parts" / new_batch(store, b"").id
    closed.mkdir(parents=True, exist_ok=True)
    (closed / "0.dead.1.out").write_bytes(b"{}\n")  # the crash came between closing and removing its parts
    running.mkdir()
    assert store.leftover_parts() == [closed]


def test_a_finalizing_claim_is_renewed_while_the_files_are_written(store, tmp_path, monkeypatch):
    """The finalizer renews its claim as a chunk's runner does, so a live but slow finalizer keeps it, and one
    that died is replaced one lease later (not ten)."""
    batch = new_batch(store, embeddings_file(20))
    slow = BatchWorker._write_results
    taken: list[bool] = []

    def write_slowly(self, row, ending):
        time.sleep(2.5)  # more than ten leases of 0.2 s: only renewals keep the claim
        taken.append(store.claim_finalizing("other", store.get_batch(None, row.id), ending, 0.2))
        return slow(self, row, ending)

    monkeypatch.setattr(BatchWorker, "_write_results", write_slowly)
    asyncio.run(serve(store, finished(store, batch.id), lease_seconds=0.2))
    assert taken == [False] and store.get_batch(None, batch.id).status == "completed"

    row = new_batch(store, embeddings_file(2))
    assert store.claim_finalizing("a", row, "cancelled", 600)
    assert store.renew_finalizing("a", row.id, 600) and not store.renew_finalizing("b", row.id, 600)


def test_creates_at_once_never_pass_the_limit_of_unfinished_batches(store):
    """The limit is counted in the transaction that inserts: eight creates at once (threads, each with its own
    connection, as replicas would be) with room for three make three batches, whatever their timing."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    from service.batches.store import TooManyBatchesError

    file = store.files.add_file(OWNER, "in.jsonl", "batch", embeddings_file(1))
    new_batch(store, embeddings_file(1))  # one unfinished batch already
    start = Barrier(8)

    def create(_: int) -> bool:
        start.wait()
        try:
            store.create_batch(
                OWNER, endpoint="/v1/embeddings", input_file_id=file.id, completion_window="24h",
                window_seconds=86400, metadata=None, max_active=4,
            )  # fmt: skip
        except TooManyBatchesError as exc:
            assert exc.limit == 4
            return False
        return True

    with ThreadPoolExecutor(8) as threads:
        made = list(threads.map(create, range(8)))
    assert sum(made) == 3 and store.active_batches(OWNER) == 4


def test_only_the_worker_holding_the_finalizing_closes_a_batch(store):
    """A finalizer whose claim ran out and was taken over cannot close the batch: the one holding it does, once."""
    batch = new_batch(store, embeddings_file(2))
    size = len(embeddings_file(2)) // 2
    assert store.start(batch.id, [Chunk(batch.id, 0, 0, 2, 0, 2 * size)])
    chunk = store.claim("w", 600)
    assert chunk is not None and store.finish("w", chunk, b"", b"", 2, 0)
    assert store.claim_finalizing("slow", store.get_batch(None, batch.id), "completed", 0.01)
    time.sleep(0.05)  # the slow finalizer's claim runs out; another takes it over
    assert store.claim_finalizing("fast", store.get_batch(None, batch.id), "completed", 600)
    assert not store.close_batch("slow", batch.id, "completed", "file-slow", None)
    assert store.get_batch(None, batch.id).status == "finalizing"
    assert store.close_batch("fast", batch.id, "completed", "file-fast", None)
    assert not store.close_batch("fast", batch.id, "completed", "file-again", None)  # closed once
    assert store.get_batch(None, batch.id).output_file_id == "file-fast"


def test_closing_the_sqlite_store_closes_every_thread_connection(tmp_path):
    import sqlite3
    from concurrent.futures import ThreadPoolExecutor

    store = BatchStore.at(tmp_path)
    with ThreadPoolExecutor(3) as threads:  # each thread reads through a connection of its own
        list(threads.map(lambda _: store.active_batches(OWNER), range(3)))
    conns = list(store.storage.db._all)  # type: ignore[attr-defined]
    assert len(conns) >= 2
    store.close()
    for conn in conns:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            conn.execute("SELECT 1")


def test_a_busy_or_failing_sqlite_database_is_unavailable_not_an_internal_error(tmp_path, monkeypatch):
    """SQLite's operational errors (its write lock held past the timeout at BEGIN or at COMMIT, an I/O error, a
    full disk) are :class:`DatabaseUnavailableError` (the documented 503), and the transaction is rolled back."""
    import sqlite3

    from service.errors import to_api_error
    from service.storage.database import DatabaseUnavailableError, SqliteDatabase

    db = SqliteDatabase(tmp_path / "t.db")
    with db.write() as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
    with pytest.raises(DatabaseUnavailableError) as failed, db.write() as conn:
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("INSERT INTO missing_table VALUES (1)")  # an operational error inside the transaction
    assert to_api_error(failed.value).status == 503
    assert db.connection().execute("SELECT COUNT(*) AS n FROM t").fetchone()["n"] == 0  # rolled back

    class CommitFails:  # COMMIT refused, as when another process holds the lock past the timeout
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn = conn

        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("database is locked")
            return self.conn.execute(sql, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.conn, name)

    real = db._connection()
    monkeypatch.setattr(db, "_connection", lambda: CommitFails(real))
    with pytest.raises(DatabaseUnavailableError, match="locked"), db.write() as conn:
        conn.execute("INSERT INTO t VALUES (2)")
    monkeypatch.undo()
    assert db.connection().execute("SELECT COUNT(*) AS n FROM t").fetchone()["n"] == 0
    db.close()


@pytest.mark.slow
def test_sql_with_percent_signs_and_quoted_question_marks_runs_on_postgresql(postgres_url):
    from service.storage.database import PostgresDatabase

    db = PostgresDatabase(postgres_url)
    with db.write() as conn:
        conn.execute("CREATE TABLE t (name TEXT)")
        conn.executemany("INSERT INTO t VALUES (?)", [("50% off",), ("what?",), ("plain",)])
    read = db.connection()
    assert read.execute("SELECT name FROM t WHERE name LIKE '%\\%%' ESCAPE '\\'").fetchone()["name"] == "50% off"
    rows = read.execute("SELECT name, '?' AS mark FROM t WHERE name LIKE ? ORDER BY name", ("%?",)).fetchall()
    assert [(r["name"], r["mark"]) for r in rows] == [("what?", "?")]
    db.close()


def test_a_chunk_whose_claim_cannot_be_renewed_is_given_up_after_one_lease(store, monkeypatch, caplog):
    """The store unreachable while a chunk runs: the watcher says so once and keeps the chunk while its lease
    lasts, then gives it up (another worker may hold it by then), instead of dying and leaving it running."""
    from service.batches import worker as worker_module
    from service.storage.database import DatabaseUnavailableError

    batch = new_batch(store, embeddings_file(2))
    worker = BatchWorker(store, pool, SETTINGS, lease_seconds=0.6)

    async def never_done(line, ctx):
        await asyncio.sleep(3600)

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseUnavailableError("PostgreSQL at db:5432: connection refused")

    async def run() -> float:
        await worker.validate(store.get_batch(None, batch.id))
        chunk = store.claim(worker.name, 0.6)
        monkeypatch.setattr(worker_module, "run_line", never_done)
        read = store.get_batch
        reads = iter([read])  # the chunk's own first read of its batch works; then the store is unreachable
        monkeypatch.setattr(store, "get_batch", lambda *a: next(reads, unreachable)(*a))
        monkeypatch.setattr(store, "renew", unreachable)
        monkeypatch.setattr(store, "release", unreachable)
        started = time.monotonic()
        await asyncio.wait_for(worker.run_chunk(chunk), 30)
        return time.monotonic() - started

    with caplog.at_level("WARNING", logger="embedrank.service"):
        took = asyncio.run(run())
    assert took >= 0.6  # kept while its lease lasted
    said = [r.getMessage() for r in caplog.records]
    assert sum("cannot be renewed" in m for m in said) == 1 and sum("given up" in m for m in said) == 1
    assert worker.lines_done == 0


def test_a_database_outage_is_one_log_line_per_try_with_the_traceback_at_debug(store, monkeypatch, caplog):
    """The worker outlasts an unreachable database: each try it says so in one line (no traceback above debug),
    while an unexpected failure of the store still logs its traceback."""
    from service.batches import worker as worker_module
    from service.storage.database import DatabaseUnavailableError

    monkeypatch.setattr(worker_module, "RETRY_SECONDS", 0.01)
    failures = iter([DatabaseUnavailableError("PostgreSQL at db:5432: connection refused")] * 3 + [KeyError("bug")])

    def failing(*args: Any) -> Any:
        raise next(failures, DatabaseUnavailableError("still down"))

    monkeypatch.setattr(store, "batches_in", failing)
    worker = BatchWorker(store, pool, SETTINGS, poll_seconds=0.01)

    async def run() -> None:
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0.3)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level("DEBUG", logger="embedrank"):
        asyncio.run(run())
    failed = [r for r in caplog.records if "the store failed" in r.getMessage()]
    outage = [r for r in failed if r.levelname == "ERROR" and "connection refused" in r.getMessage()]
    assert len(outage) == 3 and all(r.exc_info is None for r in outage)
    assert any(r.levelname == "DEBUG" and r.exc_info for r in failed)  # the traceback, at debug
    (bug,) = [r for r in failed if r.levelname == "ERROR" and r.exc_info]
    assert isinstance(bug.exc_info[1], KeyError)


def test_leases_are_read_on_the_database_clock_so_a_replica_ahead_in_time_takes_no_live_claim(
    store, tmp_path, monkeypatch
):
    """A replica whose own clock runs ten minutes ahead sees another's one-minute claim as live: claims and
    their leases are set and read on the database's clock, not each host's."""
    content = embeddings_file(2)
    batch = new_batch(store, content)
    assert store.start(batch.id, [Chunk(batch.id, 0, 0, 2, 0, len(content))])
    assert store.claim("replica-a", lease_seconds=60) is not None
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 600)  # this host's clock, ten minutes ahead
    assert store.claim("replica-b", lease_seconds=60) is None
    assert not store.renew("replica-b", Chunk(batch.id, 0, 0, 2, 0, len(content)), 60)
    assert store.renew("replica-a", Chunk(batch.id, 0, 0, 2, 0, len(content)), 60)


def test_timestamps_and_expiry_are_on_the_database_clock_whichever_host_writes_them(store, monkeypatch):
    """A replica whose own clock runs ten minutes ahead stamps its files and batches on the database's clock, so
    a batch it creates expires when the database says and another replica reads its times as written."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 600)  # this host's clock, ten minutes ahead
    batch = new_batch(store, embeddings_file(2), window_seconds=300)
    file = store.files.get_file(OWNER, batch.input_file_id)
    assert file is not None and abs(file.created_at - real()) < 5 and abs(batch.created_at - real()) < 5
    assert batch.expires_at - batch.created_at == 300
    assert store.cancel(OWNER, batch.id).cancelled_at == pytest.approx(real(), abs=5)


def test_an_error_quotes_at_most_200_characters_of_a_line_so_the_batch_object_stays_small(store):
    """Sixty lines whose url is a megabyte each: the batch's errors quote 200 characters of each, not all."""
    huge = "/v1/" + "x" * 1_000_000
    content = b"".join(line(f"req-{i}", {"input": "x"}, url=huge) for i in range(60))
    batch = new_batch(store, content)
    asyncio.run(serve(store, finished(store, batch.id)))
    failed = store.get_batch(OWNER, batch.id)
    errors = failed.errors
    assert failed.status == "failed" and len(errors) == 10  # the object lists ten ...
    assert all(e["code"] == "mismatched_url" and len(e["message"]) < 400 for e in errors)
    assert "(1000004 characters)" in errors[0]["message"]
    assert len(failed.errors) < 5_000
    in_file = read_lines(store, failed.error_file_id)  # ... its error file every one, with its line
    assert [(e["custom_id"], e["error"]["code"], e["error"]["line"]) for e in in_file] == [
        (None, "mismatched_url", n) for n in range(1, 61)
    ]
    assert store.files.get_file(OWNER, failed.error_file_id).purpose == "batch_output"


def test_a_file_whose_row_cannot_be_written_leaves_nothing_on_disk(store, monkeypatch):
    from service.storage.database import DatabaseUnavailableError

    def unreachable() -> Any:
        raise DatabaseUnavailableError("the database went away")

    monkeypatch.setattr(store.storage, "write", unreachable)
    with pytest.raises(DatabaseUnavailableError):
        store.files.add_file(OWNER, "in.jsonl", "batch", embeddings_file(1))
    assert list((store.storage.root / "files").iterdir()) == []


def test_store_errors_come_from_one_base_and_are_mapped_in_one_place():
    from service.batches.store import TooManyBatchesError
    from service.errors import InsufficientStorageError, StoreError, to_api_error
    from service.files.store import FileInUseError
    from service.storage.database import DatabaseUnavailableError

    cases = [
        (TooManyBatchesError(3), 429, "too_many_batches", None, "3 unfinished batches"),
        (FileInUseError("file 'f' is the input of batch 'b'"), 409, "file_in_use", "file_id", "file 'f'"),
        (DatabaseUnavailableError("db.internal:5432 refused"), 503, DatabaseUnavailableError.code, None, "database"),
        (InsufficientStorageError("/srv/batches: no space left"), 507, "insufficient_storage", None, "no room"),
    ]
    for exc, status, code, param, shown in cases:
        assert isinstance(exc, StoreError)
        error = to_api_error(exc)
        assert (error.status, error.code, error.param) == (status, code, param) and shown in error.message
        assert "db.internal" not in error.message and "/srv" not in error.message  # hosts and paths: the log only
        assert ("Retry-After" in error.headers) == (status == 503)


def test_the_store_names_a_batchs_result_files_and_writing_one_again_replaces_it(store):
    first = store.files.add_result_file("alice", "batch_abc", "output", [b'{"a": 1}\n'])
    again = store.files.add_result_file("alice", "batch_abc", "output", [b'{"a": 1}\n{"b": 2}\n'])
    assert first == again == "file-abc-output"
    row = store.files.get_file("alice", first)
    assert (row.filename, row.purpose, row.bytes) == ("batch_abc_output.jsonl", "batch_output", 18)
    assert [f.id for f in store.files.list_files("alice").rows] == ["file-abc-output"]
    assert store.files.add_result_file("alice", "batch_abc", "errors", [b""]) is None  # nothing to say: no file


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def test_a_database_of_the_earlier_shape_is_opened_with_its_finalizing_claim_as_a_lease(request, tmp_path, kind):
    """Databases made before chunks and finalizing shared one lease shape name the finalizing claim
    ``finalizer``/``finalize_until``: opening one renames them, keeps a live claim live, and opens again."""
    database = PostgresDatabase(request.getfixturevalue("postgres_url")) if kind == "postgres" else None
    database = database or SqliteDatabase(tmp_path / "batches.db")
    old = SCHEMA.replace(
        "claimed_by TEXT,\n    lease_until {real}\n);", "finalizer TEXT,\n    finalize_until {real}\n);", 1
    )
    assert old != SCHEMA and "finalizer TEXT" in old
    with database.write() as db:
        for statement in old.format(**database.words).split(";"):
            if statement.strip():
                db.execute(statement)
        until = time.time() + 600
        db.execute(
            "INSERT INTO batches (id, owner, endpoint, input_file_id, completion_window, status, created_at, "
            "expires_at, finalizer, finalize_until, ending) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                "batch_old",
                OWNER,
                "/v1/embeddings",
                "file-x",
                "24h",
                "finalizing",
                1,
                int(until),
                "w-old",
                until,
                "completed",
            ),
        )
    store = BatchStore.at(tmp_path, database)
    batch = store.get_batch(OWNER, "batch_old")
    assert batch is not None and (batch.claimed_by, batch.lease_until) == ("w-old", pytest.approx(until))
    assert store.ready_to_finalize() == [] and not store.claim_finalizing("w-new", batch, "completed", 60)
    assert store.renew_finalizing("w-old", "batch_old", 60) and not store.renew_finalizing("w-new", "batch_old", 60)
    again = BatchStore.at(tmp_path, database)  # renamed once: a second open finds the new names
    assert again.get_batch(None, "batch_old") == store.get_batch(None, "batch_old")
    store.close()
