"""Static embeddings (sentence-transformers' ``StaticEmbedding``, model2vec): one trained vector per token.

A static model has no transformer: its ``tokenizer.json`` splits a text into tokens (no special tokens, no
truncation) and the text's embedding is the mean of its tokens' vectors (``torch.nn.EmbeddingBag`` in
sentence-transformers). Here the runtime looks the vectors up as token embeddings ``(B, T, H)`` and the
encoder's mean pooling averages the real tokens, which is the same mean. It runs in torch on every backend
setting: there is nothing to export, and a lookup is already the fastest way to compute it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from embedrank.errors import InvalidInputError, UnsupportedModelError
from embedrank.registry import STATIC_MAX_TOKENS, ModelSpec
from embedrank.runtime.backends import Backend, Precision


class StaticRuntime:
    """Token ids ``(B, T)`` -> their vectors ``(B, T, H)`` (padding rows look up id 0; pooling masks them)."""

    backend: Backend = "torch"
    precision: Precision = "fp32"
    inference_precision = "f32"
    fallback_reason: str | None = None

    def __init__(self, weights: torch.Tensor) -> None:
        self.weights = weights.float()  # (V, H)

    def __call__(self, features: dict[str, torch.Tensor], *, all_positions: bool = False) -> torch.Tensor:
        return torch.nn.functional.embedding(features["input_ids"], self.weights)


def static_tokenizer(path: Path) -> Any:
    """``tokenizer.json`` as a transformers tokenizer that adds no special tokens and pads with id 0 (masked)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    raw.post_processor = None  # sentence-transformers encodes with add_special_tokens=False
    raw.no_truncation()
    raw.no_padding()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, model_max_length=STATIC_MAX_TOKENS)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = raw.id_to_token(0)
    return tokenizer


def static_weights(path: Path, model_id: str) -> torch.Tensor:
    """The token vectors ``(V, H)``: ``embedding.weight`` (sentence-transformers) or ``embeddings`` (model2vec)."""
    if (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        weights = load_file(str(path / "model.safetensors"))
    else:
        weights = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    if "embedding.weight" in weights:
        return weights["embedding.weight"]
    if "embeddings" in weights and not {"mapping", "weights"} & set(weights):
        return weights["embeddings"]
    raise UnsupportedModelError(
        f"static model {model_id!r}: its weights hold {sorted(weights)}; embedrank reads 'embedding.weight' or "
        f"a plain model2vec 'embeddings' (vocabulary-quantized model2vec models with a mapping are not supported)"
    )


def load_static(spec: ModelSpec, backend: str | None, precision: str | None) -> tuple[Any, StaticRuntime]:
    """The tokenizer and runtime of a static model (``spec.static``).

    Raises:
        InvalidInputError: a backend other than torch, or a precision other than fp32, named for it.
    """
    if backend not in (None, "torch") or precision not in (None, "fp32"):
        raise InvalidInputError(
            f"{spec.model_id!r} is a static embedding model (a vector per token, no transformer): it runs in "
            f"torch at fp32; backend {backend!r} / precision {precision!r} do not apply",
            param="backend",
        )
    root = Path(spec.path) / (spec.static or "")
    return static_tokenizer(root), StaticRuntime(static_weights(root, spec.model_id))
