"""sentence-transformers' ``Dense`` modules: linear layers with an activation after pooling.

Models such as LaBSE, distiluse-base-multilingual, GTR and sentence-t5 project the pooled vector with one
``Dense`` layer, EmbeddingGemma with two. Each module folder (``2_Dense/``) holds a ``config.json``
(``in_features``, ``out_features``, ``bias``, ``activation_function``) and the weights ``linear.weight``
``(out, in)`` and ``linear.bias`` ``(out,)`` in ``model.safetensors`` or ``pytorch_model.bin``. They run in
torch after the backend on every backend, as sentence-transformers runs them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from embedrank.errors import UnsupportedModelError

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Identity": lambda x: x,
    "Tanh": torch.tanh,
    "ReLU": torch.relu,
    "Sigmoid": torch.sigmoid,
    "GELU": torch.nn.functional.gelu,
    "SiLU": torch.nn.functional.silu,
}


@dataclasses.dataclass(frozen=True)
class DenseLayer:
    """``activation(x @ weight.T + bias)``: ``(B, in) -> (B, out)``."""

    weight: torch.Tensor  # (out, in)
    bias: torch.Tensor | None  # (out,)
    activation: str

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias.to(x.device, x.dtype) if self.bias is not None else None  # no-ops on the CPU in fp32
        return ACTIVATIONS[self.activation](torch.nn.functional.linear(x, self.weight.to(x.device, x.dtype), bias))


def activation_name(config: dict, where: str) -> str:
    """The activation's class name from ``activation_function`` (``torch.nn.modules.activation.Tanh``).

    >>> activation_name({"activation_function": "torch.nn.modules.activation.Tanh"}, "2_Dense")
    'Tanh'
    """
    name = str(config.get("activation_function") or "torch.nn.modules.linear.Identity").rsplit(".", 1)[-1]
    if name not in ACTIVATIONS:
        raise UnsupportedModelError(f"{where}: activation {name!r} is not one of {sorted(ACTIVATIONS)}")
    return name


def load_dense(root: str | Path, folders: Sequence[str]) -> list[DenseLayer]:
    """The ``Dense`` modules in ``folders`` (relative to the model's ``root``), in order."""
    layers = []
    for folder in folders:
        path = Path(root) / folder
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        if (path / "model.safetensors").is_file():
            from safetensors.torch import load_file

            weights = load_file(str(path / "model.safetensors"))
        else:
            weights = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        layers.append(
            DenseLayer(
                weights["linear.weight"].float(),
                weights["linear.bias"].float() if config.get("bias", True) else None,
                activation_name(config, str(path)),
            )
        )
    return layers


def load_stanford_projection(root: str | Path) -> DenseLayer:
    """A Stanford ColBERT checkpoint's projection: ``linear.weight`` ``(D, H)`` saved beside the transformer's
    weights in ``model.safetensors`` (or ``pytorch_model.bin``), no bias, no activation."""
    path = Path(root)
    if (path / "model.safetensors").is_file():
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), framework="pt", device="cpu") as f:
            if "linear.weight" not in f.keys():  # noqa: SIM118  (safe_open has keys(), not __contains__)
                raise UnsupportedModelError(f"{path}: a Stanford ColBERT checkpoint without linear.weight")
            weight = f.get_tensor("linear.weight")
    else:
        weights = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        if "linear.weight" not in weights:
            raise UnsupportedModelError(f"{path}: a Stanford ColBERT checkpoint without linear.weight")
        weight = weights["linear.weight"]
    return DenseLayer(weight.float(), None, "Identity")


def apply_dense(pooled: torch.Tensor, layers: Sequence[DenseLayer]) -> torch.Tensor:
    """``(B, H) -> (B, D)`` through every layer in order (no layers: unchanged)."""
    for layer in layers:
        pooled = layer(pooled)
    return pooled
