"""Every error leaves the service here, as the OpenAI error body::

    {"error": {"message": str, "type": str, "param": str | null, "code": str | null, "request_id": str}}

Deterministic client mistakes are 4xx (never 5xx or 429, which the OpenAI SDK retries).
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

import msgspec
from litestar import MediaType, Request, Response
from litestar.exceptions import (
    HTTPException,
    InternalServerException,
    MethodNotAllowedException,
    NotAuthorizedException,
    NotFoundException,
    SerializationException,
    ValidationException,
)
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from embedrank.errors import (
    EmbedrankError,
    InputTooLongError,
    InvalidInputError,
    ModelKindError,
    ModelNotFoundError,
    ModelUnavailableError,
    NotReadyError,
    OutputNotAvailableError,
    OverloadedError,
    RequestTooLargeError,
    UnsupportedMediaError,
)
from service import request_ids
from service.validation_messages import split_at

logger = logging.getLogger("embedrank.service")


class StoreError(Exception):
    """What the Batch API's store (its database, its files, its disk) refuses or cannot do now. Each subclass
    declares its answer, mapped once (:func:`to_api_error`): the HTTP status, OpenAI's ``type`` and ``code``,
    the field it concerns and ``Retry-After``; the message clients see is :attr:`public_message` where one is
    declared (the exception's own text, which may name hosts or paths, then goes to the log only), else the
    exception's text."""

    status = 500
    type = "server_error"
    code = "store_error"
    param: str | None = None
    retry_after: int | None = None
    public_message: str | None = None

    def public(self) -> str:
        """The message the client reads."""
        return self.public_message or str(self)


class NotFoundError(StoreError):
    """No such object for this API key (another key's objects are not found either): 404 ``not_found``, naming the
    field of its id (``param``; default: ``what`` with underscores and ``_id``, ``vector store`` ->
    ``vector_store_id``)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"

    def __init__(self, what: str, object_id: str, param: str | None = None) -> None:
        super().__init__(f"no {what} with id {object_id[:100]!r} for this API key")
        self.param = param or f"{what.replace(' ', '_')}_id"


NO_NUL = r"^[^\x00]*$"
"""The pattern of a string the service stores: no NUL character (:class:`NulCharacterError`; the request schemas'
``Text``)."""


class NulCharacterError(StoreError):
    """A value to be stored (or looked up) holds a NUL character (U+0000), which is no text and which PostgreSQL's
    text cannot hold: 400 ``invalid_value`` on every database alike (the fields a client names are refused
    when the body is decoded, naming the field; this is the storage's backstop for the rest, such as an id)."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_value"

    def __init__(self, param: str | None = None) -> None:
        what = param or "a value of the request"
        super().__init__(f"{what} holds a NUL character (\\u0000), which is not stored; remove it")
        self.param = param


class UnavailableError(StoreError):
    """Something the API depends on (the Batch API's database) cannot be used now; the same call may succeed
    later: 503 with ``Retry-After`` and the subclass's ``code`` and ``public_message``."""

    status = 503
    type = "service_unavailable"
    code = "service_unavailable"
    retry_after = 5
    public_message = "a service this API depends on is not available now; try again shortly"


class InsufficientStorageError(StoreError):
    """The disk that holds what a request writes (the Batch API's files and database) is full: 507
    ``insufficient_storage``."""

    status = 507
    code = "insufficient_storage"
    public_message = "the server has no room to store this now; delete files you no longer need, or try again later"


class APIError(Exception):
    """An error with its HTTP status and OpenAI-style fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}


def invalid(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def _from_core(exc: EmbedrankError) -> APIError:
    if isinstance(exc, ModelNotFoundError):
        return APIError(404, str(exc), param="model", code="model_not_found")
    if isinstance(exc, ModelKindError):
        return APIError(400, str(exc), param="model", code="model_wrong_kind")
    if isinstance(exc, RequestTooLargeError):
        return APIError(413, f"{exc}; see {exc.limit}", param=exc.param, code="request_too_large")
    if isinstance(exc, UnsupportedMediaError):
        return APIError(415, str(exc), param=exc.param, code="unsupported_media_type")
    if isinstance(exc, OutputNotAvailableError):
        return APIError(400, str(exc), param=exc.param, code="output_not_available")
    if isinstance(exc, InputTooLongError):
        return APIError(400, str(exc), param=exc.param, code="input_too_long")
    if isinstance(exc, InvalidInputError):
        return APIError(400, str(exc), param=exc.param, code="invalid_value")
    if isinstance(exc, OverloadedError):
        return APIError(
            429,
            str(exc),
            type="server_overloaded",
            code="queue_full",
            headers={"Retry-After": str(max(1, round(exc.retry_after)))},
        )
    if isinstance(exc, ModelUnavailableError):  # no Retry-After: only a restart with the cause fixed helps
        return APIError(503, str(exc), type="service_unavailable", code="model_unavailable")
    if isinstance(exc, NotReadyError):
        return APIError(503, str(exc), type="service_unavailable", code="not_ready", headers={"Retry-After": "5"})
    return APIError(500, "internal error", type="server_error", code="internal_error")


_TYPE_NAMES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "a boolean", "null": "null"}
_TYPE_NAMES.update({"array": "an array", "object": "an object"})


def validation_error(message: str) -> APIError:
    """One clear 400 from a msgspec validation message such as ``Expected `int`, got `str` - at `$.top_n```.

    >>> e = validation_error("Expected `int | null`, got `str` - at `$.dimensions`")
    >>> (e.param, e.code, e.message)
    ('dimensions', 'invalid_type', 'dimensions must be an integer or null, got a string')
    >>> validation_error("Expected `array` of length >= 1 - at `$.documents`").code
    'empty_documents'
    """
    detail, path = split_at(message)
    named = re.match(r"[A-Za-z_]+", path) if path else None
    field = named.group(0) if named else None
    missing = re.search(r"Object missing required field `([^`]+)`", detail)
    if missing:
        name = f"{path}.{missing.group(1)}" if path else missing.group(1)
        return invalid(f"missing required field '{name}'", param=name, code="missing_field")
    if "length >= 1" in detail and field in ("input", "documents", "query"):
        what = f"{field} is empty" if path == field else f"{path} is an empty string"
        return invalid(f"{what}; send non-empty text", param=field, code=f"empty_{field}")
    if "matching regex" in detail and NO_NUL.replace("\\", "\\\\") in detail:  # a NUL in a stored field
        error = NulCharacterError(path)
        return invalid(error.public(), param=field, code=error.code)
    bound = re.search(r"Expected `\w+` (?:of length )?([<>]=?) ([\d.]+)", detail)
    if bound:
        return invalid(f"{path} must be {bound.group(1)} {bound.group(2)}", param=field, code="invalid_value")
    expected = re.search(r"Expected `([^`]+)`, got `(\w+)`", detail)
    if expected:
        want = " or ".join(_TYPE_NAMES.get(t.strip(), f"`{t.strip()}`") for t in expected.group(1).split("|"))
        if path == "input":
            want = "a string or an array of strings"
        got = _TYPE_NAMES.get(expected.group(2), expected.group(2))
        if field == "input" and path != "input" and expected.group(2) in ("int", "array"):
            return invalid(
                "input must be a string or an array of strings; token-id arrays are not supported, send text",
                param="input",
                code="invalid_type",
            )
        return invalid(f"{path} must be {want}, got {got}", param=field, code="invalid_type")
    if "Invalid enum value" in detail or "Invalid value" in detail:
        return invalid(f"{path}: {detail.strip()}", param=field, code="invalid_type")
    return invalid(f"invalid request body: {message}", param=field, code="invalid_type")


def _from_validation(exc: ValidationException) -> APIError:
    """Litestar's own validation errors (a backstop: bodies are decoded strictly first, service.decoding)."""
    details = exc.extra if isinstance(exc.extra, list) else []
    messages = [str(d.get("message", d)) if isinstance(d, dict) else str(d) for d in details] or [str(exc.detail)]
    return validation_error(messages[0])


def body_too_large() -> APIError:
    """A body over ``max_body_bytes``: sent directly (Litestar refuses it before it is read) or as a batch line."""
    return APIError(
        413,
        "the request body is larger than this server's max_body_bytes (EMBEDRANK_MAX_BODY_BYTES); "
        "send the texts in several smaller requests",
        code="body_too_large",
    )


def to_api_error(exc: Exception, allowed_methods: str = "") -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EmbedrankError):
        return _from_core(exc)
    if isinstance(exc, StoreError):
        if exc.public_message is not None:  # the client reads the declared message; the log, what happened
            logger.warning("%s: %s", exc.public_message, exc)
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
        return APIError(exc.status, exc.public(), type=exc.type, param=exc.param, code=exc.code, headers=headers)
    if isinstance(exc, ValidationException):
        return _from_validation(exc)
    if isinstance(exc, SerializationException):
        return invalid(f"request body is not valid JSON: {exc.detail}", code="invalid_json")
    if isinstance(exc, NotAuthorizedException):
        return APIError(
            401, exc.detail, type="authentication_error", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
        )
    if isinstance(exc, MethodNotAllowedException):
        return APIError(
            405,
            f"method not allowed on this route; allowed: {allowed_methods or 'see /openapi.json'}",
            code="method_not_allowed",
            headers={"Allow": allowed_methods} if allowed_methods else {},
        )
    if isinstance(exc, NotFoundException):
        return APIError(404, "no such route", code="not_found")
    if isinstance(exc, InternalServerException) and exc.detail == "client disconnected prematurely":
        return APIError(499, "client closed the connection before sending the whole body", code="client_closed_request")
    if isinstance(exc, HTTPException) and exc.status_code == 413:
        return body_too_large()
    if isinstance(exc, HTTPException) and exc.status_code < 500:
        code = {413: "body_too_large", 415: "unsupported_media_type"}.get(exc.status_code, "invalid_request")
        cause = exc.__cause__.__cause__ if isinstance(exc.__cause__, SerializationException) else exc.__cause__
        if (
            exc.status_code == 400
            and isinstance(cause, msgspec.DecodeError)
            and not isinstance(cause, msgspec.ValidationError)
        ):
            return invalid(f"request body is not valid JSON: {exc.detail}", code="invalid_json")
        return APIError(exc.status_code, str(exc.detail), code=code, headers=dict(exc.headers or {}))
    return APIError(500, "internal error; see the server log", type="server_error", code="internal_error")


def error_body(error: APIError, request_id: str) -> dict[str, Any]:
    """The OpenAI error body of ``error``, with the request's id: a direct answer's and a batch line's."""
    fields = {"message": error.message, "type": error.type, "param": error.param, "code": error.code}
    return {"error": {**fields, "request_id": request_id}}


def is_unexpected(error: APIError) -> bool:
    """Whether ``error`` is the server's own fault (a 5xx other than 503): logged with its traceback."""
    return error.status >= HTTP_500_INTERNAL_SERVER_ERROR and error.status != 503


def error_response(error: APIError, request_id: str) -> Response[Any]:
    """The error body, with the request's id (also in the ``x-request-id`` header)."""
    headers = {**error.headers, request_ids.HEADER.decode(): request_id}
    return Response(
        content=error_body(error, request_id), status_code=error.status, headers=headers, media_type=MediaType.JSON
    )


def matches_route(template: str, path: str) -> bool:
    """Whether ``path`` is an instance of the route ``template`` (``/v1/files/{file_id:str}``).

    >>> matches_route("/v1/files/{file_id:str}/content", "/v1/files/file-1/content"), matches_route("/v1/files", "/v1/files/x")
    (True, False)
    """
    if "{" not in template:
        return template == path
    return _route_pattern(template).fullmatch(path) is not None


@functools.cache
def _route_pattern(template: str) -> re.Pattern[str]:
    """A route template as a regular expression, each path parameter one path segment (built once)."""
    return re.compile(re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(template)))


def allowed_methods(app: Any, path: str) -> list[str]:
    """Every method the routes of ``app`` take at ``path`` (its route's template may hold parameters), sorted."""
    return sorted({m for r in app.routes if matches_route(r.path, path) for m in getattr(r, "methods", ())})


def handle_exception(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """The one place exceptions become HTTP responses."""
    allowed = ""
    if isinstance(exc, MethodNotAllowedException):
        allowed = ", ".join(sorted(set(allowed_methods(request.app, request.url.path)) - {"OPTIONS", "HEAD"}))
    if isinstance(exc, NotFoundException | MethodNotAllowedException):
        # no route ran, so no middleware checked the key: check it here, so that paths and methods cannot
        # be discovered without one
        auth = getattr(getattr(request.app.state, "service", None), "auth", None)
        try:
            if auth is not None:
                auth.check(request.scope)
        except NotAuthorizedException as denied:
            exc = denied
    error = to_api_error(exc, allowed)
    request_id = request_ids.of_scope(request.scope)  # a path that is no route has had no middleware
    if is_unexpected(error):
        logger.exception(
            "request %s: internal error on %s %s", request_id, request.method, request.url.path, exc_info=exc
        )
    elif error.status == 499:
        logger.info("request %s: %s %s: %s", request_id, request.method, request.url.path, error.message)
    return error_response(error, request_id)
