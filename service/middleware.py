"""The service's one per-request ASGI layer: the request id, bearer auth, then request count and latency.

One layer instead of one per concern: each Litestar middleware layer adds calls on every request, and
the event loop's time per request is what limits small requests on few cores (eval/benchmarks/service.py).
"""

from __future__ import annotations

import time
from typing import Any

from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from service import logs, request_ids
from service.auth import BearerAuth
from service.errors import allowed_methods, to_api_error
from service.observability import Metrics
from service.shutdown import InFlight


class RequestMiddleware(ASGIMiddleware):
    scopes = ("http",)  # type: ignore[assignment]

    def __init__(
        self,
        metrics: Metrics,
        auth: BearerAuth | None,
        inflight: InFlight | None = None,
        *,
        access_log: bool = False,
    ) -> None:
        self.metrics = metrics
        self.auth = auth  # None only when the operator switched auth off (EMBEDRANK_NO_AUTH)
        self.inflight = inflight or InFlight()  # what a SIGTERM drain waits for
        self.access_log = access_log  # one log line per request (service.logs.access)

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        await self.track(scope, receive, send, next_app, auth=self.auth)

    async def track(
        self, scope: Scope, receive: Receive, send: Send, app: ASGIApp, *, auth: BearerAuth | None = None
    ) -> None:
        """Run ``app`` as one request in flight, counted with its status and latency; ``auth`` checks the
        key first (the embeddings fast path, :mod:`service.fast_path`, has checked it already)."""
        start = time.perf_counter()
        status = 0
        request_id = request_ids.of_scope(scope)
        token = request_ids.CURRENT.set(request_id)

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
                if scope.get("method") == "OPTIONS" and status == 204:  # Litestar's Allow names one handler's methods
                    headers = _with_allow(headers, scope)
                if not any(name.lower() == request_ids.HEADER for name, _ in headers):  # errors carry it already
                    headers.append((request_ids.HEADER, request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        self.inflight.enter()
        method = str(scope.get("method", "GET"))
        with logs.opened(scope["path"], method) as fields:
            try:
                if auth is not None:
                    auth.check(scope)
                await app(scope, receive, send_wrapper)
            except Exception as exc:
                if not status:  # the app's exception handler answers outside this layer, with this status
                    status = to_api_error(exc).status
                raise
            finally:
                self.inflight.exit()
                seconds = time.perf_counter() - start
                self.metrics.observe_request(scope["path"], method, status or 500, seconds)
                if self.access_log:
                    logs.access(fields, status or 500, seconds)
                request_ids.CURRENT.reset(token)


def _with_allow(headers: Any, scope: Scope) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``Allow`` listing every method of every route at the request's path: Litestar's own
    answer to ``OPTIONS`` lists only the methods of the first handler registered there."""
    out = [(name, value) for name, value in headers if name.lower() != b"allow"]
    if len(out) == len(list(headers)):
        return out  # no Allow: a CORS preflight, answered by the CORS middleware
    return [*out, (b"allow", ", ".join(allowed_methods(scope["app"], scope["path"])).encode())]
