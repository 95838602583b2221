"""A replica's processes started, watched and stopped (see :mod:`service.replica`).

- The listening socket is bound here, once, and inherited by every front; the engine process listens on a Unix
  socket in a folder only this user can enter.
- A front that exits (a crash, the OOM killer, or its engine process came back serving other models) is started
  again at once, then after 1, 2, 4 ... up to 30 s while it keeps exiting within a minute of its start.
- The engine process that exits is started again after 1 s, then 2, 4 ... up to 30 s while it keeps exiting within
  a minute; meanwhile the fronts answer 503 with Retry-After (``/health`` too).
- A process that cannot start (exit code 3: a setting, a model that cannot be found or loaded) stops the replica
  with code 3, as a one-process server would.
- SIGTERM or SIGINT: the fronts drain first (their requests in flight finish on the engine, new ones get 503), then
  the engine process finishes its queued work; each gets ``drain_seconds`` and a few seconds more before it is
  killed. The replica exits 0 on SIGTERM, 130 on SIGINT. Every child is killed with the replica if the replica
  itself is killed (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from service import process
from service.replica import ENGINE_SOCKET_ENV

logger = logging.getLogger("embedrank.service")
PR_SET_PDEATHSIG = 1
WATCH_SECONDS = 0.1  # how often the children are looked at
STOP_MARGIN_SECONDS = 5.0  # beyond drain_seconds, before a child that has not stopped is killed
# before each start again of a process that keeps exiting: a front's first is at once, an engine process's after 1 s
BACKOFF = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
SETTLED_SECONDS = 60.0  # a process up this long that exits counts as a first failure again


def _die_with_parent() -> None:
    """In a child, before it runs: be killed when the replica's process ends, however it ends (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def listening_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """The replica's socket, bound and listening, inheritable by the fronts (as uvicorn binds it).

    Raises:
        OSError: the address is in use or cannot be bound; said for a reader.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another port (--port)") from None
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


@dataclass
class Child:
    """One process of the replica: what starts it, the running process, and how often it was started."""

    name: str
    command: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...] = ()
    popen: subprocess.Popen[bytes] | None = None
    first_wait: int = 0  # where in BACKOFF its first start again waits
    started_at: float = 0.0
    failures: int = 0  # exits in a row, each before it stayed up SETTLED_SECONDS
    restart_at: float | None = None  # when to start it again, once it exited
    starts: int = field(default=0)

    def start(self) -> None:
        # its own process group: a terminal's Ctrl+C reaches the replica's process, which stops the others in order
        self.popen = subprocess.Popen(
            self.command,
            env=self.env,
            pass_fds=self.pass_fds,
            preexec_fn=_die_with_parent,
            close_fds=True,
            process_group=0,
        )
        self.started_at = time.monotonic()
        self.restart_at = None
        self.starts += 1
        logger.info("replica: %s started (pid %d)", self.name, self.popen.pid)

    def exited(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def schedule_restart(self, now: float) -> float:
        """Set when it starts again (later each time it exits soon after starting); the wait in seconds."""
        self.failures = 0 if now - self.started_at >= SETTLED_SECONDS else self.failures + 1
        wait = BACKOFF[min(self.first_wait + self.failures, len(BACKOFF) - 1)]
        self.restart_at = now + wait
        return wait

    def due(self, now: float) -> bool:
        return self.restart_at is not None and now >= self.restart_at

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def wait(self, deadline: float) -> None:
        """Wait for it until ``deadline`` (monotonic), then kill it."""
        if self.popen is None:
            return
        try:
            self.popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("replica: %s did not stop in time: killed", self.name)
            self.popen.kill()
            self.popen.wait()


class Replica:
    """The engine process and ``fronts`` front processes on ``host``:``port`` (:meth:`run`)."""

    def __init__(self, host: str, port: int, fronts: int, *, drain_seconds: float, log_level: str = "info") -> None:
        if fronts < 1:
            raise ValueError("a replica of processes has at least one front")
        self.host, self.port, self.fronts = host, port, fronts
        self.drain_seconds = drain_seconds
        self.log_level = log_level
        self.signals: list[int] = []

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT (the exit code then: 0 or 130), or until a process cannot start (3)."""
        sock = listening_socket(self.host, self.port)
        folder = tempfile.mkdtemp(prefix="embedrank-replica-")  # 0700: only this user reaches the engine
        path = os.path.join(folder, "engine.sock")
        env = {k: v for k, v in os.environ.items() if k != ENGINE_SOCKET_ENV}
        env["EMBEDRANK_FRONTS"] = str(self.fronts)  # every process's settings say how many fronts the replica has
        engine_command = [sys.executable, "-m", "service.replica.engine", "--socket", path]
        engine = Child("engine process", engine_command, dict(env), first_wait=1)
        front_command = [sys.executable, "-m", "service.replica.front", "--fd", str(sock.fileno())]
        front_command += ["--log-level", self.log_level]
        fronts = [
            Child(f"front {i + 1}", front_command, {**env, ENGINE_SOCKET_ENV: path}, (sock.fileno(),))
            for i in range(self.fronts)
        ]
        previous = {sig: signal.signal(sig, self._asked_to_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            engine.start()
            for front in fronts:
                front.start()
            logger.info("replica: %d front(s) and an engine process on http://%s:%d", self.fronts, self.host, self.port)
            code = self._watch(engine, fronts)
            self._stop(engine, fronts)
            return code
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    def _asked_to_stop(self, sig: int, frame: object) -> None:
        self.signals.append(sig)

    def _watch(self, engine: Child, fronts: list[Child]) -> int:
        """Keep the processes up until asked to stop (the exit code for that) or one cannot start (3)."""
        while not self.signals:
            now = time.monotonic()
            for child in (engine, *fronts):
                code = child.exited()
                if code is not None and child.restart_at is None:
                    if code == process.EXIT_STARTUP_FAILURE:
                        logger.error("replica: %s cannot start (exit code 3): stopping", child.name)
                        return process.EXIT_STARTUP_FAILURE
                    wait = child.schedule_restart(now)
                    logger.error("replica: %s exited (code %s): starting it again in %.0f s", child.name, code, wait)
                if child.due(now):
                    child.start()
            time.sleep(WATCH_SECONDS)
        return process.exit_code(self.signals[0])

    def _stop(self, engine: Child, fronts: list[Child]) -> None:
        """The fronts drain, then the engine process finishes its queue; what outlives its time is killed."""
        sig = signal.SIGINT if self.signals[:1] == [signal.SIGINT] else signal.SIGTERM
        for front in fronts:
            front.signal(sig)
        deadline = time.monotonic() + self.drain_seconds + STOP_MARGIN_SECONDS
        for front in fronts:
            front.wait(deadline)
        engine.signal(sig)
        engine.wait(time.monotonic() + self.drain_seconds + STOP_MARGIN_SECONDS)


def main(argv: list[str] | None = None) -> int:
    """``python -m service.replica.supervisor``: what ``python -m service`` becomes once it has read the settings
    (it replaces itself with this lighter process, which imports neither the models nor the web app)."""
    parser = argparse.ArgumentParser(prog="python -m service.replica.supervisor", description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fronts", type=int, required=True)
    parser.add_argument("--drain-seconds", type=float, required=True)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, format="%(levelname)s:     %(message)s", level=args.log_level.upper())
    try:
        return Replica(
            args.host, args.port, args.fronts, drain_seconds=args.drain_seconds, log_level=args.log_level
        ).run()
    except OSError as exc:  # the port is taken
        process.fail_to_start(exc)


if __name__ == "__main__":
    sys.exit(main())
