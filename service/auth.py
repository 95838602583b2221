"""Bearer-key authentication for every route except ``/health`` (and the API's description and its pages,
``/openapi.json`` and ``/docs``, unless the ``public_docs`` setting is off), and for paths that are no route: without a
valid key, an unknown path is a 401 like a known one, so routes cannot be discovered without a key. CORS
preflights (``OPTIONS``), which browsers send without credentials, are open only when CORS is on; with CORS
off, ``OPTIONS`` needs the key like every other method."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Any

from litestar import Request
from litestar.exceptions import NotAuthorizedException
from litestar.types import Scope

OPEN_PATHS = frozenset({"/health"})  # and CORS preflights (OPTIONS) when CORS is on


def check_bearer(header: str | None, keys: Iterable[bytes]) -> str:
    """The key of ``header``; :class:`NotAuthorizedException` unless it is ``Bearer <one of keys>``.

    The scheme name is case-insensitive (RFC 7235); scheme and key are separated by exactly one space and
    the key holds no whitespace (RFC 6750's ``Bearer SP b64token``), so ``Bearer  key`` is malformed, not
    quietly trimmed. Every configured key is compared with ``hmac.compare_digest``; the key itself never
    appears in messages or logs.
    """
    if not header:
        raise NotAuthorizedException("missing Authorization header; send 'Authorization: Bearer <API key>'")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
        raise NotAuthorizedException("malformed Authorization header; expected 'Bearer <API key>'")
    given = token.encode()
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given, key)
    if not matched:
        raise NotAuthorizedException("invalid API key")
    return token


class BearerAuth:
    """The configured keys, checked against a request's ``Authorization`` header (not on ``open_paths``)."""

    def __init__(
        self, keys: Iterable[str], *, open_preflights: bool = False, open_paths: Iterable[str] = OPEN_PATHS
    ) -> None:
        self.keys = tuple(k.encode() for k in keys)
        self.open_preflights = open_preflights  # CORS on: browsers send preflights without credentials
        self.open_paths = frozenset(open_paths) | OPEN_PATHS  # /health always; the API's pages when public

    def check(self, scope: Scope) -> None:
        """Raise :class:`NotAuthorizedException` unless the request may pass."""
        if scope["path"] in self.open_paths or (self.open_preflights and scope.get("method") == "OPTIONS"):
            return
        header = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"authorization"), None)
        key = check_bearer(header, self.keys)
        scope.setdefault("state", {})[OWNER] = key_owner(key)


OWNER = "embedrank_owner"


def key_owner(key: str | None) -> str:
    """The owner an API key's objects are stored under: a digest of the key (``anonymous`` for None, when
    authentication is off)."""
    return hashlib.sha256(key.encode()).hexdigest()[:32] if key is not None else "anonymous"


"""Where :meth:`BearerAuth.check` leaves, in a request's scope state, who the request acts for."""


def owner_of(request: Request[Any, Any, Any]) -> str:
    """Who a request acts for, as the auth layer found it: a digest of its API key (the Batch API's files and
    batches belong to it); ``anonymous`` when authentication is off."""
    return str(request.scope.get("state", {}).get(OWNER, "anonymous"))
