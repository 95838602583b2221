"""A model's prompts: ``prompts`` and ``default_prompt_name`` of ``config_sentence_transformers.json``."""

from __future__ import annotations

from pathlib import Path

from embedrank.errors import UnsupportedModelError
from embedrank.registry.files import read_json


def read_prompts(root: Path, model_id: str) -> tuple[dict[str, str], str | None]:
    """``prompts`` and ``default_prompt_name`` from ``config_sentence_transformers.json`` (both optional)."""
    cfg = read_json(root / "config_sentence_transformers.json") or {}
    if not isinstance(cfg, dict):
        return {}, None
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise UnsupportedModelError(
            f"model {model_id!r}: prompts in config_sentence_transformers.json must map names to strings"
        )
    default = cfg.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise UnsupportedModelError(
            f"model {model_id!r}: default_prompt_name {default!r} is not one of its prompts {sorted(prompts)}"
        )
    return dict(prompts), default
