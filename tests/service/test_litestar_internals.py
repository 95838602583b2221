"""What the service relies on in Litestar beyond its public API (service/litestar_internals.py), pinned on a
tiny app: a Litestar upgrade that changes it fails here, by name, not somewhere in the service."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from litestar import Litestar, Request, post
from litestar.testing import TestClient

from service.litestar_internals import bind_route_handler, decoded_body, set_body, set_decoded_body

pytestmark = pytest.mark.kernel_free


class Body(msgspec.Struct):
    text: str


async def _decode_once(request: Request[Any, Any, Any]) -> None:
    decoded = msgspec.json.decode(await request.body(), type=Body)
    set_decoded_body(request, Body(text=decoded.text.upper()))  # a value Litestar's own parsing cannot give


@post("/typed", before_request=_decode_once)
async def typed(data: Body) -> dict:
    return {"text": data.text, "type": type(data).__name__}


@post("/raw", before_request=_decode_once)
async def raw(request: Request[Any, Any, Any]) -> dict:
    return {"text": decoded_body(request).text}


def test_a_stored_body_is_what_the_handler_receives_unchanged():
    with TestClient(Litestar([typed, raw])) as client:
        answer = client.post("/typed", content=b'{"text": "hello"}', headers={"Content-Type": "application/json"})
        assert answer.json() == {"text": "HELLO", "type": "Body"}  # the stored value, not the body parsed again
        assert client.post("/raw", json={"text": "again"}).json() == {"text": "AGAIN"}


async def _replace_body(request: Request[Any, Any, Any]) -> None:
    await request.body()
    set_body(request, b"text=replaced")


@post("/form", before_request=_replace_body)
async def form(request: Request[Any, Any, Any]) -> dict:
    return {"text": (await request.form())["text"], "body": (await request.body()).decode()}


def test_a_stored_body_is_what_the_handler_reads_and_parses():
    with TestClient(Litestar([form])) as client:
        answer = client.post("/form", data={"text": "sent"})
        assert answer.json() == {"text": "replaced", "body": "text=replaced"}


def test_a_request_built_outside_routing_reads_its_bound_handlers_body_limit():
    import asyncio

    app = Litestar([typed], request_max_body_size=10)
    handler = app.routes[0].route_handler_map["POST"][0]  # type: ignore[union-attr]
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/typed",
        "headers": [],
        "query_string": b"",
        "app": app,
        "litestar_app": app,
        "state": {},
        "raw_path": b"/typed",
        "root_path": "",
    }
    bind_route_handler(scope, handler)  # type: ignore[arg-type]
    assert scope["path_params"] == {}
    chunks = [{"type": "http.request", "body": b"x" * 11, "more_body": False}]

    async def receive() -> dict:
        return chunks.pop(0)

    request: Request[Any, Any, Any] = Request(scope, receive)  # type: ignore[arg-type]
    try:
        asyncio.run(request.body())
    except Exception as exc:  # Litestar refuses a body over the handler's limit with 413
        assert getattr(exc, "status_code", None) == 413, exc
    else:
        raise AssertionError("the bound handler's body limit was not applied")
