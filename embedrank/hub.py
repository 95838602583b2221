"""What to download of a model on the Hugging Face hub, and where the local cache already has it.

:func:`hub_path` looks in the hub cache first, then (unless ``HF_HUB_OFFLINE`` is set) downloads the
configs, the module folders ``modules.json`` names (and the branch folders of a sentence-transformers
``Router``), the weights, and a model's own Python files only when the user trusts its code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from embedrank.errors import ModelNotFoundError

# what a first download fetches: the configs, vocabularies and tokenizer models at the root
_HUB_METADATA = ["*.json", "*.txt", "*.model", "*.tiktoken", "merges.txt"]


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def hub_patterns(modules: Any, files: list[str], *, trust_remote_code: bool = False, router: Any = None) -> list[str]:
    """What to download of a hub model, from its ``modules.json`` (``modules``) and its file list: the
    metadata, every module folder ``modules.json`` names (``2_Dense/``, ...) and every branch module folder
    of a ``Router`` (``router``: its ``router_config.json``), the safetensors weights, else
    ``pytorch_model.bin``, and the ``*.py`` files only when ``trust_remote_code`` is set.

    Examples:
        >>> hub_patterns([{"path": ""}, {"path": "1_Pooling"}, {"path": "2_Dense"}], ["model.safetensors", "x.py"])
        ['*.json', '*.txt', '*.model', '*.tiktoken', 'merges.txt', '1_Pooling/*', '2_Dense/*', '*.safetensors']
        >>> hub_patterns(None, ["pytorch_model.bin"], trust_remote_code=True)[-2:]
        ['pytorch_model.bin', '*.py']
        >>> hub_patterns([{"path": ""}], ["query_0_StaticEmbedding/model.safetensors"], router={"types": {"query_0_StaticEmbedding": "x"}})[-2:]
        ['query_0_StaticEmbedding/*', '*.safetensors']
    """
    patterns = list(_HUB_METADATA)
    if isinstance(modules, list):
        patterns += [f"{m['path'].strip('/')}/*" for m in modules if isinstance(m, dict) and m.get("path")]
    if isinstance(router, dict) and isinstance(router.get("types"), dict):
        patterns += [f"{folder.strip('/')}/*" for folder in router["types"] if folder.strip("/")]
    patterns.append("*.safetensors" if any(f.endswith(".safetensors") for f in files) else "pytorch_model.bin")
    if trust_remote_code:
        patterns.append("*.py")
    return patterns


def hub_path(model_id: str, tried: list[str], trust_remote_code: bool) -> str:
    try:
        from huggingface_hub import HfApi, snapshot_download
        from huggingface_hub.utils import HFValidationError
    except ImportError as exc:  # pragma: no cover - huggingface_hub comes with transformers
        raise ModelNotFoundError(f"model {model_id!r} not found; tried: {', '.join(tried)}") from exc
    try:
        cached = Path(snapshot_download(model_id, allow_patterns=_HUB_METADATA, local_files_only=True))
        files = [str(p.relative_to(cached)) for p in cached.rglob("*") if p.is_file()]
        if not _has_weights(files):
            raise FileNotFoundError("no safetensors or pytorch_model.bin weights in the cached snapshot")
        modules, router = _read_json(cached / "modules.json"), _read_json(cached / "router_config.json")
        patterns = hub_patterns(modules, files, trust_remote_code=trust_remote_code, router=router)
        return snapshot_download(model_id, allow_patterns=patterns, local_files_only=True)
    except (HFValidationError, OSError, ValueError) as exc:
        tried.append(f"Hugging Face cache {_hub_cache()} ({_cache_miss(exc)})")
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
        tried.append("Hugging Face hub (skipped: HF_HUB_OFFLINE is set)")
        raise ModelNotFoundError(f"model {model_id!r} not found; tried: {'; '.join(tried)}")
    try:
        files = HfApi().list_repo_files(model_id)
        if not _has_weights(files):
            raise FileNotFoundError("the repository has no safetensors or pytorch_model.bin weights")
        metadata = snapshot_download(model_id, allow_patterns=_HUB_METADATA)
        modules, router = _read_json(Path(metadata) / "modules.json"), _read_json(Path(metadata) / "router_config.json")
        patterns = hub_patterns(modules, files, trust_remote_code=trust_remote_code, router=router)
        return snapshot_download(model_id, allow_patterns=patterns)
    except Exception as exc:  # network errors come in many types; all mean the same here
        tried.append(f"Hugging Face hub ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
        raise ModelNotFoundError(f"model {model_id!r} not found; tried: {'; '.join(tried)}") from None


def _hub_cache() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _cache_miss(exc: Exception) -> str:
    """Why the hub cache did not have the model, in a few words."""
    from huggingface_hub.utils import HFValidationError, LocalEntryNotFoundError

    if isinstance(exc, LocalEntryNotFoundError):
        return "not there"
    if isinstance(exc, HFValidationError):
        return "not a hub id"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def _has_weights(files: list[str]) -> bool:
    """Whether a model's file list holds weights embedrank loads (safetensors, or ``pytorch_model.bin``)."""
    return any(f.endswith(".safetensors") or f.rsplit("/", 1)[-1] == "pytorch_model.bin" for f in files)
