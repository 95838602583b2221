"""Litestar app factory. ``litestar run`` from the repo root (found through ``app.py``) or
``uvicorn --factory service.app:create_app``.

Nothing happens at import time. :func:`create_app` reads settings and resolves the configured models;
the lifespan loads their weights in a worker thread (``/health`` answers 503 until then), starts one
batching engine per model, and on shutdown drains the requests in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import secrets
import sys
from collections.abc import AsyncIterator, Coroutine, Mapping
from functools import partial
from typing import Annotated, Any, get_args, get_type_hints

from litestar import Litestar, MediaType, Request, Response, get, head, post
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.spec import Components, Example, SecurityScheme
from litestar.params import Body

from embedrank.errors import NotReadyError
from embedrank.serving.allocator import trim_heap, tune_malloc
from service import api, shutdown
from service.auth import BearerAuth
from service.connections import HeaderDeadline, asgi_server
from service.decoding import decode_strict, shorten
from service.errors import APIError, handle_exception
from service.middleware import RequestMiddleware
from service.models import ModelPool
from service.observability import Metrics
from service.openapi import complete_openapi
from service.schemas import (
    EMBEDDINGS_EXAMPLE_REQUEST,
    EMBEDDINGS_EXAMPLE_RESPONSE,
    RERANK_EXAMPLE_REQUEST,
    RERANK_EXAMPLE_RESPONSE,
    EmbeddingList,
    EmbeddingsRequest,
    ErrorResponse,
    Health,
    ModelList,
    RerankRequest,
    RerankResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from service.settings import Settings

logger = logging.getLogger("embedrank.service")


@dataclasses.dataclass
class ServiceState:
    """What the lifespan owns: the models, their engines, and the service state."""

    settings: Settings
    pool: ModelPool
    metrics: Metrics
    status: str = "loading"  # loading -> ok -> draining; or failed
    detail: str | None = None
    load_task: asyncio.Task[None] | None = None

    def ready_pool(self) -> ModelPool:
        if self.status != "ok":
            raise NotReadyError(f"service is {self.status}" + (f": {self.detail}" if self.detail else ""))
        return self.pool


def _service(state: State) -> ServiceState:
    return state.service  # type: ignore[no-any-return]


def _pool(state: State) -> ModelPool:
    return _service(state).ready_pool()


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


async def _json_body(request: Request[Any, Any, Any]) -> None:
    """415 unless the body is declared as JSON (Content-Type: application/json); then the body is decoded,
    once, strictly against the route's schema (:mod:`service.decoding`), so a wrong type is a 400 that names
    the field rather than a silent coercion, and the handler receives that decoded value."""
    if request.method == "POST":
        content_type = request.headers.get("content-type", "")
        if content_type.split(";", 1)[0].strip().lower() != "application/json":
            raise APIError(
                415,
                f"Content-Type must be application/json, got {shorten(content_type or 'none')!r}",
                code="unsupported_media_type",
            )
        schema = BODIES.get(request.url.path)
        if schema is not None:
            timeout = _service(request.app.state).settings.body_timeout_seconds
            try:
                body = await asyncio.wait_for(request.body(), timeout)
            except TimeoutError:
                raise APIError(
                    408,
                    f"the request body did not arrive within {timeout:g} s",
                    code="request_timeout",
                    headers={"Connection": "close"},
                ) from None
            # decode once: Litestar reads the JSON of the connection state before parsing the body itself,
            # and passes a value that already has the handler's data type through unchanged
            request._connection_state.json = decode_strict(body, schema, content_type)


async def _respond(request: Request[Any, Any, Any], work: Coroutine[Any, Any, tuple[Any, int]]) -> Response[Any]:
    """Run ``work`` unless the client goes away first; then its queued items are dropped before compute.

    ``work`` runs in the handler's own task (no extra task per request); a watcher cancels it when the
    ASGI server reports a disconnect.
    """
    handler = asyncio.current_task()
    gone = False

    async def watch() -> None:
        nonlocal gone
        await _disconnected(request)
        gone = True
        if handler is not None:
            handler.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        body, truncated = await work
    except asyncio.CancelledError:
        if not gone:
            raise
        if handler is not None:
            handler.uncancel()
        raise APIError(499, "client closed the request", code="client_closed_request") from None
    finally:
        watcher.cancel()
    return Response(content=body, headers={api.TRUNCATED_HEADER: str(truncated)}, media_type=MediaType.JSON)


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    """Return when the ASGI server reports that the client disconnected (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


@post(
    "/v1/embeddings",
    summary="Create embeddings",
    description="One vector per input, in input order, as OpenAI's embeddings API returns them; optional Cohere-style "
    "embedding_types, prompts and chunking. Response header X-Truncated-Inputs counts inputs cut at max tokens.",
    responses={200: ResponseSpec(EmbeddingList, examples=[Example(value=EMBEDDINGS_EXAMPLE_RESPONSE)]), **ERRORS},
    status_code=200,
)
async def embeddings(
    data: Annotated[EmbeddingsRequest, Body(examples=[Example(summary="Two texts", value=EMBEDDINGS_EXAMPLE_REQUEST)])],
    request: Request[Any, Any, Any],
    state: State,
) -> Response[EmbeddingList]:
    rt = _service(state)
    return await _respond(request, api.create_embeddings(data, rt.ready_pool(), rt.settings.limits))


@post(
    "/v1/rerank",
    summary="Rerank documents",
    description="Each document scored against the query, as Cohere's and Jina's rerank APIs do; results sorted by "
    "relevance_score, highest first, ties by index. Long documents are scored in windows by default.",
    responses={200: ResponseSpec(RerankResponse, examples=[Example(value=RERANK_EXAMPLE_RESPONSE)]), **ERRORS},
    status_code=200,
)
async def rerank(
    data: Annotated[
        RerankRequest, Body(examples=[Example(summary="Query and two documents", value=RERANK_EXAMPLE_REQUEST)])
    ],
    request: Request[Any, Any, Any],
    state: State,
) -> Response[RerankResponse]:
    rt = _service(state)
    return await _respond(request, api.rerank(data, rt.ready_pool(), rt.settings.limits))


@post(
    "/v1/tokenize",
    summary="Count tokens",
    description="Token counts of each input as /v1/embeddings would process it (same prompt selection); "
    "the tokens themselves with return_tokens. As TEI's and vLLM's tokenize.",
    responses={200: ResponseSpec(TokenizeResponse), **ERRORS},
    status_code=200,
)
async def tokenize(
    data: Annotated[
        TokenizeRequest,
        Body(
            examples=[
                Example(
                    summary="Two texts",
                    value={"model": "sentence-transformers/all-MiniLM-L6-v2", "input": ["first text", "second"]},
                )
            ]
        ),
    ],
    state: State,
) -> TokenizeResponse:
    rt = _service(state)
    return await api.tokenize(data, rt.ready_pool(), rt.settings.limits)


@get("/v1/models", summary="List loaded models", responses={401: ERRORS[401], 503: ERRORS[503]})
async def models_route(pool: ModelPool) -> ModelList:
    return api.list_models(pool)


@get(
    "/health",
    summary="Readiness (no key needed)",
    responses={503: ResponseSpec(Health, description="Loading, draining or failed")},
)
async def health(state: State) -> Response[Health]:
    rt = _service(state)
    return Response(Health(status=rt.status, detail=rt.detail), status_code=200 if rt.status == "ok" else 503)  # type: ignore[arg-type]


@head(
    "/health",
    summary="Readiness, status code only (no key needed)",
    responses={503: ResponseSpec(None, description="Loading, draining or failed")},
)
async def health_head(state: State) -> Response[None]:
    return Response(None, status_code=200 if _service(state).status == "ok" else 503)


@get(
    "/metrics",
    summary="Prometheus metrics",
    media_type="text/plain; version=0.0.4",
    responses={401: ERRORS[401]},
)
async def metrics(state: State) -> bytes:
    return _service(state).metrics.render()


ROUTE_HANDLERS = (embeddings, rerank, tokenize, models_route, health, health_head, metrics)
"""The one route table: the app serves these handlers, metrics label requests by their paths, and each POST
body is decoded against the type of its handler's ``data`` parameter."""
ROUTES = frozenset(path for handler in ROUTE_HANDLERS for path in handler.paths)


def _body_types() -> dict[str, type]:
    bodies: dict[str, type] = {}
    for handler in ROUTE_HANDLERS:
        data = get_type_hints(handler.fn, include_extras=True).get("data")
        if data is not None:
            for path in handler.paths:
                bodies[path] = get_args(data)[0] if get_args(data) else data
    return bodies


BODIES: dict[str, type] = _body_types()


async def _load(service: ServiceState) -> None:
    try:
        loaded = await asyncio.to_thread(service.pool.load)
        on_idle = trim_heap if service.settings.tune_malloc else None  # give the kept peak heap back when quiet
        service.pool.start_engines(loaded, service.settings.engine, service.metrics, on_idle)
        # The ~450k objects of torch, transformers and the app live as long as the process. Moving them out
        # of the collector's generations keeps each full collection from stalling the loop for ~240 ms.
        gc.freeze()
        service.status = "ok"
        logger.info("models ready: %s", ", ".join(service.pool.models))
    except Exception as exc:  # keep serving /health with the reason
        service.status, service.detail = "failed", f"{type(exc).__name__}: {exc}"
        logger.exception("model loading failed")


def create_app(
    settings: Settings | None = None, *, wait_for_models: bool = False, models: Mapping[str, Any] | None = None
) -> Litestar:
    """Build the app from ``settings`` (default: the environment, see :mod:`service.settings`).

    ``wait_for_models=True`` loads the models before serving. ``models`` maps ids to already-built models
    (e.g. ``{"fake": FakeEncoder()}`` from :mod:`embedrank.testing.fake`) to serve instead of loading the
    configured ones; the fast HTTP tests use it.
    """
    settings = settings or Settings.from_env()
    keys = settings.api_keys
    generated = None
    if not keys and not settings.no_auth:
        generated = secrets.token_urlsafe(32)
        keys = (generated,)
    service = ServiceState(
        settings=settings, pool=ModelPool(settings.models, preloaded=models), metrics=Metrics(ROUTES)
    )
    if settings.tune_malloc:  # before the loading and forward threads exist
        tune_malloc()

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        if not settings.access_log:  # one log line per request costs ~10% of the event loop at high rates
            logging.getLogger("uvicorn.access").disabled = True
        if generated:
            print(
                f"embedrank: no API key configured (EMBEDRANK_API_KEYS); generated one for this run:\n"
                f"    Authorization: Bearer {generated}",
                file=sys.stderr,
                flush=True,
            )
        if settings.no_auth:
            logger.warning("EMBEDRANK_NO_AUTH is set: the service runs WITHOUT authentication")
            print(
                "embedrank: WARNING: running without authentication (EMBEDRANK_NO_AUTH=1)", file=sys.stderr, flush=True
            )
        server = asgi_server()  # before install() puts its handler in front of the server's
        deadline = HeaderDeadline(server, settings.header_timeout_seconds) if server is not None else None
        shutdown.install(partial(setattr, service, "status", "draining"), drain, settings.drain_seconds)
        service.load_task = asyncio.get_running_loop().create_task(_load(service))
        if deadline is not None:
            deadline.start()
        if wait_for_models:
            await service.load_task
        try:
            yield
        finally:
            if deadline is not None:
                await deadline.stop()
            service.status = "draining"
            service.load_task.cancel()
            await service.pool.drain(settings.drain_seconds)

    inflight = shutdown.InFlight()
    service.metrics.in_progress.set_function(lambda: inflight.count)

    async def drain(timeout: float) -> None:
        """Wait for the requests in flight (bodies still arriving included), then finish the engines' work."""
        start = asyncio.get_running_loop().time()
        await inflight.wait_idle(timeout)
        await service.pool.drain(max(0.0, timeout - (asyncio.get_running_loop().time() - start)))

    middleware = [RequestMiddleware(service.metrics, None if settings.no_auth else BearerAuth(keys), inflight)]
    app = Litestar(
        route_handlers=list(ROUTE_HANDLERS),
        lifespan=[lifespan],
        state=State({"service": service}),
        # one dependency at most per handler: Litestar resolves several at once in an anyio task group,
        # which cost ~15% of the event loop per request in eval/bench_service.py
        dependencies={"pool": Provide(_pool, sync_to_thread=False)},
        middleware=middleware,
        before_request=_json_body,
        exception_handlers={Exception: handle_exception},
        request_max_body_size=settings.limits.max_body_bytes,
        cors_config=CORSConfig(
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "HEAD", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
        )
        if settings.cors_origins
        else None,
        openapi_config=OpenAPIConfig(
            title="embedrank",
            version="0.1.0",
            description="Text embeddings (OpenAI-compatible) and reranking (Cohere/Jina-compatible) for the models this "
            "server was configured with. Every route but /health needs "
            "'Authorization: Bearer <key>'. Errors use the OpenAI body {error: {message, type, param, code}}.",
            components=Components(security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")}),
            security=[{"bearer": []}],
        ),
        debug=False,
    )
    complete_openapi(app, settings.limits, service.pool)
    return app
