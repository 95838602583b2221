"""Litestar app factory. ``litestar run`` from the repo root (found through ``app.py``) or
``uvicorn --factory service.app:create_app``.

Nothing happens at import time. :func:`create_app` reads settings and resolves the configured models;
the lifespan loads their weights in a worker thread (``/health`` answers 503 until then), starts one
batching engine per model, and on shutdown drains the requests in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import secrets
import sys
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Any

from litestar import Litestar, Request, Router
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin, RedocRenderPlugin, SwaggerRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from opentelemetry.sdk.trace import TracerProvider

import embedrank
from embedrank.errors import ConfigurationError, NotReadyError, shorten
from embedrank.serving import tracing as core_tracing
from embedrank.serving.allocator import trim_heap, tune_malloc
from embedrank.serving.pool import ModelPool, compute_threads
from embedrank.serving.remote import Description, EngineFailedError, EngineLink
from service import logs, process, request_ids, shutdown, tracing
from service.auth import BearerAuth
from service.batches.service import BatchService
from service.connections import HeaderDeadline, asgi_server, json_parse_errors
from service.decoding import decompressed
from service.errors import APIError, handle_exception
from service.fast_path import EmbeddingsFastPath
from service.files.routes import FILE_HANDLERS, FORM_PATHS
from service.files.service import FileService
from service.handling import METRICS_REPORT_SECONDS, ServiceState, front_source, pool_of, read_json_body, service_of
from service.litestar_internals import set_body, set_decoded_body
from service.middleware import RequestMiddleware
from service.observability import CacheMetrics, Metrics
from service.openapi import complete_openapi
from service.replica import ENGINE_SOCKET_ENV, FRONTS_READY_CALL
from service.request_ids import HEADER as REQUEST_ID_HEADER
from service.routes import DOC_PATHS, ROUTE_HANDLERS, ROUTES, body_schema
from service.settings import Settings, SettingsError
from service.storage.service import StorageService
from service.vector_stores.service import VectorStoreService

logger = logging.getLogger("embedrank.service")
FORM_MARGIN = 64 * 1024  # an upload's form fields and part headers, beside the file itself
ENGINE_POLL_SECONDS = 0.5  # how often a front asks for an engine process that is loading or cannot be reached
FRONT_LOAD_SECONDS = 120.0  # how long a front started beside a serving engine process waits to be ready to answer


async def _json_body(request: Request[Any, Any, Any]) -> None:
    """415 unless a POST body is declared as its route takes it: JSON (Content-Type: application/json), or a
    multipart form for a file upload; then a JSON body is decoded, once, strictly against the route's schema
    (:func:`~service.handling.read_json_body`), so a wrong type is a 400 that names the field rather than a
    silent coercion, and the handler receives that decoded value. A POST that takes no body (a cancel) is
    left alone."""
    if request.method != "POST":
        return
    path = request.url.path
    schema = body_schema(path)
    expected = "multipart/form-data" if path in FORM_PATHS else "application/json" if schema is not None else None
    if expected is None:
        return
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() != expected:
        raise APIError(
            415,
            f"Content-Type must be {expected}, got {shorten(content_type or 'none')!r}",
            code="unsupported_media_type",
        )
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if path in FORM_PATHS and encoding not in ("", "identity"):  # decompressed before the form is parsed
        await _decompress_form(request, encoding, service_of(request.app.state).settings.limits.max_file_bytes)
    if schema is not None:
        # decode once: Litestar reads the JSON of the connection state before parsing the body itself,
        # and passes a value that already has the handler's data type through unchanged
        settings = service_of(request.app.state).settings
        set_decoded_body(request, await read_json_body(request, schema, settings))


async def _decompress_form(request: Request[Any, Any, Any], encoding: str, max_file_bytes: int) -> None:
    """A gzip-compressed upload's form, decompressed (at most ``max_file_bytes`` and the form's margin) before
    it is parsed; any other encoding is a 415 (it would be read as if it were plain)."""
    if encoding not in ("gzip", "x-gzip"):
        raise APIError(
            415,
            f"Content-Encoding {shorten(encoding)!r} is not supported for uploads; send the form as is, or gzip",
            code="unsupported_media_type",
        )
    try:
        body = decompressed(await request.body(), encoding, max_file_bytes + FORM_MARGIN)
    except APIError as exc:
        if exc.status == 413:
            raise APIError(
                413, f"the decompressed upload is larger than max_file_bytes={max_file_bytes}", code="file_too_large"
            ) from None
        raise APIError(400, "the upload is labelled gzip but is not whole gzip data", code="invalid_request") from None
    set_body(request, body)


async def _load(service: ServiceState, *, exit_on_failure: bool) -> None:
    try:
        keep_going = service.settings.models.on_model_failure == "serve-others"
        link = service.pool.link
        if link is not None:  # a front: the engine process loads the weights; this one the tokenizers
            description = await _described(service, link)
            loaded = await asyncio.to_thread(partial(service.pool.load, description=description))
        else:
            loaded = await asyncio.to_thread(partial(service.pool.load, keep_going=keep_going))
        on_idle = trim_heap if service.settings.engine.tune_malloc else None  # give the kept peak heap back when quiet
        metrics = service.metrics
        service.pool.start(
            loaded,
            service.settings.engine.engine_config(),
            on_batch=metrics.batch_observer,
            # a front's engines are the engine process's, which reports their queues
            on_engine=metrics.track_engine if link is None else lambda label, engine: None,
            on_idle=on_idle,
        )
        # The ~450k objects of torch, transformers and the app live as long as the process. Moving them out
        # of the collector's generations keeps each full collection from stalling the loop for ~240 ms.
        gc.freeze()
        failed = list(service.pool.failed.values())
        if failed:  # on_model_failure = "serve-others": the others serve, and /health says which did not
            served = len(service.pool.models)
            service.detail = f"serving {served} of {served + len(failed)} models; " + "; ".join(failed)
        service.status = "ok"
        logger.info("models ready: %s", ", ".join(service.pool.models))
    except Exception as exc:
        debug = service.settings.telemetry.log_level == "debug"
        if exit_on_failure:  # a server process: one line, exit code 3 (service.process)
            process.failed_while_serving(exc, debug=debug)
        service.status, service.detail = "failed", f"{type(exc).__name__}: {exc}"  # an app in a test client
        logger.error("model loading failed: %s", service.detail, exc_info=debug)


async def _described(service: ServiceState, link: EngineLink) -> Description:
    """The engine process's description, asked until it has loaded its models (the front is loading until then)."""
    while True:
        try:
            return await link.describe()
        except NotReadyError as exc:
            service.detail = f"waiting for the engine process: {exc}"
            await asyncio.sleep(ENGINE_POLL_SECONDS)


async def _engine_serving(link: EngineLink) -> bool:
    """Whether the engine process answers, its models loaded, within a second."""
    try:
        await asyncio.wait_for(link.describe(), 1.0)
    except (NotReadyError, TimeoutError):
        return False
    return True


async def _watch_engine(service: ServiceState, link: EngineLink, described: Description) -> None:
    """A front's readiness follows its engine process: while it cannot be reached, ``/health`` answers 503
    (``loading``) as the requests do; once it answers again, the front is ready again, unless it came back serving
    other models than this front loaded: then the front exits with :data:`~service.process.EXIT_RESTART` for its
    replica to start it again."""
    lost = False
    while True:
        await asyncio.sleep(ENGINE_POLL_SECONDS)
        if service.status not in ("ok", "loading") or (link.connected and not lost):
            continue
        try:
            now = await link.describe()  # connects again if the connection was lost
        except NotReadyError as exc:
            lost = True
            service.status, service.detail = "loading", f"the engine process is not reachable: {exc}"
            continue
        if (now.models, sorted(now.engines), now.failed) != (
            described.models,
            sorted(described.engines),
            described.failed,
        ):
            logger.error("the engine process came back serving other models; this front stops to load them again")
            process.exit_soon(process.EXIT_RESTART)
            return
        lost = False
        service.status, service.detail = "ok", None


async def _front_watch(service: ServiceState, link: EngineLink) -> None:
    """Once the front has loaded, :func:`_watch_engine` with the description it loaded with, and this front's
    metrics left with the engine process every :data:`~service.handling.METRICS_REPORT_SECONDS`."""
    if service.load_task is not None:
        await asyncio.gather(service.load_task, return_exceptions=True)
    if service.pool.description is not None:
        await asyncio.gather(_watch_engine(service, link, service.pool.description), _report_metrics(service, link))


async def _report_metrics(service: ServiceState, link: EngineLink) -> None:
    """Every :data:`~service.handling.METRICS_REPORT_SECONDS`: this front's metrics and readiness left with the
    engine process, and how many of the replica's fronts are ready asked back (``/health`` is 200 once all are)."""
    source, fronts = front_source(), service.settings.server.fronts
    while True:
        with contextlib.suppress(NotReadyError, EngineFailedError):  # the engine process is away: in time next
            await link.report(source, await asyncio.to_thread(service.metrics.render), ready=service.status == "ok")
            ready = await link.call(FRONTS_READY_CALL, None)
            service.waiting_for_fronts = None if ready >= fronts else f"{ready} of {fronts} front processes are ready"
        await asyncio.sleep(METRICS_REPORT_SECONDS)


def create_app(
    settings: Settings | None = None,
    *,
    wait_for_models: bool = False,
    models: Mapping[str, Any] | None = None,
    tracer_provider: TracerProvider | None = None,
    engine_socket: str | None = None,
) -> Litestar:
    """Build the app from ``settings`` (default: the environment, see :mod:`service.settings`).

    ``wait_for_models=True`` loads the models before serving. ``models`` maps ids to already-built models
    (e.g. ``{"fake": FakeEncoder()}`` from :mod:`embedrank.testing.fake`) to serve instead of loading the
    configured ones; the fast HTTP tests use it. ``tracer_provider`` records OpenTelemetry traces of the
    requests and their work (default: none; from the environment, what its ``OTEL_*`` variables ask for,
    :mod:`service.tracing`).

    ``engine_socket`` makes the app a replica's front process (:mod:`service.replica`; from the environment,
    ``EMBEDRANK_ENGINE_SOCKET``): the models' forward passes, the batch jobs and the vector stores' file reading run
    in the engine process listening there; this process serves HTTP, decodes, tokenizes and answers.
    """
    if settings is None:  # the process's entry point (litestar run, uvicorn --factory)
        try:
            settings = Settings.from_env()
            logging.getLogger("embedrank").setLevel(settings.telemetry.log_level.upper())
            provider = tracer_provider or tracing.provider_from_env()
            app = create_app(
                settings,
                wait_for_models=wait_for_models,
                models=models,
                tracer_provider=provider,
                engine_socket=os.environ.get(ENGINE_SOCKET_ENV) or None,
            )
            # the server and the app have set their logging up: JSON from here
            if settings.telemetry.log_format == "json":
                logs.use_json_lines()
            return app
        except Exception as exc:  # a setting, a model entry, a model that cannot be found: one line, code 3
            process.fail_to_start(exc)
    keys = settings.auth.api_keys
    generated = None
    if not keys and not settings.auth.no_auth:
        generated = secrets.token_urlsafe(32)
        keys = (generated,)
    try:
        cache = settings.cache.vector_cache(settings.batches)
        link = EngineLink(engine_socket, request_id=request_ids.CURRENT.get) if engine_socket else None
        pool = ModelPool(settings.models.entries, preloaded=models, cache=cache, engine_link=link)
    except ConfigurationError as exc:  # a model entry its model cannot serve: a setting to fix, said as one
        raise SettingsError(str(exc)) from None
    service = ServiceState(settings=settings, pool=pool, metrics=Metrics(ROUTES))
    if link is not None:  # until the engine process says every front of the replica is ready
        service.waiting_for_fronts = "waiting to hear that the replica's other front processes are ready"
    storage = StorageService(settings)  # opened once, on first use: files, batches and vector stores share it
    files = FileService(storage)
    batches = BatchService(storage, files, service.ready_pool)
    vector_stores = VectorStoreService(storage, files, service.ready_pool, engine_link=link)
    if link is None:  # a front's replica reports the batches' progress from its engine process
        service.metrics.registry.register(batches)  # its collect(): the batches' progress
    service.metrics.registry.register(vector_stores)  # its collect(): the indexes held (a front's: none)
    if cache is not None:
        service.metrics.registry.register(CacheMetrics(cache))
    if settings.engine.tune_malloc:  # before the loading and forward threads exist
        tune_malloc()

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        server = asgi_server()  # before install() puts its handler in front of the server's
        if server is not None:
            listening = process.can_listen(server.config)
            if listening is not None:  # the port is taken: say so now, not after the models have loaded
                process.failed_while_serving(listening, debug=settings.telemetry.log_level == "debug")
        # the access lines are the middleware's (with the request id and model: service.logs), off by default:
        # one log line per request costs ~10% of the event loop at high rates
        logging.getLogger("uvicorn.access").disabled = True
        if generated:
            print(
                f"embedrank: no API key configured (EMBEDRANK_API_KEYS); generated one for this run:\n"
                f"    Authorization: Bearer {generated}",
                file=sys.stderr,
                flush=True,
            )
        if settings.auth.no_auth:
            logger.warning("EMBEDRANK_NO_AUTH is set: the service runs WITHOUT authentication")
            print(
                "embedrank: WARNING: running without authentication (EMBEDRANK_NO_AUTH=1)", file=sys.stderr, flush=True
            )
        threads, cpus = compute_threads()  # a container's CPU quota, not the host's cores
        logger.info("compute threads: %d (usable CPUs: %d)", threads, cpus)
        deadline = HeaderDeadline(server, settings.server.header_timeout_seconds) if server is not None else None
        if server is not None:
            json_parse_errors(server)
        signals: list[int] = []

        def draining(sig: int) -> None:
            signals.append(sig)
            service.status = "draining"

        shutdown.install(draining, drain, settings.server.drain_seconds)
        core_tracing.use(tracer_provider)
        service.load_task = asyncio.get_running_loop().create_task(_load(service, exit_on_failure=server is not None))
        background: list[asyncio.Task[None]] = []
        if link is None:
            background += [
                asyncio.get_running_loop().create_task(batches.run()),
                asyncio.get_running_loop().create_task(vector_stores.run(cpus)),
            ]
        else:  # a front: the batch jobs, the files and the stores' searches run once per replica, in the engine process
            background += [
                asyncio.get_running_loop().create_task(vector_stores.run(cpus, searches=False, files=False)),
                asyncio.get_running_loop().create_task(_front_watch(service, link)),
            ]
        if deadline is not None:
            deadline.start()
        if wait_for_models:
            await service.load_task
        elif link is not None and await _engine_serving(link):
            # a front started while its engine process serves (one that replaced a front that died) takes
            # connections once it can answer them: none meets a front still loading while the others answer
            await asyncio.wait({service.load_task}, timeout=FRONT_LOAD_SECONDS)
        try:
            yield
        finally:
            if deadline is not None:
                await deadline.stop()
            service.status = "draining"
            service.load_task.cancel()
            for (
                task
            ) in background:  # a batch chunk or a file in flight is not recorded: it runs again after the restart
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await service.pool.drain(settings.server.drain_seconds)
            if link is not None:
                await link.close()
            if tracer_provider is not None:  # what is still batched for export goes out before the exit
                core_tracing.use(None)
                await asyncio.to_thread(tracer_provider.force_flush)
            if server is not None:  # a thread still loading or writing does not hold the exit up
                process.exit_soon(process.exit_code(signals[0] if signals else None))

    inflight = shutdown.InFlight()
    service.metrics.in_progress.set_function(lambda: inflight.count)

    async def drain(timeout: float) -> None:
        """Wait for the requests in flight (bodies still arriving included), then finish the engines' work."""
        start = asyncio.get_running_loop().time()
        await inflight.wait_idle(timeout)
        await service.pool.drain(max(0.0, timeout - (asyncio.get_running_loop().time() - start)))

    open_paths = DOC_PATHS if settings.auth.public_docs else ()
    auth = (
        None
        if settings.auth.no_auth
        else BearerAuth(keys, open_preflights=bool(settings.server.cors_origins), open_paths=open_paths)
    )
    service.auth = auth  # the exception handler checks it for paths that are no route (no middleware runs there)
    tracking = RequestMiddleware(service.metrics, auth, inflight, access_log=settings.telemetry.access_log)
    middleware = [tracking]
    app = Litestar(
        route_handlers=[
            *ROUTE_HANDLERS,
            # uploads may be larger than a JSON body: their own limit
            Router(
                "/",
                route_handlers=list(FILE_HANDLERS),
                request_max_body_size=settings.limits.max_file_bytes + FORM_MARGIN,
            ),
        ],
        lifespan=[lifespan],
        state=State({"service": service, "files": files, "batches": batches, "vector_stores": vector_stores}),
        # one dependency at most per handler: Litestar resolves several at once in an anyio task group,
        # which cost ~15% of the event loop per request in eval/benchmarks/service.py
        dependencies={"pool": Provide(pool_of, sync_to_thread=False)},
        middleware=middleware,
        before_request=_json_body,
        exception_handlers={Exception: handle_exception},
        request_max_body_size=settings.limits.max_body_bytes,
        cors_config=CORSConfig(
            allow_origins=list(settings.server.cors_origins),
            # DELETE: /v1/files/{id}; the request id is sent and read back by browser clients too
            allow_methods=["GET", "POST", "DELETE", "HEAD", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "Content-Encoding", REQUEST_ID_HEADER.decode()],
            expose_headers=[REQUEST_ID_HEADER.decode()],
        )
        if settings.server.cors_origins
        else None,
        openapi_config=OpenAPIConfig(
            title="embedrank",
            version=embedrank.__version__,
            description="Text embeddings (OpenAI-compatible) and reranking (Cohere/Jina-compatible) for the models this "
            "server was configured with. Every route but /health (and this description, /openapi.json, with its "
            "pages /docs and /docs/redoc) needs 'Authorization: Bearer <key>'. Errors use the OpenAI body "
            "{error: {message, type, param, code, request_id}}; every answer carries its request id in x-request-id.",
            components=Components(security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")}),
            security=[{"bearer": []}],
            path="/docs",  # Swagger UI at /docs, ReDoc at /docs/redoc; the document also at /openapi.json
            render_plugins=[
                SwaggerRenderPlugin(path="/"),
                RedocRenderPlugin(path="/redoc"),
                JsonRenderPlugin(path="/openapi.json"),
            ],
        ),
        debug=False,
    )
    complete_openapi(app, settings.limits, service.pool, settings.server.decodes_token_ids)
    if not settings.server.cors_origins:  # CORS headers come from Litestar's middleware: those requests take the routes
        app.asgi_handler = EmbeddingsFastPath(app, app.asgi_handler, service, tracking)
    if tracer_provider is not None:  # outermost: the server span covers the fast path too
        app.asgi_handler = tracing.traced(app.asgi_handler, tracer_provider, service.metrics.route_of)
    return app
