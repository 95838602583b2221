"""A sentence-transformers ``Router`` (``modules.json`` starts with one; ``router_config.json`` names its
branches, what sentence-transformers calls routes): the modules of one branch, each branch described as a
model of its own (:mod:`embedrank.models.router` loads and picks them)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from embedrank.errors import UnsupportedModelError
from embedrank.registry.files import read_json


def is_router(modules: Any) -> bool:
    """``modules.json`` starts with a ``Router``."""
    return (
        isinstance(modules, list)
        and bool(modules)
        and isinstance(modules[0], dict)
        and str(modules[0].get("type", "")).endswith("Router")
    )


@dataclasses.dataclass(frozen=True)
class Branch:
    """One branch of a Router: its name, every branch's name, the folder its first module is in (its
    transformer, or its static embedding) and its modules with folders relative to that one."""

    name: str
    names: tuple[str, ...]
    folder: Path
    modules: list[dict[str, Any]]


def read_branch(path: str, modules: list[Any], model_id: str, branch: str | None) -> Branch:
    """The branch ``branch`` (None: the default one, else the first) of the Router in ``path``, with the
    modules after the Router that every branch shares.

    Raises:
        UnsupportedModelError: no such branch, or no readable ``router_config.json``.
    """
    router: Any = read_json(Path(path) / "router_config.json")
    try:
        names = tuple(router["structure"])
        branch = branch or (router.get("parameters") or {}).get("default_route") or names[0]
        if branch not in names:
            raise UnsupportedModelError(f"model {model_id!r}: no branch {branch!r}; its branches are {list(names)}")
        ids = [str(i) for i in router["structure"][branch]]
        base = Path(path, ids[0])
        listed = [{"type": router["types"][i], "path": os.path.relpath(Path(path, i), base)} for i in ids]
        listed += [{**m, "path": os.path.relpath(Path(path, m.get("path", "")), base)} for m in modules[1:]]
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        raise UnsupportedModelError(
            f"model {model_id!r}: its Router has no readable router_config.json (types, structure, parameters)"
        ) from None
    return Branch(branch, names, base, listed)
