"""The embeddings route without Litestar's per-request layers, for the requests that need none of them.

On 2 cores the event loop's time per request is taken from the model, and one-query embedding requests are
where it shows: routing, the exception and middleware layers, the before-request hook, dependency
injection and the handler signature cost more per request than the service's own work.
:class:`EmbeddingsFastPath` sits in front of the app's ASGI handler and answers ``POST /v1/embeddings``
(and ``/embeddings``) itself, with the same parts the routed handler runs: the bearer check
(:class:`~service.auth.BearerAuth`), the strict body decoding (:func:`service.handling.read_json_body`),
:func:`service.handling.finish` over the endpoint's call (:data:`service.endpoints.EMBEDDINGS`, the response is sent as
:func:`service.handling.respond` builds it), the request count, latency
and in-flight tracking (:meth:`service.middleware.RequestMiddleware.track`), and :func:`service.errors.handle_exception` for every error. So the responses,
errors included, are the routed handler's, byte for byte (``tests/service/test_fast_path.py``).

Everything else goes to the app untouched, before anything is read: other routes and methods, a missing
or wrong key (the 401 comes from the app), a body that is not declared as plain ``application/json``
or is compressed, a service that is not ready, and any server with CORS on.
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar, Request
from litestar.exceptions import NotAuthorizedException
from litestar.routes import HTTPRoute
from litestar.serialization import encode_json
from litestar.types import ASGIApp, Receive, Scope, Send

from service.endpoints import EMBEDDINGS
from service.errors import handle_exception
from service.handling import TRUNCATED_HEADER, ServiceState, finish, read_json_body
from service.litestar_internals import bind_route_handler
from service.middleware import RequestMiddleware

PATHS = EMBEDDINGS.paths
TRUNCATED_NAME = TRUNCATED_HEADER.lower().encode()


class EmbeddingsFastPath:
    """ASGI handler: ``POST /v1/embeddings`` and ``/embeddings`` answered directly, the rest by ``app_handler``."""

    def __init__(
        self, app: Litestar, app_handler: ASGIApp, service: ServiceState, middleware: RequestMiddleware
    ) -> None:
        self.app_handler = app_handler
        self.service = service
        self.middleware = middleware  # its request count, latency and in-flight tracking
        # the routed handler, for what Litestar's request reads from the scope (its body size limit)
        self.handlers = {
            route.path: route.route_handler_map["POST"][0]
            for route in app.routes
            if isinstance(route, HTTPRoute) and route.path in PATHS
        }

    def _takes(self, scope: Scope) -> bool:
        """Whether this request is one the fast path answers (decided before reading anything)."""
        if scope["type"] != "http" or scope.get("method") != "POST" or scope["path"] not in self.handlers:
            return False
        if self.service.status != "ok":
            return False
        content_types = [value for name, value in scope["headers"] if name in (b"content-type", b"content-encoding")]
        if content_types != [b"application/json"]:  # exactly one header, plain JSON, not compressed
            return False
        if self.service.auth is not None:
            try:
                self.service.auth.check(scope)
            except NotAuthorizedException:
                return False
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._takes(scope):
            await self.middleware.track(scope, receive, send, self._answer)  # the key was checked in _takes
        else:
            await self.app_handler(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        """What the routed handler answers: the decoded body through the adapter, or the error's response."""
        bind_route_handler(scope, self.handlers[scope["path"]])
        request: Request[Any, Any, Any] = Request(scope, receive, send)
        try:
            req = await read_json_body(request, EMBEDDINGS.body, self.service.settings)
            body, truncated = await finish(receive, EMBEDDINGS.call(req, self.service.ready_context()))
            content = encode_json(body)
        except Exception as exc:
            response = handle_exception(request, exc)
            status = response.status_code or 200  # errors carry their own status
            await response.to_asgi_response(app=None, request=request, status_code=status)(scope, receive, send)
            return
        # what Litestar's Response(content=body, headers={TRUNCATED_HEADER: ...}) sends, without building one
        headers = [
            (TRUNCATED_NAME, str(truncated).encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(content)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content, "more_body": False})
