"""The HTTP connections under the app: a deadline for request headers, and errors in the API's shape.

**Header deadline.**

uvicorn (under ``litestar run``) times out keep-alive connections that are idle *after* a response, but a
connection that has not finished sending a request's headers has no deadline: a client that opens
connections and sends a header byte now and then (slowloris), or nothing at all, holds them forever.
:class:`HeaderDeadline` is a watchdog on the server's own connection set: every ``interval`` seconds it
looks at each connection, and one that has been waiting for request headers (no request in progress,
no keep-alive timer running) for longer than ``timeout`` seconds gets a 408 in the error shape and is
closed. Requests whose headers have arrived are not touched: their body has its own timeout (408 from
the app), and their compute is bounded by the engine.

**Parse errors.** uvicorn answers a request it cannot parse (a malformed request line or header, a bad
``Content-Length`` or chunk size, both ``Content-Length`` and ``Transfer-Encoding``) with a plain-text 400
before any app code runs. :func:`json_parse_errors` makes the server's protocol class answer them in the
API's error shape instead (400, ``code: "invalid_http"``, then the connection is closed, as before).

Both read uvicorn's protocol objects (``server_state.connections``, ``cycle``, ``timeout_keep_alive_task``),
which both of its HTTP implementations share; ``tests/service/test_service_process.py`` checks it against the real
server, so an upgrade that changes them is caught.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import threading
import time
import weakref
from typing import Any

from service import request_ids

logger = logging.getLogger("embedrank.service")


def asgi_server() -> Any | None:
    """The uvicorn ``Server`` running this process (it owns the SIGTERM handler), or None (test clients,
    another ASGI server, or off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return server if hasattr(getattr(server, "server_state", None), "connections") else None


def error_bytes(status: int, reason: str, message: str, code: str, headers: Any = ()) -> bytes:
    """A complete HTTP/1.1 response in the API's error shape that closes the connection; ``headers`` are
    ``(name, value)`` byte pairs sent first (the server's ``date`` and ``server``).

    >>> error_bytes(408, "Request Timeout", "late", "request_timeout").split(b"\\r\\n")[0]
    b'HTTP/1.1 408 Request Timeout'
    """
    request_id = request_ids.new_id()  # the server answers before any request is parsed: a fresh id
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code, "request_id": request_id}
    body = json.dumps({"error": error}).encode()
    headers = [*headers, (request_ids.HEADER, request_id.encode())]
    extra = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    head = f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    return f"HTTP/1.1 {status} {reason}\r\n".encode() + extra + head.encode() + body


def json_parse_errors(server: Any) -> None:
    """Make ``server`` (a uvicorn ``Server``) answer requests it cannot parse in the API's error shape.

    uvicorn builds each connection's protocol from ``server.config.http_protocol_class`` when the
    connection is made, so replacing it during the app's startup covers every connection."""
    base = server.config.http_protocol_class
    if getattr(base, "json_parse_errors", False):
        return

    def send_400_response(self: Any, msg: str) -> None:
        detail = msg.rstrip(".").lower() or "invalid HTTP request received"
        message = f"the request is not valid HTTP/1.1 ({detail}): check its request line, headers and body framing"
        headers = getattr(getattr(self, "server_state", None), "default_headers", ())
        self.transport.write(error_bytes(400, "Bad Request", message, "invalid_http", headers))
        self.transport.close()

    server.config.http_protocol_class = type(
        base.__name__, (base,), {"send_400_response": send_400_response, "json_parse_errors": True}
    )


class HeaderDeadline:
    """Close connections that wait for request headers longer than ``timeout`` seconds (see module doc)."""

    def __init__(self, server: Any, timeout: float, *, interval: float = 1.0) -> None:
        self.server = server
        self.timeout = timeout
        self.interval = min(interval, timeout)
        self.closed = 0  # connections closed so far
        self._since: weakref.WeakKeyDictionary[Any, tuple[int, float]] = weakref.WeakKeyDictionary()
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def waiting_for_headers(protocol: Any) -> bool:
        cycle = getattr(protocol, "cycle", None)
        idle = cycle is None or getattr(cycle, "response_complete", False)
        return idle and getattr(protocol, "timeout_keep_alive_task", None) is None

    def sweep(self, now: float) -> None:
        """One pass over the connections: start, keep or reset each one's clock; close the late ones."""
        for protocol in list(self.server.server_state.connections):
            if not self.waiting_for_headers(protocol):
                self._since.pop(protocol, None)
                continue
            marker = id(getattr(protocol, "cycle", None))  # a new request cycle restarts the clock
            first = self._since.get(protocol)
            if first is None or first[0] != marker:
                self._since[protocol] = (marker, now)
            elif now - first[1] > self.timeout:
                transport = getattr(protocol, "transport", None)
                if transport is not None and not transport.is_closing():
                    with contextlib.suppress(Exception):
                        transport.write(
                            error_bytes(
                                408,
                                "Request Timeout",
                                f"the request headers did not arrive within {self.timeout:g} s",
                                "request_timeout",
                            )
                        )
                    transport.close()
                    self.closed += 1
                    logger.info("closed a connection that sent no complete request headers in %g s", self.timeout)
                self._since.pop(protocol, None)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.sweep(time.monotonic())

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
