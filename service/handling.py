"""What every route shares: the service state, the documented error responses, and :func:`respond`, which runs
a request's work unless the client goes away and marks how many inputs were truncated."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
from collections.abc import Coroutine
from typing import Any

from litestar import MediaType, Request, Response
from litestar.datastructures import State
from litestar.openapi import ResponseSpec
from litestar.types import Receive

from embedrank.errors import NotReadyError
from embedrank.serving.pool import ModelPool
from service import logs
from service.auth import BearerAuth
from service.context import Context
from service.decoding import decode_strict, decompressed
from service.errors import APIError
from service.observability import Metrics, combined
from service.schemas import ErrorResponse
from service.settings import Settings

TRUNCATED_HEADER = "X-Truncated-Inputs"


@dataclasses.dataclass
class ServiceState:
    """What the lifespan owns: the models, their engines, and the service state."""

    settings: Settings
    pool: ModelPool
    metrics: Metrics
    status: str = "loading"  # loading -> ok -> draining; or failed
    detail: str | None = None
    waiting_for_fronts: str | None = None  # a replica's front: why its other fronts keep the replica from ready
    load_task: asyncio.Task[None] | None = None
    auth: BearerAuth | None = None  # None: the operator switched authentication off

    def readiness(self) -> tuple[str, str | None]:
        """``/health``'s status and detail: this process's, except that a replica's front that is ready says
        ``loading`` until every front of the replica is (:attr:`waiting_for_fronts`)."""
        if self.status == "ok" and self.waiting_for_fronts is not None:
            return "loading", self.waiting_for_fronts
        return self.status, self.detail

    def ready_pool(self) -> ModelPool:
        if self.status != "ok":
            raise NotReadyError(f"service is {self.status}" + (f": {self.detail}" if self.detail else ""))
        return self.pool

    def ready_context(self) -> Context:
        """What an endpoint's call needs (:class:`~service.context.Context`), built once; while the service is
        not ready, :class:`~embedrank.errors.NotReadyError`."""
        self.ready_pool()
        return self.context

    @functools.cached_property
    def context(self) -> Context:
        return Context.of(self.pool, self.settings)

    async def metrics_text(self) -> bytes:
        """``/metrics``: this process's metrics; a replica's front's, those of every process of the replica
        (:func:`~service.observability.combined`: its own now, the engine process's now, the other fronts' as they
        last reported them, at most :data:`METRICS_REPORT_SECONDS` ago).

        Raises:
            NotReadyError: a front whose engine process cannot be reached (the scrape fails rather than show the
                replica's counters going back).
        """
        own = await asyncio.to_thread(self.metrics.render)  # collectors read the batch database and the cache file
        link = self.pool.link
        if link is None:
            return own
        others = await link.scrape(except_source=front_source())
        return combined([(own, True), *((text, alive) for _, text, alive in others)])


METRICS_REPORT_SECONDS = 1.0
"""How often a replica's front leaves its metrics with the engine process, for the other fronts' scrapes."""


def front_source() -> str:
    """What this front process reports its metrics as."""
    return f"front-{os.getpid()}"


def service_of(state: State) -> ServiceState:
    return state.service  # type: ignore[no-any-return]


def pool_of(state: State) -> ModelPool:
    return service_of(state).ready_pool()


ERRORS = {
    status: ResponseSpec(data_container=ErrorResponse, description=desc)
    for status, desc in {
        400: "Invalid request (bad JSON, wrong type, missing field, empty input, limit exceeded, wrong model kind)",
        401: "Missing, malformed or wrong API key (WWW-Authenticate: Bearer)",
        408: "The request body did not arrive within body_timeout_seconds",
        404: "Unknown model (code model_not_found)",
        413: "Body larger than max_body_bytes",
        415: "Content-Type is not application/json",
        429: "Overloaded (estimated wait over max_queue_seconds, or queue full); honour Retry-After",
        503: "Models loading or service draining; honour Retry-After",
    }.items()
}
UNAVAILABLE = {
    503: ResponseSpec(
        data_container=ErrorResponse,
        description="Service draining, or the database of files, batches and vector stores cannot be reached now "
        "(code batch_database_unavailable); honour Retry-After",
    )
}
"""The 503 of the routes over the storage (files, batches, vector stores)."""


async def respond(request: Request[Any, Any, Any], work: Coroutine[Any, Any, tuple[Any, int | None]]) -> Response[Any]:
    """The response of ``work`` (:func:`finish`), with the number of truncated inputs in its header (none for
    work that truncates nothing)."""
    body, truncated = await finish(request.receive, work)
    headers = {TRUNCATED_HEADER: str(truncated)} if truncated is not None else {}
    return Response(content=body, headers=headers, media_type=MediaType.JSON)


async def finish(receive: Receive, work: Coroutine[Any, Any, tuple[Any, int | None]]) -> tuple[Any, int | None]:
    """Run ``work`` unless the client goes away first (then its queued items are dropped before compute and
    the request ends in a 499); returns what ``work`` returns: the body and the number of truncated inputs.

    ``work`` runs in the caller's own task (no extra task per request); a watcher cancels it when the
    ASGI server reports a disconnect on ``receive`` (the body is already read).
    """
    handler = asyncio.current_task()
    gone = False

    async def watch() -> None:
        nonlocal gone
        await disconnected(receive)
        gone = True
        if handler is not None:
            handler.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        if handler is not None:
            handler.uncancel()
        raise APIError(499, "client closed the request", code="client_closed_request") from None
    finally:
        watcher.cancel()


async def read_json_body(request: Request[Any, Any, Any], schema: Any, settings: Settings) -> Any:
    """The request's body, decompressed and decoded strictly against ``schema`` (:mod:`service.decoding`);
    408 when it does not arrive within ``settings.server.body_timeout_seconds``."""
    timeout = settings.server.body_timeout_seconds
    try:
        body = await asyncio.wait_for(request.body(), timeout)
    except TimeoutError:
        raise APIError(
            408,
            f"the request body did not arrive within {timeout:g} s",
            code="request_timeout",
            headers={"Connection": "close"},
        ) from None
    body = decompressed(body, request.headers.get("content-encoding", ""), settings.limits.max_body_bytes)
    decoded = decode_strict(body, schema, request.headers.get("content-type", ""))
    logs.note_model(getattr(decoded, "model", None))  # the request's later log lines name it
    return decoded


async def disconnected(receive: Receive) -> None:
    """Return when the ASGI server reports that the client disconnected (the body is already read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
