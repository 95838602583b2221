"""The service as a process: what it says and which code it exits with when it cannot start, and an exit
that no busy worker thread holds up.

- A start-up failure (a setting that cannot be read, a model that cannot be found or loaded, a port in use)
  is one line on stderr, ``embedrank: cannot start: <reason>``, and exit code 3 (uvicorn's own code for an
  application that failed to start), as TEI and vLLM exit; ``EMBEDRANK_LOG_LEVEL=debug`` adds the traceback.
- Once told to stop, the process does not wait for a thread that is still loading weights, exporting a
  model or finishing a batch step: :func:`exit_soon` gives the normal exit :data:`EXIT_GRACE_SECONDS`, then
  removes the files those threads had not finished (:func:`embedrank.paths.remove_unfinished`; everything
  else is written whole or not at all) and exits.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, NoReturn

from embedrank.paths import remove_unfinished

if TYPE_CHECKING:
    from service.settings import Settings

EXIT_STARTUP_FAILURE = 3
EXIT_RESTART = 75  # EX_TEMPFAIL: a replica's front asks to be started again (its engine process changed)
EXIT_GRACE_SECONDS = 0.5
LOG_LEVEL_ENV = "EMBEDRANK_LOG_LEVEL"
logger = logging.getLogger("embedrank.service")


def debugging() -> bool:
    """Whether ``EMBEDRANK_LOG_LEVEL`` asks for debug output (read before the settings are: they may be what
    failed)."""
    return os.environ.get(LOG_LEVEL_ENV, "").strip().lower() == "debug"


def failure_line(exc: BaseException) -> str:
    """One line that says why the service cannot start.

    >>> failure_line(ValueError("model 'x' not found;\\ntried: here"))
    "embedrank: cannot start: model 'x' not found; tried: here"
    >>> failure_line(RuntimeError("boom"))
    'embedrank: cannot start: RuntimeError: boom'
    """
    from embedrank.errors import EmbedrankError

    text = " ".join(str(exc).split()) or type(exc).__name__
    ours = isinstance(exc, EmbedrankError | ValueError | OSError)  # a reason already written for a reader
    return f"embedrank: cannot start: {text if ours else f'{type(exc).__name__}: {text}'}"


def _say(exc: BaseException, debug: bool) -> None:
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    print(failure_line(exc), file=sys.stderr, flush=True)


def fail_to_start(exc: BaseException) -> NoReturn:
    """Say why in one line and exit with code 3; for failures before the server runs (the app factory, where
    the settings may be what failed: the traceback follows ``EMBEDRANK_LOG_LEVEL`` as set)."""
    _say(exc, debugging())
    raise SystemExit(EXIT_STARTUP_FAILURE)


def settings_or_exit() -> Settings:
    """The settings of the environment (:meth:`~service.settings.Settings.from_env`) for a process's entry point;
    one that cannot be read is one line and exit code 3 (:func:`fail_to_start`)."""
    from service.settings import Settings

    try:
        return Settings.from_env()
    except Exception as exc:
        fail_to_start(exc)


def exit_now(code: int) -> NoReturn:
    """Remove the files still being written, flush the logs and streams, and end the process with ``code``
    at once (no thread is waited for)."""
    remove_unfinished()
    for handler in logging.getLogger().handlers + logging.getLogger("embedrank").handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def failed_while_serving(exc: BaseException, *, debug: bool) -> NoReturn:
    """A start-up failure once the server runs (a model failed to load): one line (``debug``: and the
    traceback), exit code 3 now."""
    _say(exc, debug)
    exit_now(EXIT_STARTUP_FAILURE)


def exit_soon(code: int, grace: float = EXIT_GRACE_SECONDS) -> None:
    """Let the process end normally; if it has not after ``grace`` seconds (a thread that still loads,
    exports or writes would be waited for), end it with ``code`` (see :func:`exit_now`)."""

    def watch() -> None:
        time.sleep(grace)
        busy = [t.name for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not main]
        logger.info("stopping without waiting for %s", ", ".join(busy) or "the interpreter")
        exit_now(code)

    main = threading.main_thread()
    threading.Thread(target=watch, name="embedrank-exit", daemon=True).start()


def can_listen(config: Any) -> OSError | None:
    """Whether the address a uvicorn ``config`` will listen on is free: None if so (or if the server is handed
    its socket: ``--fd``, ``--uds``, several workers, reload), else the error binding it gives, said for a
    reader. Checked before the models load, so a port in use fails the start in a second, not after loading."""
    if getattr(config, "fd", None) is not None or getattr(config, "uds", None):
        return None
    if getattr(config, "workers", 1) > 1 or getattr(config, "should_reload", False):
        return None  # the supervising process has bound the address and hands its socket to this one
    host, port = str(getattr(config, "host", "127.0.0.1")), int(getattr(config, "port", 8000))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            return OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another port (--port)")
    return None


def exit_code(sig: int | None) -> int:
    """The exit code of a stop asked for by ``sig``: 0 for SIGTERM (a graceful stop), 128 + the number for
    another signal (130 for SIGINT), as a shell reports a process it interrupted."""
    return 0 if sig in (None, signal.SIGTERM) else 128 + int(sig)
