"""The service's only uses of Litestar beyond its public API, each behind one function, each pinned by
``tests/service/test_litestar_internals.py`` so that a Litestar upgrade which changes them fails there, by name.

- The decoded body: the service decodes each body once, strictly (:mod:`service.decoding`), before the
  handler runs. Litestar reads a request's JSON from its connection state when that holds a value, and
  passes a value that already has the handler's data type through unchanged, so storing the decoded body
  there makes it what the handler receives. Litestar has no public way to hand a handler a body.
- The body bytes: a gzip-compressed upload is decompressed before Litestar parses its form, by storing the
  decompressed bytes where Litestar keeps a body it has read (the connection state).
- The route handler of a request built outside routing (:mod:`service.fast_path`): a ``Request`` reads
  limits such as the body size from ``scope["route_handler"]``.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.handlers import HTTPRouteHandler
from litestar.types import Scope


def set_body(request: Request[Any, Any, Any], body: bytes) -> None:
    """Make ``body`` the bytes this request (and every ``Request`` of its scope) reads as its body: a compressed
    upload, decompressed before its form is parsed. Litestar keeps a read body in the connection state."""
    request._body = request._connection_state.body = body


def set_decoded_body(request: Request[Any, Any, Any], value: Any) -> None:
    """Make ``value`` the body Litestar gives the request's handler (and :func:`decoded_body` returns)."""
    request._connection_state.json = value


def decoded_body(request: Request[Any, Any, Any]) -> Any:
    """The body :func:`set_decoded_body` stored for this request."""
    return request._connection_state.json


def bind_route_handler(scope: Scope, handler: HTTPRouteHandler) -> None:
    """Give a request that routing never saw the handler (and empty path parameters) a routed one has."""
    scope["route_handler"] = handler
    scope["path_params"] = {}
