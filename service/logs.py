"""The service's log lines about requests: each carries the request's id (and, once known, its route, model,
status and latency), as text, or as one JSON object per line with ``log_format = "json"``.

The request middleware opens a request's fields (:func:`opened`); decoding the body notes its model
(:func:`note_model`); a filter on every handler copies them onto each record (:class:`RequestFields`); with
``access_log`` on, the middleware writes one line per request (:func:`access`). No line at a level above
debug quotes what a client sent: errors are logged by their status and code, not their text.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from service import request_ids

FIELDS = ("request_id", "route", "method", "model", "status", "latency_ms")
"""The fields a request's log lines may carry, beside time, level, logger and message."""

_REQUEST: ContextVar[dict[str, Any] | None] = ContextVar("embedrank_request_fields", default=None)

ACCESS = logging.getLogger("embedrank.access")
# the loggers whose lines the service's handler shows (the server's, the framework's and its own)
SERVICE_LOGGERS = ("embedrank", "uvicorn", "uvicorn.error", "litestar")


@contextlib.contextmanager
def opened(route: str, method: str) -> Iterator[dict[str, Any]]:
    """The fields of the request being served in this context: its route and method now, its model once the
    body is decoded."""
    fields: dict[str, Any] = {"route": route, "method": method}
    token = _REQUEST.set(fields)
    try:
        yield fields
    finally:
        _REQUEST.reset(token)


def note_model(model: Any) -> None:
    """Note the model the request's body names (a string), for the request's later log lines."""
    fields = _REQUEST.get()
    if fields is not None and isinstance(model, str):
        fields["model"] = model


def access(fields: dict[str, Any], status: int, seconds: float) -> None:
    """The request's one access line: route, method, model, status and latency."""
    latency_ms = round(seconds * 1000, 2)
    request_id = request_ids.CURRENT.get()
    extra = {**fields, "status": status, "latency_ms": latency_ms, "request_id": request_id}
    model = f" model={fields['model']}" if "model" in fields else ""
    message = "request %s: %s %s %d %.2f ms%s"
    ACCESS.info(message, request_id, fields["method"], fields["route"], status, latency_ms, model, extra=extra)


class RequestFields(logging.Filter):
    """Copies the request's id and fields onto each record logged while it is served (a record's own
    ``extra`` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_ids.CURRENT.get()
        for name, value in (_REQUEST.get() or {}).items():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


class JsonLines(logging.Formatter):
    """One JSON object per record: ``timestamp`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, each of
    :data:`FIELDS` the record has, and ``exception`` (the traceback) when it carries one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def use_json_lines(stream: Any = None) -> logging.Handler:
    """Show every log line of the process as a JSON object on ``stream`` (stderr): one handler on the root
    logger, in place of the server's and the framework's own, which now hand their records to it."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLines())
    handler.addFilter(RequestFields())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    for name in SERVICE_LOGGERS:
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
    return handler
