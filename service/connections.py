"""A deadline for request headers: slowloris connections are closed, not held forever.

uvicorn (under ``litestar run``) times out keep-alive connections that are idle *after* a response, but a
connection that has not finished sending a request's headers has no deadline: a client that opens
connections and sends a header byte now and then (slowloris), or nothing at all, holds them forever.
:class:`HeaderDeadline` is a watchdog on the server's own connection set: every ``interval`` seconds it
looks at each connection, and one that has been waiting for request headers (no request in progress,
no keep-alive timer running) for longer than ``timeout`` seconds gets a 408 in the error shape and is
closed. Requests whose headers have arrived are not touched: their body has its own timeout (408 from
the app), and their compute is bounded by the engine.

It reads uvicorn's protocol objects (``server_state.connections``, ``cycle``, ``timeout_keep_alive_task``),
which both of its HTTP implementations share; ``tests/test_server_process.py`` checks it against the real
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

logger = logging.getLogger("embedrank.service")


def asgi_server() -> Any | None:
    """The uvicorn ``Server`` running this process (it owns the SIGTERM handler), or None (test clients,
    another ASGI server, or off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return server if hasattr(getattr(server, "server_state", None), "connections") else None


def _response_408(timeout: float) -> bytes:
    body = json.dumps(
        {
            "error": {
                "message": f"the request headers did not arrive within {timeout:g} s",
                "type": "invalid_request_error",
                "param": None,
                "code": "request_timeout",
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


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
                        transport.write(_response_408(self.timeout))
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
