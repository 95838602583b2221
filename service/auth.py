"""Bearer-key authentication (SPEC 5) for every route except ``/health``."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from litestar.exceptions import NotAuthorizedException
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

OPEN_PATHS = frozenset({"/health"})


def check_bearer(header: str | None, keys: Iterable[bytes]) -> None:
    """Raise :class:`NotAuthorizedException` unless ``header`` is ``Bearer <one of keys>``.

    Every configured key is compared with ``hmac.compare_digest``; the key itself never appears in
    messages or logs.
    """
    if not header:
        raise NotAuthorizedException("missing Authorization header; send 'Authorization: Bearer <API key>'")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise NotAuthorizedException("malformed Authorization header; expected 'Bearer <API key>'")
    given = token.encode()
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given, key)
    if not matched:
        raise NotAuthorizedException("invalid API key")


class BearerAuthMiddleware(ASGIMiddleware):
    scopes = ("http",)  # type: ignore[assignment]

    def __init__(self, keys: Iterable[str]) -> None:
        self.keys = tuple(k.encode() for k in keys)

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        if scope["path"] not in OPEN_PATHS:
            header = None
            for name, value in scope["headers"]:
                if name == b"authorization":
                    header = value.decode("latin-1")
                    break
            check_bearer(header, self.keys)
        await next_app(scope, receive, send)
