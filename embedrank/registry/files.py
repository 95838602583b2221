"""Reading a model's own files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: Path) -> dict[str, Any] | list[Any] | None:
    """The JSON in ``path``, or None when there is no such file."""
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def read_dict(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; empty when there is no such file or it holds something else."""
    found = read_json(path)
    return found if isinstance(found, dict) else {}
