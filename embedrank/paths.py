"""Where embedrank keeps its files and finds data: the cache directory and the BEIR data directory.

Both live below every layer that needs them (model exports, embedding cache, data loading, training).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

CACHE_ENV = "EMBEDRANK_CACHE"
DATA_ENV = "EMBEDRANK_DATA"


def default_cache_dir() -> Path:
    """``$EMBEDRANK_CACHE``, else ``$XDG_CACHE_HOME/embedrank`` (``~/.cache/embedrank``)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "embedrank"


def default_data_dir() -> Path:
    """Where collections are looked up by name: ``$EMBEDRANK_DATA``, else the user's data directory,
    ``$XDG_DATA_HOME/embedrank`` (``~/.local/share/embedrank``). It may not exist yet."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "embedrank"


_PARTIAL: set[Path] = set()  # temporary files and folders being written, until renamed into place or removed
_PARTIAL_LOCK = threading.Lock()


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[Path]:
    """Mark ``path`` (a temporary file or folder that will be renamed into place) as being written, so that a
    process told to stop at once can remove it (:func:`remove_unfinished`) instead of leaving it behind."""
    path = Path(path)
    with _PARTIAL_LOCK:
        _PARTIAL.add(path)
    try:
        yield path
    finally:
        with _PARTIAL_LOCK:
            _PARTIAL.discard(path)


def remove_unfinished() -> list[Path]:
    """Remove every file and folder :func:`writing` marks as still being written; returns them. For a process
    that exits without waiting for the threads that write them."""
    with _PARTIAL_LOCK:
        found = sorted(_PARTIAL)
        _PARTIAL.clear()
    for path in found:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return found


def build_lock(target: Path) -> contextlib.AbstractContextManager[object]:
    """A lock that the processes of this machine building ``target`` take turns on: a file in the temporary
    directory (a folder per user) named by a digest of ``target``'s absolute path."""
    from filelock import FileLock

    uid = getattr(os, "getuid", lambda: 0)()  # one folder per user: another user's is not writable
    locks = Path(tempfile.gettempdir()) / f"embedrank-locks-{uid}"
    locks.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(str(Path(target).resolve()).encode()).hexdigest()[:32]
    return FileLock(locks / f"{digest}.lock")


def build_directory(target: str | Path, build: Callable[[Path], object], *, done: str = "config.json") -> str:
    """Build a directory at ``target`` by calling ``build`` on an empty temporary folder beside it, then
    renaming that into place, so concurrent processes never see half of it; returns ``target``. Processes that
    build the same ``target`` at once (replicas starting together on a shared cache, parallel test workers)
    take turns on a lock file beside it: the first builds, the others find its result (a folder with the file
    ``done``) and keep it, instead of each building it again (processes of one machine: the lock files live in
    its temporary directory, :func:`build_lock`, so that the cache holds only what was built)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(target):
        if (target / done).is_file():
            return str(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            with writing(tmp):
                build(tmp)
                if target.exists() and not any(target.iterdir()):
                    target.rmdir()
                try:
                    os.rename(tmp, target)
                except OSError:  # a non-empty folder we must not replace (or a lock the file system ignores)
                    if not (target / done).is_file():
                        raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)
