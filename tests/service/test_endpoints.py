"""The endpoint table (service.endpoints): the routes, the fast path and batch lines are lookups into it, and
what derives from it (the bodies the decoder reads, the urls a batch may name) cannot drift from it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder, FakeSparseEncoder
from service import endpoints, fast_path
from service.batches.schemas import CreateBatchRequest
from service.endpoints import BATCH, BATCH_URLS, BY_PATH, ENDPOINTS, Endpoint
from service.routes import BODIES, ROUTE_HANDLERS

pytestmark = pytest.mark.kernel_free

EMB, CE, SPARSE = "fake-encoder", "fake-ce", "fake-sparse"

# one valid body per endpoint path
BODY = {
    "/v1/embeddings": {"model": EMB, "input": "green tea"},
    "/embeddings": {"model": EMB, "input": "green tea"},
    "/v1/rerank": {"model": CE, "query": "tea", "documents": ["green tea", "coffee"]},
    "/v2/rerank": {"model": CE, "query": "tea", "documents": ["green tea", "coffee"]},
    "/v1/tokenize": {"model": EMB, "input": "green tea"},
    "/v1/embed": {"model": EMB, "texts": ["green tea"]},
    "/v2/embed": {"model": EMB, "texts": ["green tea"]},
    "/embed": {"inputs": "green tea"},
    "/embed_sparse": {"inputs": "green tea", "model": SPARSE},
    "/tokenize": {"inputs": "green tea"},
    "/rerank": {"query": "tea", "texts": ["green tea", "coffee"], "model": CE},
    "/": {"inputs": "green tea"},
}


@contextlib.contextmanager
def spied(endpoint: Endpoint, calls: list[str], name: str) -> Iterator[None]:
    """``endpoint``'s call recorded under ``name`` in ``calls`` while the block runs (the table's objects are
    frozen: what the routes hold is the object itself, so replacing its call is what they would see)."""
    real = endpoint.call

    def call(body: Any, ctx: Any) -> Any:
        calls.append(name)
        return real(body, ctx)

    object.__setattr__(endpoint, "call", call)
    try:
        yield
    finally:
        object.__setattr__(endpoint, "call", real)


def test_every_path_of_the_table_is_served_by_a_route_and_every_core_route_is_in_the_table():
    core_paths = {
        path
        for handler in ROUTE_HANDLERS
        if "POST" in (handler.http_methods or ())
        for path in handler.paths
        if not path.startswith(("/v1/batches", "/v1/files", "/v1/vector_stores"))
    }
    assert core_paths == set(BY_PATH) == set(BODY)
    for path, endpoint in BY_PATH.items():
        assert BODIES[path] is endpoint.body


def test_the_fast_path_and_the_batch_urls_are_entries_of_the_table():
    assert endpoints.EMBEDDINGS.paths == fast_path.PATHS
    assert set(BATCH_URLS) == {"/v1/embeddings", "/v1/rerank", "/v2/embed", "/v2/rerank"}
    for url in BATCH_URLS:
        assert BATCH[url] in ENDPOINTS and url in BATCH[url].paths
    schema = msgspec.json.schema(CreateBatchRequest)
    batch_request = schema["$defs"]["CreateBatchRequest"]["properties"]["endpoint"]
    assert sorted(batch_request["enum"]) == sorted(BATCH_URLS)  # the batch body accepts exactly the table's urls


@pytest.mark.parametrize("path", sorted(BODY))
def test_each_route_calls_its_endpoint_object(fake_service, path):
    models = {
        EMB: FakeEncoder(EMB, dimension=32, max_seq_length=16),
        CE: FakeCrossEncoder(CE, max_seq_length=16),
        SPARSE: FakeSparseEncoder(SPARSE),
    }
    calls: list[str] = []
    with fake_service(models) as client, contextlib.ExitStack() as stack:
        for endpoint in ENDPOINTS:
            stack.enter_context(spied(endpoint, calls, endpoint.paths[0]))
        resp = client.post(path, json=BODY[path])
        assert resp.status_code == 200, resp.text
    # a path's own endpoint (one object may serve several paths: its first path names it)
    assert [BY_PATH[name] for name in calls] == [BY_PATH[path]]


def test_a_batch_line_runs_its_endpoint_object():
    import asyncio

    from embedrank.serving.engine import EngineConfig
    from embedrank.serving.pool import ModelEntry, ModelPool
    from service.batches import lines
    from service.context import Context
    from service.settings import Auth, Settings

    models = ModelPool((ModelEntry(id=EMB, path="fake:encoder"),))
    calls: list[str] = []
    (request,) = lines.request_lines(
        msgspec.json.encode(
            {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": BODY["/v1/embeddings"]}
        )
    )

    async def run() -> int:
        models.start(models.load(), EngineConfig(max_wait_ms=0))
        try:
            with spied(BATCH["/v1/embeddings"], calls, "/v1/embeddings"):
                status, _, _ = await lines.run_line(
                    request, Context(models, Settings(auth=Auth(api_keys=("k",))), cached=True)
                )
            return status
        finally:
            await models.drain(1.0)

    assert asyncio.run(run()) == 200 and calls == ["/v1/embeddings"]
    assert dataclasses.is_dataclass(BATCH["/v1/embeddings"])
