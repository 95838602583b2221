"""Graceful shutdown on SIGTERM: readiness fails first, the work in flight finishes, the process exits 0.

The ASGI server (uvicorn, under ``litestar run``) handles SIGTERM by closing idle connections at once and
then waiting, without a deadline, for the requests in flight; afterwards it raises the signal again, so
the process dies with -15. :func:`install` puts a handler in front of the server's, from the lifespan:

1. ``/health`` and every new request answer 503 at once (``status = "draining"``), on connections that
   are already open too, so a load balancer stops sending work while the answers in flight go out;
2. the batching engines refuse new jobs and finish the queued ones, for at most ``drain_seconds``;
3. the server's own handler then runs, with its graceful-shutdown timeout set to what is left of
   ``drain_seconds`` (at least 1 s), so no connection (a half-sent body, a slow client) keeps the process
   alive past the deadline; a request body that stalls is also cut by the body timeout (408);
4. the re-raise of SIGTERM is dropped: a completed graceful shutdown exits with code 0.

A second SIGTERM or SIGINT goes straight to the server's handler. Outside the main thread (test clients)
nothing is installed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

logger = logging.getLogger("embedrank.service")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class InFlight:
    """Counts HTTP requests in progress (the middleware enters and exits it) so a drain can wait for them."""

    def __init__(self) -> None:
        self.count = 0
        self._idle: asyncio.Event | None = None

    def enter(self) -> None:
        self.count += 1

    def exit(self) -> None:
        self.count -= 1
        if self.count == 0 and self._idle is not None:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in progress, for at most ``timeout`` seconds; True if that happened."""
        if self.count == 0:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True


def _forward(handler: Any, sig: int, frame: FrameType | None) -> None:
    if callable(handler):
        handler(sig, frame)
    elif handler == signal.SIG_DFL:
        signal.signal(sig, signal.SIG_DFL)
        signal.raise_signal(sig)


def install(on_drain: Callable[[int], None], drain: Callable[[float], Awaitable[None]], drain_seconds: float) -> bool:
    """Chain the handler described in the module docstring in front of the current ones.

    ``on_drain(signal)`` marks the service as draining (called in the signal handler), ``drain(timeout)``
    finishes the work in flight. Returns False (and installs nothing) off the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    loop = asyncio.get_running_loop()
    previous: dict[int, Any] = {int(sig): signal.getsignal(sig) for sig in SIGNALS}
    started: list[int] = []
    tasks: set[asyncio.Task[None]] = set()  # keep a reference until done

    def spawn(sig: int, frame: FrameType | None, since: float) -> None:
        task = loop.create_task(drain_then_stop(sig, frame, since))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def drain_then_stop(sig: int, frame: FrameType | None, since: float) -> None:
        try:
            await drain(drain_seconds)
        except Exception:  # the server must stop even if draining failed
            logger.exception("draining failed")
        server = getattr(previous[sig], "__self__", None)
        config = getattr(server, "config", None)
        if config is not None and hasattr(config, "timeout_graceful_shutdown"):
            config.timeout_graceful_shutdown = max(1.0, drain_seconds - (time.monotonic() - since))
        _forward(previous[sig], sig, frame)
        captured = getattr(server, "_captured_signals", None)
        if sig == signal.SIGTERM and isinstance(captured, list):
            captured[:] = [s for s in captured if s != signal.SIGTERM]  # graceful: exit 0, not -15

    def handler(sig: int, frame: FrameType | None) -> None:
        if started:  # a second signal: let the server act on it now
            _forward(previous[sig], sig, frame)
            return
        started.append(sig)
        logger.info("%s: draining (up to %.0f s), then stopping", signal.Signals(sig).name, drain_seconds)
        on_drain(sig)
        since = time.monotonic()
        loop.call_soon_threadsafe(spawn, sig, frame, since)

    for sig in SIGNALS:
        signal.signal(sig, handler)
    return True
