"""Traces over OpenTelemetry, asked for with OpenTelemetry's own environment variables; off and free when none is set.

Tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``, or any installed
exporter's entry point; ``none`` is off), or, with it unset, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (then ``otlp``); ``OTEL_SDK_DISABLED=true`` turns it off.
``otlp`` sends ``http/protobuf`` (OpenTelemetry's recommended default) unless ``OTEL_EXPORTER_OTLP_PROTOCOL``
(or ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``) says ``grpc``, which needs ``opentelemetry-exporter-otlp-proto-grpc``
installed. The SDK reads the rest itself: ``OTEL_SERVICE_NAME`` (default here ``embedrank``),
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` and its argument, the exporters' endpoint, headers
and timeouts, ``OTEL_BSP_*`` for the batching of exports, ``OTEL_PROPAGATORS`` (default W3C ``traceparent``
and baggage).

Each HTTP request gets one server span from Litestar's OpenTelemetry middleware (named ``METHOD route``, the
route as the metrics count it), which honours an incoming ``traceparent``; the core adds the GenAI attributes
and the child spans (:mod:`embedrank.serving.tracing`), and the request's id as ``embedrank.request_id``.
``/health`` and ``/metrics`` are not traced.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from litestar.enums import ScopeType
from litestar.middleware.base import AbstractMiddleware
from litestar.plugins.opentelemetry import OpenTelemetryConfig, OpenTelemetryInstrumentationMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import embedrank
from service import request_ids
from service.settings import SettingsError

UNTRACED = ("^/health$", "^/metrics$")
"""Paths that get no span: probes and scrapes would fill the traces."""

_EXPORTERS = "opentelemetry_traces_exporter"  # the entry point group exporters register under
_OTLP = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
_OTLP_PACKAGES = {
    "otlp_proto_http": "opentelemetry-exporter-otlp-proto-http",
    "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc",
}


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The trace exporters ``environ`` asks for, as entry point names (empty: tracing off).

    >>> exporter_names({}), exporter_names({"OTEL_TRACES_EXPORTER": "console,otlp"})
    ([], ['console', 'otlp_proto_http'])
    >>> exporter_names({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    ['otlp_proto_grpc']
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not named:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        named = "otlp" if endpoint else "none"
    names = [n.strip() for n in named.split(",") if n.strip()]
    if "none" in names:
        return []
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if "otlp" in names and protocol not in _OTLP:
        raise SettingsError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported for traces: use one of {sorted(_OTLP)}"
        )
    return list(dict.fromkeys(_OTLP[protocol] if n == "otlp" else n for n in names))


def _exporter(name: str) -> SpanExporter:
    """The installed trace exporter registered as ``name``, built from its environment variables."""
    found = entry_points(group=_EXPORTERS, name=name)
    if not found:
        installed = sorted(e.name for e in entry_points(group=_EXPORTERS))
        hint = f"; install {_OTLP_PACKAGES[name]}" if name in _OTLP_PACKAGES else ""
        raise SettingsError(
            f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides (installed: {installed}){hint}"
        )
    exporter: SpanExporter = next(iter(found)).load()()
    return exporter


def provider_from_env(environ: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """The tracer provider the ``OTEL_*`` variables of ``environ`` ask for, exporting through each named exporter
    in batches; None when they ask for no traces.

    Raises:
        SettingsError: an exporter that is not installed, or an OTLP protocol that does not exist.
    """
    names = exporter_names(environ)
    if not names:
        return None
    exporters = [_exporter(name) for name in names]
    resource = Resource.create({SERVICE_VERSION: embedrank.__version__})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):  # neither variable named it
        resource = resource.merge(Resource({SERVICE_NAME: "embedrank"}))
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER, parent-based always-on
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


PROPAGATED = frozenset({b"traceparent", b"tracestate", b"baggage"})
"""The request headers a caller's trace context can come in (W3C trace context and baggage)."""


class ServerSpans(OpenTelemetryInstrumentationMiddleware):
    """Litestar's OpenTelemetry middleware with a lean server span: the caller's context from ``traceparent``
    (the configured propagators, over the headers that can carry it), then one ``SERVER`` span named by the
    config's ``scope_span_details_extractor``, with OpenTelemetry's stable HTTP attributes
    (``http.request.method``, ``url.path``, ``url.scheme``, ``http.route``, ``http.response.status_code``; error
    status from 500) and the request's id (``embedrank.request_id``).

    opentelemetry-instrumentation-asgi's middleware, which Litestar's runs by default, records about 15
    attributes per request (the full URL, host, user agent, ...) and wraps every ASGI message: about 80 us of
    the event loop per request (cProfile, 2-core AMD EPYC), where the service's own event-loop work for a
    one-query request is a few hundred; this keeps what a trace of this service needs."""

    def __init__(self, app: ASGIApp, config: OpenTelemetryConfig) -> None:
        AbstractMiddleware.__init__(
            self, app=app, scopes=config.scopes, exclude=config.exclude, exclude_opt_key=config.exclude_opt_key
        )
        assert config.tracer_provider is not None
        self.tracer = config.tracer_provider.get_tracer("embedrank.http", embedrank.__version__)
        self.details = config.scope_span_details_extractor

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name, attributes = self.details(scope)
        carrier = {k.decode(): v.decode("latin-1") for k, v in scope["headers"] if k in PROPAGATED}
        attributes["http.request.method"] = scope.get("method", "")
        attributes["url.path"] = scope["path"]
        attributes["url.scheme"] = scope.get("scheme", "http")
        attributes["embedrank.request_id"] = request_ids.of_scope(scope)  # the id of x-request-id and the logs
        parent = propagate.extract(carrier) if carrier else None
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            span.set_attribute("http.response.status_code", status or 500)
            if not status or status >= 500:
                span.set_status(StatusCode.ERROR)
            span.end()
            otel_context.detach(token)


def traced(app: ASGIApp, provider: TracerProvider, route_of: Any) -> ASGIApp:
    """``app`` behind Litestar's OpenTelemetry middleware (:class:`ServerSpans`): a server span per HTTP request,
    named ``METHOD route`` with ``route_of(path)`` (a route template, not the raw path)."""

    def span_details(scope: Scope) -> tuple[str, dict[str, Any]]:
        route = route_of(scope.get("path", ""))
        return f"{scope.get('method', '')} {route}", {"http.route": route}

    config = OpenTelemetryConfig(
        tracer_provider=provider,
        scope_span_details_extractor=span_details,
        exclude=list(UNTRACED),
        scopes={ScopeType.HTTP},
        middleware_class=ServerSpans,
    )
    return config.middleware_class(app=app, config=config)
