"""The embeddings fast path answers exactly as the routed handler does (status, headers and body bytes, errors
included), and leaves every request it does not take to the app untouched."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import time

import pytest
from litestar.testing import AsyncTestClient, TestClient

from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder
from service.app import create_app
from service.fast_path import EmbeddingsFastPath
from service.settings import Auth, Engine, ModelEntry, Models, Server, Settings

pytestmark = pytest.mark.kernel_free

MODEL, CE, KEY = "fake-encoder", "fake-ce", "fast-key"
SETTINGS = Settings(
    auth=Auth(api_keys=(KEY,)),
    models=Models(entries=(ModelEntry(id=MODEL, aliases=("fe",)),)),
    engine=Engine(batch_wait_ms=0, tune_malloc=False),
)

REQUESTS = [  # (path, body): successes and every kind of refusal the route can give
    ("/v1/embeddings", {"model": MODEL, "input": "hello world"}),
    ("/embeddings", {"model": "fe", "input": ["a b", "c d e", "a"]}),
    ("/v1/embeddings", {"model": MODEL, "input": ["a b", "c d"], "encoding_format": "base64", "dimensions": 8}),
    ("/v1/embeddings", {"model": MODEL, "input": ["a b", "c d"], "embedding_types": ["int8", "uint8", "float"]}),
    ("/v1/embeddings", {"model": MODEL, "input": " ".join(["word"] * 40)}),  # truncated: X-Truncated-Inputs 1
    ("/v1/embeddings", {"model": MODEL, "input": " ".join(["word"] * 40), "truncate": False}),  # 400 too long
    ("/v1/embeddings", {"model": MODEL, "input": []}),  # 400 empty
    ("/v1/embeddings", {"model": MODEL, "input": 5}),  # 400 wrong type
    ("/v1/embeddings", {"model": MODEL, "input": "x", "dimensions": "8"}),  # 400: no coercion
    ("/v1/embeddings", {"model": "nope", "input": "x"}),  # 404
    ("/v1/embeddings", {"model": CE, "input": "x"}),  # 400 wrong kind
    ("/v1/embeddings", b'{"model": "fake-encoder", "input": '),  # 400 invalid JSON
    ("/v1/embeddings", {"input": "x"}),  # the default model
]


@contextlib.contextmanager
def clients():
    """Two apps on the same fakes: one as served (fast path in front), one with the routes only."""
    fakes = {MODEL: FakeEncoder(MODEL, dimension=32, max_seq_length=16), CE: FakeCrossEncoder(CE, max_seq_length=16)}
    fast, routed = (
        create_app(SETTINGS, wait_for_models=True, models=fakes),
        create_app(SETTINGS, wait_for_models=True, models=fakes),
    )
    assert isinstance(fast.asgi_handler, EmbeddingsFastPath)
    inner = routed.asgi_handler
    assert isinstance(inner, EmbeddingsFastPath)
    routed.asgi_handler = inner.app_handler
    with TestClient(fast) as a, TestClient(routed) as b:
        for c in (a, b):
            # one request id for both, so that answers that carry it (every one) can be compared byte for byte
            c.headers.update({"Authorization": f"Bearer {KEY}", "X-Request-Id": "fast-path-check"})
        yield a, b, fast


def send(client, path, body, **headers):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=raw, headers={"Content-Type": "application/json", **headers})


def count_routed(app):
    """Counts the requests the fast path hands to the app's own handler."""
    calls = []
    inner = app.asgi_handler.app_handler

    async def counting(scope, receive, send):
        calls.append(scope["path"])
        await inner(scope, receive, send)

    app.asgi_handler.app_handler = counting
    return calls


@pytest.mark.parametrize(("path", "body"), REQUESTS, ids=range(len(REQUESTS)))
def test_same_answer_as_the_routed_handler(path, body):
    with clients() as (fast, routed, app):
        calls = count_routed(app)
        a, b = send(fast, path, body), send(routed, path, body)
        assert calls == []  # answered by the fast path itself
        assert (a.status_code, a.content) == (b.status_code, b.content)
        assert a.headers.raw == b.headers.raw  # the same headers, in the same order and spelling


def test_metrics_count_fast_path_requests_as_the_route():
    with clients() as (fast, _, _app):
        assert send(fast, "/v1/embeddings", {"model": MODEL, "input": "x"}).status_code == 200
        assert send(fast, "/v1/embeddings", {"model": "nope", "input": "x"}).status_code == 404
        text = fast.get("/metrics").text
        assert 'embedrank_requests_total{method="POST",route="/v1/embeddings",status="200"} 1.0' in text
        assert 'embedrank_requests_total{method="POST",route="/v1/embeddings",status="404"} 1.0' in text


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Authorization": ""}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Content-Type": "text/plain"}, 415),
        ({"Content-Type": "application/json; charset=utf-8"}, 200),
        ({"Content-Encoding": "gzip"}, 200),
        ({"Content-Encoding": "identity"}, 200),
    ],
    ids=["no-key", "wrong-key", "not-json", "charset", "gzip", "identity"],
)
def test_requests_it_does_not_take_go_to_the_app_untouched(headers, status):
    body = json.dumps({"model": MODEL, "input": "hello world"}).encode()
    if headers.get("Content-Encoding") == "gzip":
        body = gzip.compress(body)
    with clients() as (fast, routed, app):
        calls = count_routed(app)
        a = fast.post("/v1/embeddings", content=body, headers={"Content-Type": "application/json", **headers})
        b = routed.post("/v1/embeddings", content=body, headers={"Content-Type": "application/json", **headers})
        assert calls == ["/v1/embeddings"]
        assert (a.status_code, a.content) == (b.status_code, b.content) and a.status_code == status


def test_two_content_types_go_to_the_app():
    body = json.dumps({"model": MODEL, "input": "x"}).encode()
    headers = [("content-type", "text/plain"), ("content-type", "application/json")]
    with clients() as (fast, routed, app):
        calls = count_routed(app)
        a = fast.post("/v1/embeddings", content=body, headers=headers)
        b = routed.post("/v1/embeddings", content=body, headers=headers)
        assert calls == ["/v1/embeddings"] and (a.status_code, a.content) == (b.status_code, b.content)


def test_other_routes_and_cors_go_to_the_app():
    with clients() as (fast, _, app):
        calls = count_routed(app)
        assert fast.get("/v1/embeddings").status_code == 405
        assert fast.post("/v1/rerank", json={"model": MODEL, "query": "q", "documents": ["d"]}).status_code == 200
        assert calls == ["/v1/embeddings", "/v1/rerank"]
    cors = Settings(
        auth=Auth(api_keys=(KEY,)),
        models=Models(entries=(ModelEntry(id=MODEL),)),
        server=Server(cors_origins=("https://app.example",)),
    )
    assert not isinstance(create_app(cors, models={MODEL: FakeEncoder(MODEL)}).asgi_handler, EmbeddingsFastPath)


class SlowEncoder(FakeEncoder):
    def embed_rows(self, rows):
        time.sleep(0.3)  # the client goes away while this batch computes
        return super().embed_rows(rows)


def test_client_gone_while_computing_is_499():
    app = create_app(SETTINGS, wait_for_models=True, models={MODEL: SlowEncoder(MODEL, dimension=32)})
    body = json.dumps({"model": MODEL, "input": ["a b", "c"]}).encode()

    async def main():
        async with AsyncTestClient(app) as c:
            calls = count_routed(app)
            sent, messages = [], [{"type": "http.request", "body": body, "more_body": False}]

            async def receive():
                if messages:
                    return messages.pop(0)
                await asyncio.sleep(0.05)
                return {"type": "http.disconnect"}

            async def send(message):
                sent.append(message)

            headers = [(b"content-type", b"application/json"), (b"authorization", f"Bearer {KEY}".encode())]
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                     "scheme": "http", "path": "/v1/embeddings", "raw_path": b"/v1/embeddings", "query_string": b"",
                     "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("t", 80)}  # fmt: skip
            await app(scope, receive, send)
            assert calls == [] and sent[0]["status"] == 499
            return (await c.get("/metrics", headers={"Authorization": f"Bearer {KEY}"})).text

    text = asyncio.run(main())
    assert 'route="/v1/embeddings",status="499"' in text
