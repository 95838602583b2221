"""OpenAI's Files and Batch API, driven by the openai SDK unchanged against the app (fake models, in
process): upload, create, retrieve, list, cancel, content, delete; each line answered as the direct request;
another key sees nothing; the limits refuse before any work."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from litestar.testing import TestClient

from embedrank.testing.fake import FakeEncoder
from service.app import create_app
from service.settings import Auth, Batches, Cache, Engine, Limits, ModelEntry, Models, Settings, Telemetry

pytestmark = pytest.mark.kernel_free

KEYS = ("key-a", "key-b")
MODELS = (ModelEntry(id="enc", path="fake:encoder"), ModelEntry(id="rer", path="fake:cross-encoder"))
TEXTS = ["green tea", "black coffee with milk", "a cup of cocoa", "sparkling water", "fresh orange juice"]


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def embed_line(i: int, **body: Any) -> dict[str, Any]:
    body = {"model": "enc", "input": [TEXTS[i % 5], TEXTS[(i + 2) % 5]], **body}
    return {"custom_id": f"e-{i}", "method": "POST", "url": "/v1/embeddings", "body": body}


@contextlib.contextmanager
def running_app(
    folder: Path, *, limits: Limits | None = None, batch_database: str | None = None, cache: Cache | None = None
) -> Iterator[TestClient]:
    """The app on the fake models, its batches in ``folder`` (and ``batch_database``), within ``limits``, with
    ``cache`` (default: the default embedding cache)."""
    config = Settings(
        auth=Auth(api_keys=KEYS),
        models=Models(entries=MODELS),
        engine=Engine(tune_malloc=False),
        limits=limits or Limits(),
        batches=Batches(batch_dir=str(folder), batch_database=batch_database),
        cache=cache or Cache(),
    )
    with TestClient(create_app(config, wait_for_models=True)) as client:
        yield client


@pytest.fixture
def app_client(tmp_path):
    limits = Limits(max_file_bytes=200_000, max_batch_lines=500, max_batches_in_flight=3)
    with running_app(tmp_path / "batches", limits=limits) as client:
        yield client


def sdk(client: TestClient, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=f"{client.base_url}/v1", http_client=client, max_retries=0)


def wait(api: openai.OpenAI, batch_id: str, seconds: float = 30.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = api.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def direct(client: TestClient, key: str, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    resp = client.post(url, json=body, headers={"Authorization": f"Bearer {key}"})
    return resp.status_code, resp.json()


def test_a_keys_files_are_bounded_on_the_shared_disk_and_deleting_makes_room(tmp_path):
    with running_app(tmp_path / "batches", limits=Limits(max_file_storage_per_key=1_000)) as client:
        api, other = sdk(client, KEYS[0]), sdk(client, KEYS[1])
        first = api.files.create(file=("a.jsonl", io.BytesIO(b"x" * 600)), purpose="batch")
        with pytest.raises(openai.RateLimitError, match="max_file_storage_per_key=1,000") as refused:
            api.files.create(file=("b.jsonl", io.BytesIO(b"x" * 600)), purpose="batch")
        assert refused.value.body["code"] == "file_storage_exceeded"  # type: ignore[index]
        assert other.files.create(file=("c.jsonl", io.BytesIO(b"x" * 600)), purpose="batch").bytes == 600
        assert [f.id for f in api.files.list().data] == [first.id]  # the refused upload left nothing
        api.files.delete(first.id)
        assert api.files.create(file=("b.jsonl", io.BytesIO(b"x" * 600)), purpose="batch").bytes == 600


def test_the_openai_sdk_runs_an_embeddings_batch_and_each_line_is_the_direct_answer(app_client):
    api = sdk(app_client, KEYS[0])
    rows = [embed_line(i) for i in range(120)] + [embed_line(120, input=[]), embed_line(121, dimensions=0)]
    uploaded = api.files.create(file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
    assert (uploaded.object, uploaded.purpose, uploaded.bytes, uploaded.filename) == (
        "file",
        "batch",
        len(jsonl(rows)),
        "in.jsonl",
    )
    batch = api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h", metadata={"job": "nightly"}
    )
    assert (
        batch.status == "validating"
        and batch.metadata == {"job": "nightly"}
        and batch.expires_at - batch.created_at == 86400
    )
    done = wait(api, batch.id)
    assert done.status == "completed" and done.request_counts.model_dump() == {
        "total": 122,
        "completed": 120,
        "failed": 2,
    }
    output = [json.loads(x) for x in api.files.content(done.output_file_id).content.splitlines()]
    errors = [json.loads(x) for x in api.files.content(done.error_file_id).content.splitlines()]
    assert [o["custom_id"] for o in output] == [f"e-{i}" for i in range(120)]
    for i in (0, 57, 119):
        status, body = direct(app_client, KEYS[0], "/v1/embeddings", rows[i]["body"])
        got = output[i]["response"]
        assert got["status_code"] == status == 200 and got["body"]["data"] == body["data"]
        assert got["body"]["usage"] == body["usage"] and output[i]["error"] is None
    for e in errors:
        status, body = direct(app_client, KEYS[0], "/v1/embeddings", rows[int(e["custom_id"][2:])]["body"])
        line = e["response"]["body"]
        assert line["error"].pop("request_id") == e["response"]["request_id"]  # the line's own request id
        assert body["error"].pop("request_id").startswith("req_")
        assert (e["response"]["status_code"], line) == (status, body) and status == 400
    assert [b.id for b in api.batches.list().data] == [batch.id]
    assert {f.purpose for f in api.files.list().data} == {"batch", "batch_output"}
    metrics = app_client.get("/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"}).text
    assert "embedrank_batch_lines_recorded_total 122.0" in metrics  # its rate is the lines per second
    assert "embedrank_batch_orphans_removed_total 0.0" in metrics  # nothing was left behind
    assert 'route="/v1/files/{file_id:str}/content",status="200"' in metrics  # a route with a parameter


def test_a_reranking_batch_on_cohere_v2s_route(app_client):
    api = sdk(app_client, KEYS[0])
    body = {"model": "rer", "query": "hot drinks", "documents": TEXTS, "top_n": 2}
    rows = [{"custom_id": f"r-{i}", "method": "POST", "url": "/v2/rerank", "body": body} for i in range(20)]
    uploaded = api.files.create(file=("rerank.jsonl", jsonl(rows)), purpose="batch")
    done = wait(api, api.batches.create(input_file_id=uploaded.id, endpoint="/v2/rerank", completion_window="24h").id)
    output = [json.loads(x) for x in api.files.content(done.output_file_id).content.splitlines()]
    _, expected = direct(app_client, KEYS[0], "/v2/rerank", body)
    assert len(output) == 20 and all(o["response"]["body"]["results"] == expected["results"] for o in output)


def test_another_key_sees_neither_files_nor_batches(app_client):
    mine, theirs = sdk(app_client, KEYS[0]), sdk(app_client, KEYS[1])
    uploaded = mine.files.create(file=("in.jsonl", jsonl([embed_line(0)])), purpose="batch")
    batch = mine.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    for call in (
        lambda: theirs.files.retrieve(uploaded.id),
        lambda: theirs.files.content(uploaded.id),
        lambda: theirs.files.delete(uploaded.id),
        lambda: theirs.batches.retrieve(batch.id),
        lambda: theirs.batches.cancel(batch.id),
        lambda: theirs.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert theirs.files.list().data == [] and theirs.batches.list().data == []
    assert wait(mine, batch.id).status == "completed"


def test_a_line_with_invalid_utf_8_fails_its_batch_and_another_keys_batch_completes(tmp_path):
    poison = (
        jsonl([embed_line(0)]) + b'{"custom_id": "e-\xff", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'
    )
    with running_app(tmp_path / "batches") as client:
        mine, theirs = sdk(client, KEYS[0]), sdk(client, KEYS[1])
        bad = mine.batches.create(
            input_file_id=mine.files.create(file=("in.jsonl", poison), purpose="batch").id,
            endpoint="/v1/embeddings",
            completion_window="24h",
        )
        uploaded = theirs.files.create(file=("in.jsonl", jsonl([embed_line(i) for i in range(3)])), purpose="batch")
        other = theirs.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        assert wait(theirs, other.id).status == "completed"
        failed = wait(mine, bad.id)
        assert failed.status == "failed" and [(e.code, e.line) for e in failed.errors.data] == [
            ("invalid_json_line", 2)
        ]
    with running_app(tmp_path / "batches") as client:  # and after a restart, a new batch runs as well
        theirs = sdk(client, KEYS[1])
        again = theirs.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        assert wait(theirs, again.id).status == "completed"


def test_a_line_obeys_the_limits_of_the_direct_request_with_its_error_body(tmp_path):
    """A line whose body is over max_body_bytes is refused as the same body sent directly is (413), and one over
    max_inputs as the direct request is (400); the error bodies are the direct ones, request id aside."""
    limits = Limits(max_body_bytes=2_000, max_inputs=4)
    big = embed_line(0, input=["green tea " * 60] * 4)  # 4 inputs (within max_inputs), 2.4 kB: past max_body_bytes
    many = embed_line(1, input=TEXTS)  # 5 inputs
    good = embed_line(2)
    with running_app(tmp_path / "batches", limits=limits) as client:
        api = sdk(client, KEYS[0])
        uploaded = api.files.create(file=("in.jsonl", jsonl([big, many, good])), purpose="batch")
        batch = wait(
            api, api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h").id
        )
        assert batch.status == "completed" and (batch.request_counts.completed, batch.request_counts.failed) == (1, 2)
        errors = {
            json.loads(row)["custom_id"]: json.loads(row)["response"]
            for row in api.files.content(batch.error_file_id).content.splitlines()
        }
        for line in (big, many):
            status, body = direct(client, KEYS[0], "/v1/embeddings", line["body"])
            assert errors[line["custom_id"]]["status_code"] == status and status in (400, 413)
            got = errors[line["custom_id"]]["body"]["error"]
            assert {**got, "request_id": None} == {**body["error"], "request_id": None}
        assert errors[big["custom_id"]]["status_code"] == 413


def test_listing_pages_with_after_and_limit(app_client):
    api = sdk(app_client, KEYS[0])
    uploaded = api.files.create(file=("in.jsonl", jsonl([embed_line(0)])), purpose="batch")
    made = [api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h").id]
    for _ in range(2):
        wait(api, made[-1])
        made.append(
            api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h").id
        )
    first = api.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2] and first.has_more
    rest = api.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in rest.data] == made[:1] and not rest.has_more
    assert [b.id for b in api.batches.list(limit=2)] == made[::-1]  # iterating a page fetches the next pages


def test_the_limits_refuse_before_any_work(app_client):
    api = sdk(app_client, KEYS[0])
    with pytest.raises(openai.APIStatusError) as err:
        api.files.create(file=("big.jsonl", b"x" * 300_000), purpose="batch")
    assert err.value.status_code == 413 and "max_file_bytes" in err.value.message
    with pytest.raises(openai.BadRequestError, match="purpose"):
        api.files.create(file=("in.jsonl", b"{}\n"), purpose="fine-tune")
    uploaded = api.files.create(file=("in.jsonl", jsonl([embed_line(i) for i in range(501)])), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="forever")
    for window in ("24h\n", "24h ", " 24h", "0h", "1000h", "90m", "48h"):  # 24h only, as OpenAI; never a 500
        with pytest.raises(openai.BadRequestError, match="completion_window"):
            api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window=window)
    failed = wait(
        api, api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h").id
    )
    assert failed.status == "failed" and failed.errors.data[0].code == "too_many_lines"
    assert api.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        api.files.retrieve(uploaded.id)


def test_a_key_may_have_so_many_batches_unfinished_and_a_cancelled_one_ends(tmp_path, monkeypatch):
    """While the models load, batches wait (validated, in progress); the fourth of one key is refused."""
    import threading

    from embedrank.serving.pool import ModelPool

    gate = threading.Event()
    real_load = ModelPool.load
    monkeypatch.setattr(ModelPool, "load", lambda self, **kw: gate.wait(30) and real_load(self, **kw))
    limits = Limits(max_batches_in_flight=3)
    settings = Settings(
        auth=Auth(api_keys=KEYS),
        models=Models(entries=MODELS),
        engine=Engine(tune_malloc=False),
        batches=Batches(batch_dir=str(tmp_path)),
        limits=limits,
        telemetry=Telemetry(metrics_batch_ids=True),
    )
    with TestClient(create_app(settings)) as client:
        api, other = sdk(client, KEYS[0]), sdk(client, KEYS[1])
        uploaded = api.files.create(file=("in.jsonl", jsonl([embed_line(i) for i in range(50)])), purpose="batch")
        made = [
            api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
            for _ in range(3)
        ]
        with pytest.raises(openai.RateLimitError, match="max_batches_in_flight"):
            api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        theirs = other.files.create(file=("in.jsonl", jsonl([embed_line(0)])), purpose="batch")
        assert other.batches.create(input_file_id=theirs.id, endpoint="/v1/embeddings", completion_window="24h").id
        deadline = time.monotonic() + 10
        while api.batches.retrieve(made[0].id).status == "validating" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert api.batches.retrieve(made[0].id).status == "in_progress"
        metrics = client.get("/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"}).text
        assert f'embedrank_batch_lines_waiting{{batch="{made[0].id}"}} 50.0' in metrics
        assert f'embedrank_batch_lines_done{{batch="{made[0].id}",outcome="completed"}} 0.0' in metrics
        with pytest.raises(openai.ConflictError, match="not finished"):  # an unfinished batch reads it
            api.files.delete(uploaded.id)
        assert api.batches.cancel(made[0].id).status == "cancelling"
        cancelled = wait(api, made[0].id)
        assert cancelled.status == "cancelled" and cancelled.output_file_id is None and cancelled.cancelled_at
        assert api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h").id
        gate.set()
        assert wait(api, made[1].id).status == "completed"


def test_the_schema_offers_exactly_the_endpoints_a_line_can_run():
    from typing import get_args

    from service.batches.schemas import BatchUrl
    from service.endpoints import BATCH

    assert set(get_args(BatchUrl)) == set(BATCH)


def cache_lookups(client: TestClient) -> dict[str, float]:
    metrics = client.get("/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"}).text
    found = re.findall(r'^embedrank_embedding_cache_lookups_total\{result="(\w+)"\} (\S+)$', metrics, re.M)
    return {result: float(value) for result, value in found}


def test_a_batch_run_again_with_5_percent_changed_computes_only_those(app_client):
    api = sdk(app_client, KEYS[0])

    def run(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        uploaded = api.files.create(file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
        done = wait(
            api, api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h").id
        )
        assert done.request_counts.completed == len(rows)
        return [json.loads(x) for x in api.files.content(done.output_file_id).content.splitlines()]

    def line(i: int, text: str) -> dict[str, Any]:
        return {
            "custom_id": f"c-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "enc", "input": text},
        }

    rows = [line(i, f"passage {i} on topic {i % 7}") for i in range(400)]
    first = run(rows)
    assert cache_lookups(app_client) == {"hit": 0.0, "miss": 400.0}
    changed = set(range(0, 400, 20))  # 5% of the texts edited
    rows = [line(i, f"passage {i} on topic {i % 7}, edited") if i in changed else rows[i] for i in range(400)]
    second = run(rows)
    assert cache_lookups(app_client) == {"hit": 380.0, "miss": 420.0}  # only the 20 edited ones computed
    for i in range(0, 400, 50):  # each line is the direct answer, edited or not
        status, body = direct(app_client, KEYS[0], "/v1/embeddings", rows[i]["body"])
        assert status == 200 and second[i]["response"]["body"]["data"] == body["data"]
    for i in set(range(400)) - changed:
        assert second[i]["response"]["body"]["data"] == first[i]["response"]["body"]["data"]
    assert cache_lookups(app_client) == {"hit": 380.0, "miss": 420.0}  # direct requests do not use it by default


def test_direct_requests_use_the_cache_when_configured_and_none_without_one(tmp_path):
    body = {"model": "enc", "input": TEXTS}
    for direct_too, expected in ((True, {"hit": 5.0, "miss": 5.0}), (False, {})):
        with running_app(
            tmp_path / f"batches-{direct_too}",
            cache=Cache(embedding_cache_direct=direct_too, embedding_cache_bytes=1 << 20 if direct_too else 0),
        ) as client:
            answers = [direct(client, KEYS[0], url, body)[1]["data"] for url in ("/v1/embeddings", "/v1/embeddings")]
            assert answers[0] == answers[1] and cache_lookups(client) == expected


def test_an_unreachable_batch_database_answers_503_with_retry_after_never_500(tmp_path):
    from embedrank.testing.launch import free_port

    auth = {"Authorization": f"Bearer {KEYS[0]}"}
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"  # nothing listens there
    with running_app(tmp_path / "batches", batch_database=nowhere) as client:
        for method, path, kwargs in (
            (
                "post",
                "/v1/files",
                {"files": {"file": ("in.jsonl", jsonl([embed_line(0)]))}, "data": {"purpose": "batch"}},
            ),
            ("get", "/v1/files", {}),
            ("get", "/v1/batches/batch_x", {}),
        ):
            resp = getattr(client, method)(path, headers=auth, **kwargs)
            assert resp.status_code == 503 and resp.headers["retry-after"] == "5", resp.text
            assert resp.json()["error"]["code"] == "batch_database_unavailable"
            assert "127.0.0.1" not in resp.text  # the server's address stays in the log
        assert client.get("/metrics", headers=auth).status_code == 200
        assert direct(client, KEYS[0], "/v1/embeddings", {"model": "enc", "input": "still served"})[0] == 200


def _form(parts: list[tuple[bytes, bytes]]) -> tuple[bytes, str]:
    """A multipart form written by hand (part headers, value), so that its bytes can be anything."""
    body = b"".join(b"--B0UNDARY\r\n" + head + b"\r\n\r\n" + value + b"\r\n" for head, value in parts)
    return body + b"--B0UNDARY--\r\n", "multipart/form-data; boundary=B0UNDARY"


def _upload_parts(content: bytes, purpose: bytes = b"batch", purpose_head: bytes = b"") -> list[tuple[bytes, bytes]]:
    return [
        (b'Content-Disposition: form-data; name="purpose"' + purpose_head, purpose),
        (b'Content-Disposition: form-data; name="file"; filename="in.jsonl"', content),
    ]


def test_a_gzip_upload_is_decompressed_and_other_encodings_are_refused(app_client):
    """An upload compressed with gzip is stored decompressed, as the file the client compressed; a gzip body over
    max_file_bytes once decompressed is a 413, one that is not gzip a 400, any other encoding a 415 (an upload
    used to be stored as sent, compressed bytes no line of could be read)."""
    import gzip

    content = jsonl([embed_line(i) for i in range(3)])
    auth = {"Authorization": f"Bearer {KEYS[0]}"}
    body, content_type = _form(_upload_parts(content))

    def post(data: bytes, encoding: str) -> Any:
        headers = {**auth, "Content-Type": content_type, "Content-Encoding": encoding}
        return app_client.post("/v1/files", content=data, headers=headers)

    stored = post(gzip.compress(body), "gzip")
    assert stored.status_code == 200, stored.text
    assert stored.json()["bytes"] == len(content)
    assert app_client.get(f"/v1/files/{stored.json()['id']}/content", headers=auth).content == content
    for encoding in ("br", "deflate"):
        refused = post(body, encoding)
        assert refused.status_code == 415 and refused.json()["error"]["code"] == "unsupported_media_type"
        assert encoding in refused.json()["error"]["message"]
    assert post(body, "gzip").status_code == 400  # labelled gzip, sent plain
    bomb, _ = _form(_upload_parts(b"\n" * 300_000))  # 300 kB of blank lines: over max_file_bytes (200 kB)
    too_big = post(gzip.compress(bomb), "gzip")
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "file_too_large"


def test_a_form_field_not_in_its_charset_is_a_400(app_client):
    """A field that is not UTF-8, or declares a charset that does not exist, is a 400 (it was a 500)."""
    auth = {"Authorization": f"Bearer {KEYS[0]}"}
    content = jsonl([embed_line(0)])
    for parts in (
        _upload_parts(content, purpose=b"batch\xff"),
        _upload_parts(content, purpose_head=b"\r\nContent-Type: text/plain; charset=no-such-charset"),
    ):
        body, content_type = _form(parts)
        resp = app_client.post("/v1/files", content=body, headers={**auth, "Content-Type": content_type})
        assert resp.status_code == 400 and "charset" in resp.json()["error"]["message"], resp.text


def test_metrics_show_no_batch_id_unless_asked(app_client):
    """Any key may read /metrics: by default it sums every key's unfinished batches, naming none."""
    api = sdk(app_client, KEYS[0])
    uploaded = api.files.create(file=("in.jsonl", jsonl([embed_line(i) for i in range(3)])), purpose="batch")
    made = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    metrics = app_client.get("/metrics", headers={"Authorization": f"Bearer {KEYS[1]}"}).text
    assert made.id not in metrics and uploaded.id not in metrics
    assert re.search(r"^embedrank_batches_unfinished [01]\.0$", metrics, re.M)
    assert re.search(r'^embedrank_batch_lines_done\{outcome="completed"\} \d+\.0$', metrics, re.M)
    assert re.search(r"^embedrank_batch_lines_waiting \d+\.0$", metrics, re.M)


def test_a_file_name_with_a_control_character_is_refused(app_client):
    """A NUL byte in a file's name was a 500 on PostgreSQL, with the file left on disk: refused on every database."""
    auth = {"Authorization": f"Bearer {KEYS[0]}"}
    for name in (b"in\x00.jsonl", b"in\x1b[31m.jsonl"):  # sent as raw bytes (clients may percent-encode them)
        body = (
            b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="' + name + b'"\r\n'
            b"Content-Type: application/jsonl\r\n\r\n" + jsonl([embed_line(0)]) + b"\r\n--b--\r\n"
        )
        resp = app_client.post(
            "/v1/files", content=body, headers={**auth, "Content-Type": "multipart/form-data; boundary=b"}
        )
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "file", resp.text
    assert app_client.get("/v1/files", headers=auth).json()["data"] == []


# -- a full disk ----------------------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs mounted for the test (root only; skipped where mounting is not allowed)."""
    import subprocess as sp

    mount = tmp_path / "disk"
    mount.mkdir()
    done = sp.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        sp.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path, leave: int = 0) -> Path:
    """A file that takes all of ``folder``'s disk but ``leave`` bytes."""
    filler = folder / "filler"
    with open(filler, "wb") as out:
        while True:
            free = shutil.disk_usage(folder).free - leave
            if free <= 0:
                break
            try:
                out.write(b"\0" * min(free, 1 << 20))
                out.flush()
            except OSError:
                break
    return filler


class SlowEncoder(FakeEncoder):
    """A fake encoder whose forward pass takes 20 ms, so a batch runs long enough to fill the disk meanwhile."""

    def embed_rows(self, rows):
        time.sleep(0.02)
        return super().embed_rows(rows)


@pytest.mark.slow
def test_a_full_disk_refuses_uploads_with_507_deleting_frees_it_and_a_batch_waits_then_resumes(small_disk, monkeypatch):
    from service.batches import worker as worker_module

    monkeypatch.setattr(worker_module, "RETRY_SECONDS", 0.2)
    folder = small_disk / "batches"
    settings = Settings(
        auth=Auth(api_keys=KEYS),
        engine=Engine(tune_malloc=False),
        batches=Batches(batch_dir=str(folder)),
        limits=Limits(max_file_bytes=8 << 20),
    )
    with TestClient(create_app(settings, wait_for_models=True, models={"enc": SlowEncoder("enc")})) as client:
        api = sdk(client, KEYS[0])
        content = b"x" * (6 << 20)
        kept = [api.files.create(file=(f"{i}.jsonl", content), purpose="batch") for i in range(3)]
        refused = client.post(
            "/v1/files",
            files={"file": ("2.jsonl", content)},
            data={"purpose": "batch"},
            headers={"Authorization": f"Bearer {KEYS[0]}"},
        )
        assert refused.status_code == 507 and refused.json()["error"]["code"] == "insufficient_storage"
        assert not [p for p in (folder / "files").iterdir() if p.name.endswith(".tmp")]
        assert len(api.files.list().data) == 3  # reading still works
        for file in kept:  # deleting frees the space
            assert api.files.delete(file.id).deleted
        assert api.files.create(file=("2.jsonl", content), purpose="batch").bytes == len(content)

        lines = jsonl([embed_line(i) for i in range(1280)])  # ten chunks of 128 lines
        uploaded = api.files.create(file=("in.jsonl", lines), purpose="batch")
        batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        deadline = time.monotonic() + 30
        while api.batches.retrieve(batch.id).request_counts.completed == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        filler = fill(folder)  # the disk is full while the batch runs
        time.sleep(1.5)
        stalled = api.batches.retrieve(batch.id)
        assert stalled.status == "in_progress" and stalled.request_counts.completed < 1280
        metrics = client.get("/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"}).text
        full = re.search(r"^embedrank_batch_store_full_seconds (\S+)$", metrics, re.M)
        assert full is not None and float(full[1]) > 0
        filler.unlink()  # room again: the batch goes on by itself
        done = wait(api, batch.id, seconds=60)
        assert done.status == "completed" and done.request_counts.completed == 1280
        output = [json.loads(row) for row in api.files.content(done.output_file_id).content.splitlines()]
        assert [row["custom_id"] for row in output] == [f"e-{i}" for i in range(1280)]
