"""Request ids: every request gets one, to tie a client's report, an error body and a log line together.

The id is the client's ``X-Request-Id`` when it is well-formed (1 to 128 of ``A-Z a-z 0-9 . _ : / + = -``,
starting with a letter or digit), else a new ``req_`` followed by 24 hex digits. It is sent back in the
``x-request-id`` response header of every answer, in the ``request_id`` field of every error body, and
named by every log line the service writes about the request.
"""

from __future__ import annotations

import re
import secrets
from contextvars import ContextVar
from typing import Any

HEADER = b"x-request-id"
_WELL_FORMED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+=-]{0,127}")
CURRENT: ContextVar[str | None] = ContextVar("embedrank_request_id", default=None)


def new_id() -> str:
    """A fresh id.

    >>> len(new_id()), new_id().startswith("req_")
    (28, True)
    """
    return "req_" + secrets.token_hex(12)


def well_formed(value: str) -> bool:
    """Whether a client's id is used as given.

    >>> well_formed("3f2a-17:retry/2"), well_formed(""), well_formed("a b"), well_formed("x" * 129)
    (True, False, False, False)
    """
    return _WELL_FORMED.fullmatch(value) is not None


def of_scope(scope: Any) -> str:
    """The request's id, chosen once per request and kept in its ASGI scope's state."""
    state = scope.setdefault("state", {})
    found = state.get("request_id")
    if found is None:
        given = next((v for k, v in scope.get("headers", ()) if k == HEADER), None)
        text = given.decode("latin-1") if given is not None else ""
        found = state["request_id"] = text if well_formed(text) else new_id()
    return str(found)
