"""Start a throwaway PostgreSQL server from the machine's own binaries (Debian's ``postgresql`` package, or any
``initdb`` and ``pg_ctl`` on ``PATH``), for tests and benchmarks of the Batch API's shared store.

The server refuses to run as root: run as root, its folder is handed to the ``postgres`` user and every
command runs as that user (``runuser``). It listens on a free loopback port with trust authentication
(nothing else can reach it) and is stopped, its folder removed, when the block ends.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


def postgres_bindir() -> Path | None:
    """The folder of the newest PostgreSQL server binaries on this machine (Debian's
    ``/usr/lib/postgresql/<version>/bin``, else ``initdb`` on ``PATH``); None when there are none."""
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if versions:
        return Path(versions[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_postgres(
    *, fsync: bool = False, bindir: Path | None = None, settings: dict[str, str] | None = None
) -> Iterator[str]:
    """A PostgreSQL server for the block; yields its URL (``postgresql://postgres@127.0.0.1:<port>/postgres``).

    ``fsync=False`` (the default) skips syncing to disk: a test of concurrency, not of the disk, runs faster.
    ``bindir``: the server binaries to run (default :func:`postgres_bindir`); ``settings``: server settings
    (``{"shared_buffers": "1GB"}``).

    Raises:
        FileNotFoundError: the machine has no PostgreSQL server binaries.
        RuntimeError: the server did not start (its log is in the message).
    """
    bindir = bindir or postgres_bindir()
    if bindir is None:
        raise FileNotFoundError(
            "no PostgreSQL server binaries (initdb, pg_ctl); install them (Debian: apt-get install postgresql) or put initdb on PATH"
        )
    root = Path(tempfile.mkdtemp(prefix="embedrank-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses root: the folder is postgres's, every command runs as postgres
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, log = root / "data", root / "server.log"
    port = _free_port()

    def run(*args: str) -> None:
        done = subprocess.run([*as_user, *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            server_log = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr[-2000:]}\n{server_log}")

    try:
        run(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync={'on' if fsync else 'off'}"
        options += "".join(f" -c {name}={value}" for name, value in (settings or {}).items())
        run(str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(log), "-w", "-t", "60", "start")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)
