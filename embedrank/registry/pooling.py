"""A sentence-transformers ``Pooling`` module's ``config.json``: how token states become one vector."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from embedrank.errors import UnsupportedModelError
from embedrank.math.pooling import PoolingMode
from embedrank.registry.files import read_dict

_POOLING_KEYS = {
    "pooling_mode_mean_tokens": PoolingMode.MEAN,
    "pooling_mode_cls_token": PoolingMode.CLS,
    "pooling_mode_max_tokens": PoolingMode.MAX,
    "pooling_mode_lasttoken": PoolingMode.LAST_TOKEN,
    "pooling_mode_mean_sqrt_len_tokens": PoolingMode.MEAN_SQRT_LEN,
}


@dataclasses.dataclass(frozen=True)
class Pooling:
    """What a ``Pooling`` module says: the mode, the width it pools (None: the config does not say), and
    whether the prompt's tokens are pooled."""

    mode: PoolingMode
    dimension: int | None
    include_prompt: bool


def pooling_mode(cfg: dict[str, Any]) -> PoolingMode:
    """The one pooling mode a ``Pooling`` config names (flags, or the newer single ``pooling_mode`` string).

    >>> pooling_mode({"pooling_mode_cls_token": True}).value, pooling_mode({"pooling_mode": "lasttoken"}).value
    ('cls', 'lasttoken')
    """
    modes = [mode for key, mode in _POOLING_KEYS.items() if cfg.get(key)]
    if "pooling_mode" in cfg:  # newer sentence-transformers write a single string
        name = str(cfg["pooling_mode"]).replace("_tokens", "").replace("_token", "")
        modes = [PoolingMode(name)]
    if len(modes) != 1:
        raise UnsupportedModelError(f"pooling config {cfg} combines {len(modes)} modes; embedrank supports exactly one")
    return modes[0]


def read_pooling(folder: Path, hidden: int | None) -> Pooling:
    """The ``Pooling`` module in ``folder``; ``hidden``: the transformer's width, when the config omits it."""
    cfg = read_dict(folder / "config.json")
    return Pooling(
        pooling_mode(cfg), cfg.get("word_embedding_dimension", hidden), cfg.get("include_prompt", True) is not False
    )
