"""sentence-transformers' ``modules.json``: the modules a model runs after its transformer, read into what
embedrank needs (pooling, Dense layers, normalization, a static embedding) and the width they give."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from embedrank.errors import UnsupportedModelError
from embedrank.math.pooling import PoolingMode
from embedrank.registry.files import read_dict
from embedrank.registry.pooling import read_pooling

SUPPORTED = {"Transformer", "Pooling", "Dense", "Normalize", "StaticEmbedding"}


def _type_name(module: dict[str, Any]) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def type_names(modules: Any) -> list[str]:
    """Each module's class name (``sentence_transformers.models.Pooling`` -> ``Pooling``).

    >>> type_names([{"type": "sentence_transformers.models.Transformer"}, {"type": "pylate.models.Dense"}])
    ['Transformer', 'Dense']
    """
    return [_type_name(m) for m in modules or [] if isinstance(m, dict)]


def folder_of(modules: Any, name: str) -> str:
    """The folder of the module named ``name`` (its class name)."""
    return next(str(m.get("path", "")) for m in modules if _type_name(m) == name)


def is_pylate(modules: Any) -> bool:
    """PyLate's ColBERT layout (its modules are ``pylate.`` classes)."""
    return isinstance(modules, list) and any(str(m.get("type", "")).startswith("pylate.") for m in modules)


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """What the modules after the transformer do: the pooling (None: none), the Dense folders in order,
    whether the output is L2-normalized, the width (None: unknown; 0: measured once loaded, for a static
    model), whether the prompt is pooled, and the ``StaticEmbedding`` folder of a static model."""

    pooling: PoolingMode | None = PoolingMode.MEAN
    dense: tuple[str, ...] = ()
    normalize: bool = False
    dimension: int | None = None
    include_prompt: bool = True
    static: str | None = None


def read_pipeline(root: Path, modules: Any, model_id: str, hidden: int | None) -> Pipeline:
    """The :class:`Pipeline` of ``modules`` (``modules.json``'s entries, their folders relative to ``root``);
    ``hidden``: the transformer's width. Without ``modules.json``: mean pooling of the transformer's states.

    Raises:
        UnsupportedModelError: a module embedrank does not run, or a Dense module that does not follow
            pooling or say its ``out_features``.
    """
    pipeline = Pipeline(dimension=hidden)
    for module in modules if isinstance(modules, list) else []:
        kind = _type_name(module)
        if kind not in SUPPORTED:
            raise UnsupportedModelError(
                f"model {model_id!r} uses the sentence-transformers module {module.get('type')!r}; "
                f"embedrank supports {sorted(SUPPORTED)}"
            )
        folder = str(module.get("path", ""))
        if kind == "Pooling":
            pooled = read_pooling(root / folder, hidden)
            pipeline = dataclasses.replace(
                pipeline, pooling=pooled.mode, dimension=pooled.dimension, include_prompt=pooled.include_prompt
            )
        elif kind == "StaticEmbedding":  # the mean of per-token vectors: pooled already; its width is measured
            pipeline = dataclasses.replace(pipeline, static=folder, dimension=0)
        elif kind == "Dense":
            dense_cfg = read_dict(root / folder / "config.json")
            if pipeline.dimension is None or "out_features" not in dense_cfg:
                raise UnsupportedModelError(
                    f"model {model_id!r}: the Dense module {module.get('path')!r} must follow Pooling and "
                    f"say its out_features"
                )
            pipeline = dataclasses.replace(
                pipeline, dense=(*pipeline.dense, folder), dimension=dense_cfg["out_features"]
            )
        elif kind == "Normalize":
            pipeline = dataclasses.replace(pipeline, normalize=True)
    return pipeline
