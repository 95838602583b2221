"""Where embedrank keeps its files and finds data: the cache directory and the BEIR data directory.

Both live below every layer that needs them (model exports, embedding cache, data loading, training).
"""

from __future__ import annotations

import os
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


def default_data_dir() -> Path | None:
    """``$EMBEDRANK_DATA``, else ``../shared/data`` next to the repo checkout, else None."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    guess = Path(__file__).resolve().parents[2] / "shared" / "data"
    return guess if guess.is_dir() else None
