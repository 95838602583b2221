"""Start the service as a subprocess on a free loopback port and wait until it is ready.

Used by the tests, the speed benchmark and the service notebook; a user runs ``litestar run`` instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading  # noqa: F401 - used by the doctest
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]  # the checkout: `litestar run` finds app.py there


class ServerURL(str):
    """The base URL of a started server, with its process id (for reading its memory from ``/proc``) and
    its process (for signals and its exit code)."""

    pid: int
    process: subprocess.Popen[bytes]

    def __reduce__(self) -> tuple[type, tuple[str]]:
        """Pickled (e.g. for a client process) as the plain URL: the process handle stays here.

        >>> import pickle
        >>> url = ServerURL("http://127.0.0.1:8000")
        >>> url.process = threading.Lock()  # anything that cannot be pickled
        >>> pickle.loads(pickle.dumps(url))
        'http://127.0.0.1:8000'
        """
        return str, (str(self),)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def litestar_command(port: int) -> list[str]:
    """``litestar run`` on ``127.0.0.1:port`` with this interpreter's Litestar (run it from :data:`REPO`)."""
    litestar = Path(sys.executable).with_name("litestar")
    return [
        str(litestar) if litestar.exists() else sys.executable,
        *([] if litestar.exists() else ["-m", "litestar"]),
        "run",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def replica_command(port: int, fronts: int) -> list[str]:
    """``python -m service`` on ``127.0.0.1:port`` with ``fronts`` front processes and an engine process."""
    return [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port), "--fronts", str(fronts)]


@contextlib.contextmanager
def running_server(
    env: dict[str, str] | None = None,
    *,
    port: int | None = None,
    timeout: float = 120.0,
    log_path: str | None = None,
    inherit_env: bool = True,
    command: list[str] | None = None,
    cwd: str | Path | None = None,
    fronts: int | None = None,
) -> Iterator[ServerURL]:
    """``litestar run`` from the repo root (Litestar finds ``app.py`` there); yields the base URL once
    ``/health`` is 200 and stops the server on exit. ``env`` adds to this process's environment, or replaces
    it with ``inherit_env=False``. ``command`` starts another server instead (one that listens on ``port``
    and answers ``/health``, such as a peer the benchmarks compare with), in ``cwd``. ``fronts`` starts the service
    as a replica of processes instead (:func:`replica_command`)."""
    port = port or free_port()
    cmd = command or (replica_command(port, fronts) if fronts is not None else litestar_command(port))
    log = open(log_path or os.devnull, "wb")  # noqa: SIM115 - closed below
    child_env = {**os.environ, **(env or {})} if inherit_env else dict(env or {})
    batches = None
    if command is None and not child_env.get("EMBEDRANK_BATCH_DIR"):  # never a user's batches: a folder of its own
        batches = tempfile.mkdtemp(prefix="embedrank-batches-")
        child_env["EMBEDRANK_BATCH_DIR"] = batches
    proc = subprocess.Popen(cmd, cwd=cwd or REPO, env=child_env, stdout=log, stderr=subprocess.STDOUT)
    base = ServerURL(f"http://127.0.0.1:{port}")
    base.pid, base.process = proc.pid, proc
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with code {proc.returncode}; see {log_path or 'its log'}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready after {timeout}s")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        if batches is not None:
            shutil.rmtree(batches, ignore_errors=True)
