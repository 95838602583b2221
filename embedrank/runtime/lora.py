"""LoRA adapters applied row by row on a torch model: PEFT's adapter folders read, and each adapted linear layer's
output given, for every row of a batch, the low-rank update of the adapter that row asks for. The base model's
matrix products run once for the whole batch, whatever mix of adapters its rows use; only the updates run per
adapter, on that adapter's rows (as S-LoRA and Punica share a batch between adapters on GPUs).

A PEFT LoRA adapter (``adapter_config.json`` with ``"peft_type": "LORA"`` beside ``adapter_model.safetensors``)
changes a target linear layer ``y = W x`` into ``y = W x + s B A x``, with ``A`` ``(r, in)``, ``B`` ``(out, r)`` and
``s = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``; ``alpha_pattern`` sets a layer's own alpha).
It may also save whole modules of its own (``modules_to_save``: a reranker's classification head, trained with
the adapter), which replace the model's for the rows that take it. Adapters that change more than that (DoRA,
biases, embedding or convolution layers) are refused, naming what they change.

>>> import torch
>>> layer = LoraLayer(a=torch.ones(1, 2), b=torch.full((3, 1), 0.5), scale=2.0)
>>> lora_delta(torch.tensor([[1.0, 2.0]]), layer)
tensor([[3., 3., 3.]])
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from embedrank.errors import InvalidInputError, UnsupportedModelError

CONFIG = "adapter_config.json"
WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
BASE = -1
"""The adapter index of a row that uses none (the base model alone)."""
MASKED_UP_TO = 4
"""The most adapters in one batch whose updates are computed for every position and masked (more: each on its own
positions, gathered): a masked update costs a low-rank product of the whole batch per adapter present."""
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>A|B)(?:\.[^.]+)?\.weight$")
_SAVED = re.compile(r"\.modules_to_save\.[^.]+(?=\.)")  # a saved module's copy, as PEFT names it while training


@dataclasses.dataclass(frozen=True)
class LoraLayer:
    """One adapted linear layer's update: ``a`` ``(r, in)``, ``b`` ``(out, r)``, ``scale`` (alpha over r, or
    over its square root)."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float


@dataclasses.dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter read from ``path``: its layers' updates by the module path they adapt, as PEFT names it
    (``encoder.layer.0.attention.self.query``), its rank, and the modules it saved whole."""

    name: str
    path: str
    layers: dict[str, LoraLayer]
    rank: int
    saved: dict[str, dict[str, torch.Tensor]] = dataclasses.field(default_factory=dict)
    """The modules it replaces whole (PEFT's ``modules_to_save``): each one's parameters by the module's path."""


def is_adapter(folder: str | Path) -> bool:
    """Whether ``folder`` holds a PEFT adapter (its configuration and weights)."""
    folder = Path(folder)
    return (folder / CONFIG).is_file() and any((folder / w).is_file() for w in WEIGHTS)


def find_adapters(folder: str | Path) -> dict[str, str]:
    """The PEFT adapters in or beside a model folder, by name: the ``adapters/<name>/`` layout (jina-embeddings-v5),
    and adapters saved by PEFT for several names (``<name>/`` subfolders of a folder that is an adapter itself);
    empty if there are none.

    >>> find_adapters("/nonexistent")
    {}
    """
    folder = Path(folder)
    found: dict[str, str] = {}
    for root in (folder / "adapters", folder):
        if root.is_dir():
            for sub in sorted(root.iterdir()):
                if sub.is_dir() and is_adapter(sub) and sub.name not in found:
                    found[sub.name] = str(sub)
    return found


def _pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """``patterns``' value for ``module`` as PEFT matches them (the pattern names the module's path or its end)."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def read_adapter(folder: str | Path, name: str | None = None) -> LoraAdapter:
    """The LoRA adapter saved by PEFT in ``folder`` (``name``: the folder's name when not given).

    Raises:
        InvalidInputError: ``folder`` holds no adapter.
        UnsupportedModelError: the adapter is not a LoRA one, or changes more than linear layers' outputs.
    """
    folder = Path(folder)
    if not is_adapter(folder):
        raise InvalidInputError(
            f"{folder} is not a PEFT adapter: it needs {CONFIG} and {' or '.join(WEIGHTS)}", param="adapters"
        )
    config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    what = f"the adapter in {folder}"
    if config.get("peft_type", "LORA") != "LORA":
        raise UnsupportedModelError(f"{what} is a {config.get('peft_type')} adapter; only LoRA adapters are served")
    refused = {
        "use_dora": "DoRA's magnitude vectors",
        "lora_bias": "biases of its own",
        "trainable_token_indices": "token embeddings of its own",
        "target_parameters": "parameters outside linear layers",
        "layer_replication": "layers replicated",
        "alora_invocation_tokens": "activated LoRA (aLoRA)",
        "use_qalora": "QA-LoRA's grouped inputs",
    }
    for key, change in refused.items():
        if config.get(key):
            raise UnsupportedModelError(
                f"{what} has {change} ({key}): only plain LoRA updates of linear layers are served"
            )
    if config.get("bias", "none") != "none":
        raise UnsupportedModelError(f"{what} trains biases (bias={config['bias']!r}): only LoRA updates are served")
    weights = _weights(folder)
    parts: dict[str, dict[str, torch.Tensor]] = {}
    saved: dict[str, dict[str, torch.Tensor]] = {}
    kept = list(config.get("modules_to_save") or [])
    for key, tensor in weights.items():
        match = _KEY.match(key)
        if match is not None:
            parts.setdefault(match["module"], {})[match["part"]] = tensor.float()
            continue
        found = _saved_module(_SAVED.sub("", key.removeprefix("base_model.model.")), kept)
        if found is None:
            raise UnsupportedModelError(f"{what} holds {key!r}, which is no LoRA update of a linear layer")
        module, parameter = found
        saved.setdefault(module, {})[parameter] = tensor
    layers: dict[str, LoraLayer] = {}
    alpha, rslora = float(config.get("lora_alpha", 8)), bool(config.get("use_rslora", False))
    for module, pair in parts.items():
        if set(pair) != {"A", "B"}:
            raise UnsupportedModelError(f"{what} has lora_{next(iter(pair))} of {module!r} without its other half")
        a, b = pair["A"], pair["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise UnsupportedModelError(f"{what}: {module!r}'s update is not a pair of matrices of one rank")
        r = a.shape[0]
        own_alpha = float(_pattern_value(config.get("alpha_pattern") or {}, module, alpha))
        layers[module] = LoraLayer(a=a, b=b, scale=own_alpha / (math.sqrt(r) if rslora else r))
    if not layers:
        raise UnsupportedModelError(f"{what} adapts no layer")
    return LoraAdapter(
        name=name or folder.name,
        path=str(folder),
        layers=layers,
        rank=max(layer.a.shape[0] for layer in layers.values()),
        saved=saved,
    )


def _saved_module(path: str, kept: Sequence[str]) -> tuple[str, str] | None:
    """The module of ``kept`` (PEFT's ``modules_to_save``: names or paths' ends) that a saved parameter's ``path``
    lies in, and the parameter's name within it; None when it lies in none.

    >>> _saved_module("classifier.dense.bias", ["classifier", "score"]), _saved_module("roberta.pooler.w", ["score"])
    (('classifier', 'dense.bias'), None)
    """
    for name in kept:
        if path.startswith(name + "."):
            return name, path[len(name) + 1 :]
        at = path.find("." + name + ".")
        if at >= 0:
            return path[: at + 1 + len(name)], path[at + len(name) + 2 :]
    return None


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / WEIGHTS[0]).is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / WEIGHTS[0]))
    return torch.load(folder / WEIGHTS[1], map_location="cpu", weights_only=True)  # type: ignore[no-any-return]


def lora_delta(x: torch.Tensor, layer: LoraLayer) -> torch.Tensor:
    """The update ``s B A x`` of ``x`` ``(N, in)``: ``(N, out)``, in ``x``'s dtype."""
    a, b = layer.a.to(x.device, x.dtype), layer.b.to(x.device, x.dtype)
    return (x @ a.T) @ b.T * layer.scale


def _resolve(module_names: Sequence[str], path: str) -> str | None:
    """The module of ``module_names`` (a model's linear layers) an adapter's ``path`` names: the same path, or
    the one path that ends with it or that it ends with (the adapter saved on a model wrapped otherwise)."""
    if path in module_names:
        return path
    found = [m for m in module_names if path.endswith("." + m) or m.endswith("." + path)]
    return found[0] if len(found) == 1 else None


def adapted_layers(module: torch.nn.Module, adapter: LoraAdapter) -> list[tuple[str, torch.nn.Linear, LoraLayer]]:
    """The linear layers of ``module`` that ``adapter`` adapts, each with its path and its update on the layer's own
    device and dtype.

    Raises:
        UnsupportedModelError: the adapter names a layer the model lacks (it was trained on another model), or one
            that is not linear, or its shapes do not fit.
    """
    linear = {name: sub for name, sub in module.named_modules() if isinstance(sub, torch.nn.Linear)}
    found = []
    for path, layer in adapter.layers.items():
        target = _resolve(list(linear), path)
        if target is None:
            raise UnsupportedModelError(
                f"adapter {adapter.name!r} ({adapter.path}) adapts {path!r}, which is no linear layer of "
                f"this model: was it trained on another base model?"
            )
        sub = linear[target]
        if layer.a.shape[1] != sub.in_features or layer.b.shape[0] != sub.out_features:
            raise UnsupportedModelError(
                f"adapter {adapter.name!r} ({adapter.path}): {path!r} maps {layer.a.shape[1]} to "
                f"{layer.b.shape[0]} features, the model's layer {sub.in_features} to {sub.out_features}"
            )
        weight = sub.weight
        bound = LoraLayer(
            a=layer.a.to(weight.device, weight.dtype), b=layer.b.to(weight.device, weight.dtype), scale=layer.scale
        )
        found.append((target, sub, bound))
    return found


def saved_modules(module: torch.nn.Module, adapter: LoraAdapter) -> list[tuple[str, torch.nn.Module, torch.nn.Module]]:
    """The modules of ``module`` that ``adapter`` replaces whole, each with its path and the adapter's own copy (the
    module with the adapter's parameters, on the module's device and dtype).

    Raises:
        UnsupportedModelError: the adapter saved a module the model lacks, or one whose parameters do not fit.
    """
    modules = dict(module.named_modules())
    found = []
    for path, state in adapter.saved.items():
        target = _resolve([name for name in modules if name], path)
        if target is None:
            raise UnsupportedModelError(
                f"adapter {adapter.name!r} ({adapter.path}) saved a module {path!r}, which this model lacks: was it "
                f"trained on another base model?"
            )
        own = copy.deepcopy(modules[target])
        try:
            own.load_state_dict(state, strict=True)  # into the copy's own tensors: their device and dtype
        except RuntimeError as exc:
            reason = " ".join(str(exc).split())
            raise UnsupportedModelError(
                f"adapter {adapter.name!r} ({adapter.path}): its module {path!r} does not fit the model's: {reason}"
            ) from None
        found.append((target, modules[target], own.eval()))
    return found


@torch.no_grad()
def merge_adapter(module: torch.nn.Module, adapter: LoraAdapter) -> None:
    """Add ``adapter``'s updates to the weights of the layers it adapts, in place: ``W += s B A`` (as PEFT's
    ``merge_and_unload``), and put the modules it saved in place of the model's; ``module`` then computes that
    adapter's model, and an export of it is one.

    Raises:
        UnsupportedModelError: as :func:`adapted_layers` and :func:`saved_modules`.
    """
    for _, linear, layer in adapted_layers(module, adapter):
        delta = (layer.b.float() @ layer.a.float()) * layer.scale
        linear.weight.copy_((linear.weight.float() + delta.to(linear.weight.device)).to(linear.weight.dtype))
    for _, sub, own in saved_modules(module, adapter):
        sub.load_state_dict(own.state_dict())


class AdapterNames:
    """The names of the adapters a runtime runs, in the order their indexes follow."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        if len(set(self.names)) != len(self.names):
            raise InvalidInputError(f"adapter names repeat: {self.names}", param="adapters")

    def index(self, name: str | None) -> int:
        """The index of adapter ``name`` (None: :data:`BASE`).

        Raises:
            InvalidInputError: no adapter of that name (the message lists them).
        """
        if name is None:
            return BASE
        try:
            return self.names.index(name)
        except ValueError:
            raise InvalidInputError(
                f"unknown adapter {name!r}; this model has {', '.join(map(repr, self.names)) or 'none'}",
                param="adapter",
            ) from None


@dataclasses.dataclass(frozen=True)
class _Chosen:
    """Each position's adapter index, found once a forward pass: how many positions, the one index all take (None
    when they differ); else, for each adapter present, a ``(N, 1)`` mask of its positions (up to
    :data:`MASKED_UP_TO` adapters: each update is computed for every position and masked, which on a CPU costs less
    than gathering the positions and scattering their updates back) or, with more, its positions."""

    count: int
    sole: int | None
    masks: dict[int, torch.Tensor]
    groups: dict[int, torch.Tensor]

    @classmethod
    def of(cls, indexes: torch.Tensor) -> _Chosen:
        count = int(indexes.shape[0])
        present = [int(i) for i in torch.unique(indexes)]
        if len(present) == 1:
            return cls(count, present[0], {}, {})
        adapters = [i for i in present if i != BASE]
        if len(adapters) <= MASKED_UP_TO:
            return cls(count, None, {i: (indexes == i).unsqueeze(1).float() for i in adapters}, {})
        return cls(count, None, {}, {i: (indexes == i).nonzero().squeeze(1) for i in adapters})


class RowAdapters(AdapterNames):
    """``adapters`` attached to the linear layers of ``module`` they adapt and the modules they saved whole (forward
    hooks), each applied to the rows that ask for it: :meth:`rows` gives, for the forward passes run inside it on this
    thread, each row's and every position's adapter index (into :attr:`names`; :data:`BASE` for none), flattened as
    the layers see their inputs.

    Raises:
        UnsupportedModelError: as :func:`adapted_layers` and :func:`saved_modules`.
    """

    def __init__(self, module: torch.nn.Module, adapters: Sequence[LoraAdapter]) -> None:
        super().__init__([a.name for a in adapters])
        by_module: dict[str, list[tuple[int, LoraLayer]]] = {}
        linear: dict[str, torch.nn.Linear] = {}
        replaced: dict[str, list[tuple[int, torch.nn.Module]]] = {}
        whole: dict[str, torch.nn.Module] = {}
        for index, adapter in enumerate(adapters):
            # bound once, here: the update then computes on the layer's own device and dtype without a copy a pass
            for target, sub, bound in adapted_layers(module, adapter):
                by_module.setdefault(target, []).append((index, bound))
                linear[target] = sub
            for target, kept, own in saved_modules(module, adapter):
                replaced.setdefault(target, []).append((index, own))
                whole[target] = kept
        self._local = threading.local()
        self._hooks = [
            linear[name].register_forward_hook(partial(self._hook, layers)) for name, layers in by_module.items()
        ] + [whole[name].register_forward_hook(partial(self._replace, owns)) for name, owns in replaced.items()]

    @contextlib.contextmanager
    def rows(self, rows: torch.Tensor, positions: torch.Tensor) -> Iterator[None]:
        """Within it, on this thread, the adapted layers add to each position of their input (flattened to
        ``(N, in)``) the update of adapter ``positions[n]`` ``(N,)`` (:data:`BASE`: none); a layer that sees one
        position a row (a pooler on the first token) takes each row's, ``rows`` ``(B,)``. Which positions take which
        adapter is found once here, not at every layer; when they all take one, each layer adds its update to the
        whole output, with no gathering."""
        before = getattr(self._local, "chosen", None), getattr(self._local, "rows", None)
        self._local.chosen = (_Chosen.of(rows), _Chosen.of(positions))
        self._local.rows = rows
        try:
            yield
        finally:
            self._local.chosen, self._local.rows = before

    def _hook(
        self, layers: list[tuple[int, LoraLayer]], module: torch.nn.Module, inputs: tuple[Any, ...], output: Any
    ) -> Any:
        chosen = getattr(self._local, "chosen", None)
        if chosen is None:
            return None
        x = inputs[0].reshape(-1, inputs[0].shape[-1])
        found = next((c for c in reversed(chosen) if c.count == x.shape[0]), None)
        if found is None:
            raise RuntimeError(
                f"adapter indexes for {chosen[1].count} positions or {chosen[0].count} rows, not {x.shape[0]}"
            )
        out = output.reshape(-1, output.shape[-1])  # the layer's own fresh output: the updates are added in place
        for index, layer in layers:
            if found.sole is not None:  # every position takes one adapter: its update on the whole output
                if found.sole == index:
                    out.addmm_(x @ layer.a.T, layer.b.T, alpha=layer.scale)
                continue
            mask = found.masks.get(index)
            if mask is not None:  # the update of every position, kept on this adapter's (cheaper than gathering)
                out.addmm_((x @ layer.a.T).mul_(mask.to(x.dtype)), layer.b.T, alpha=layer.scale)
            where = found.groups.get(index)
            if where is not None:
                out.index_add_(0, where, lora_delta(x.index_select(0, where), layer))
        return out.reshape(output.shape)  # a view of ``output`` (a copy, updated, were it not contiguous)

    def _replace(
        self, owns: list[tuple[int, torch.nn.Module]], module: torch.nn.Module, inputs: tuple[Any, ...], output: Any
    ) -> Any:
        """A module some adapters saved whole (a classification head, whose input holds one row per text): each
        row that takes one of them computed by that adapter's copy instead."""
        rows = getattr(self._local, "rows", None)
        if rows is None:
            return None
        x = inputs[0]
        if x.shape[0] != rows.shape[0]:
            raise RuntimeError(f"adapter indexes for {rows.shape[0]} rows, not {x.shape[0]}")
        for index, own in owns:
            where = (rows == index).nonzero().squeeze(1).to(x.device)
            if where.numel() == rows.shape[0]:  # every row takes this adapter
                return own(*inputs)
            if where.numel():
                output = output.index_copy(0, where, own(x.index_select(0, where)))
        return output

    def detach(self) -> None:
        """Remove the hooks: the model computes as its base again."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()


def positions_of(rows: torch.Tensor, length: int, real: torch.Tensor | None) -> torch.Tensor:
    """Every position's adapter index from each row's ``rows`` ``(B,)``: the padded layout's ``(B * length,)``, or
    with ``real`` (the flat positions of the real tokens a packed forward computes) ``(N,)``.

    >>> positions_of(torch.tensor([0, 1]), 3, None).tolist()
    [0, 0, 0, 1, 1, 1]
    >>> positions_of(torch.tensor([0, 1]), 3, torch.tensor([0, 1, 3])).tolist()
    [0, 0, 1]
    """
    flat = rows.repeat_interleave(length)
    return flat if real is None else flat[real.to(flat.device)]
