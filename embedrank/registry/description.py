"""A model described from its own files (:func:`describe`): each concern read by its module (the
transformer, ``modules.json`` and pooling, the heads beside the weights, a Router's branches, the prompts),
then the kind decided and the :class:`~embedrank.registry.spec.ModelSpec` written once per kind."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, Literal

from embedrank.errors import UnsupportedModelError
from embedrank.registry.branches import is_router, read_branch
from embedrank.registry.files import read_json
from embedrank.registry.heads import has_m3_heads, pylate_document_length, read_stanford_colbert
from embedrank.registry.modules import folder_of, is_pylate, read_pipeline, type_names
from embedrank.registry.prompts import read_prompts
from embedrank.registry.spec import ModelSpec
from embedrank.registry.transformer import Transformer, read_transformer

# config.json's model_type of the image-text models (a text tower and a vision tower into one space)
IMAGE_TEXT_TYPES = ("clip", "siglip", "siglip2")
STATIC_MAX_TOKENS = 1_000_000  # sentence-transformers does not truncate static models; no text gets near this


def describe(
    model_id: str,
    path: str,
    source: Literal["package", "local", "hub"],
    *,
    trust_remote_code: bool = False,
    branch: str | None = None,
    route: str | None = None,
) -> ModelSpec:
    """Read kind, pooling, normalization, max length and dimension from the files in ``path``.

    A sentence-transformers ``Router`` (``modules.json`` starts with one) is described by one of its branches:
    ``branch``, else its default branch; the spec's ``branches`` names them all (``route``: the deprecated name
    of ``branch``).

    Raises:
        NotAModelError: no ``config.json``.
        UnsupportedModelError: a sentence-transformers module or pooling embedrank does not run, or a model
            that needs its own code without ``trust_remote_code``.
    """
    if route is not None:
        warnings.warn(
            "describe(route=) is deprecated: a Router's routes are called branches (branch=); removed in the next "
            "release",
            DeprecationWarning,
            stacklevel=2,
        )
        branch = branch or route
    modules = read_json(Path(path) / "modules.json")
    if is_router(modules):
        chosen = read_branch(path, modules, model_id, branch)  # type: ignore[arg-type]
        spec = _describe(model_id, chosen.folder, source, chosen.modules, Path(path), trust_remote_code)
        return dataclasses.replace(spec, router=str(Path(path)), branches=chosen.names, branch=chosen.name)
    return _describe(model_id, Path(path), source, modules, Path(path), trust_remote_code)


def _describe(
    model_id: str,
    root: Path,
    source: Literal["package", "local", "hub"],
    modules: Any,
    prompts_root: Path,
    trust_remote_code: bool,
) -> ModelSpec:
    """:func:`describe` of the model in ``root`` made of ``modules`` (``modules.json``'s entries, their folders
    relative to ``root``), with the prompts of the model in ``prompts_root``."""
    names = type_names(modules)
    if "CLIPModel" in names:  # sentence-transformers' CLIP layout: the transformers folder is the module's
        root = root / folder_of(modules, "CLIPModel")
    static = any(name.endswith("StaticEmbedding") for name in names)  # a vector (or a weight) per token
    transformer = read_transformer(root, model_id, static=static, trust_remote_code=trust_remote_code)
    spec = ModelSpec(
        model_id=model_id,
        path=str(root),
        source=source,
        kind="embedding",
        pooling=None,
        normalize=False,
        max_seq_length=transformer.window,
        dimension=None,
        trust_remote_code=trust_remote_code,
        model_type=transformer.model_type,
    )
    if transformer.model_type in IMAGE_TEXT_TYPES:
        return _image_text(spec, transformer, names)
    if "SparseStaticEmbedding" in names:  # inference-free SPLADE's query side: one weight per vocabulary entry
        return dataclasses.replace(
            spec,
            kind="sparse",
            max_seq_length=transformer.tokenizer_limit or STATIC_MAX_TOKENS,
            static=folder_of(modules, "SparseStaticEmbedding"),
            model_type=None,
        )
    if "SpladePooling" in names or (transformer.is_masked_lm and not modules):  # a masked LM pooled over the vocabulary
        return dataclasses.replace(
            spec,
            kind="sparse",
            max_seq_length=int(transformer.st_config.get("max_seq_length") or transformer.window),
            dimension=transformer.vocab_size,
            do_lower_case=bool(transformer.st_config.get("do_lower_case")),
        )
    if (transformer.is_classifier or transformer.is_causal_lm) and not modules:
        return dataclasses.replace(
            spec,
            kind="cross-encoder",
            num_labels=1 if transformer.is_causal_lm else transformer.num_labels,
            scoring="yes-no" if transformer.is_causal_lm else "classifier",
        )
    if transformer.is_stanford_colbert and not modules:
        colbert = read_stanford_colbert(root)
        return dataclasses.replace(
            spec,
            kind="multi-vector",
            normalize=True,
            max_seq_length=colbert.document_length,
            dimension=colbert.dimension,
        )
    return _sentence_transformer(spec, transformer, modules, prompts_root)


def _sentence_transformer(spec: ModelSpec, transformer: Transformer, modules: Any, prompts_root: Path) -> ModelSpec:
    """A transformer and the modules after it: a sentence-transformers embedding model (a static one
    included), PyLate's ColBERT, or bge-m3 (an embedding model with its heads)."""
    root = Path(spec.path)
    pipeline = read_pipeline(root, modules, spec.model_id, transformer.hidden)
    max_len = STATIC_MAX_TOKENS if pipeline.static is not None else transformer.st_config.get("max_seq_length")
    pooling, normalize = pipeline.pooling, pipeline.normalize
    kind = (
        "m3" if has_m3_heads(root) else "embedding"
    )  # bge-m3: an embedding model with its lexical and multi-vector heads
    if is_pylate(modules):  # PyLate's ColBERT: per-token projections, no pooling; its window is the document length
        pooling, normalize, kind = None, True, "multi-vector"
        max_len = pylate_document_length(prompts_root)
    prompts, default_prompt = read_prompts(prompts_root, spec.model_id)
    return dataclasses.replace(
        spec,
        kind=kind,  # type: ignore[arg-type]
        pooling=pooling,
        normalize=normalize,
        max_seq_length=int(max_len) if max_len else transformer.window,
        dimension=int(pipeline.dimension) if pipeline.dimension else None,
        do_lower_case=bool(transformer.st_config.get("do_lower_case", False)),
        prompts=prompts,
        default_prompt_name=default_prompt,
        dense=pipeline.dense,
        static=pipeline.static,
        include_prompt=pipeline.include_prompt,
    )


def _image_text(spec: ModelSpec, transformer: Transformer, names: list[str]) -> ModelSpec:
    """CLIP, SigLIP or SigLIP2, a plain ``transformers`` folder or sentence-transformers' layout (its
    ``Transformer`` or legacy ``CLIPModel`` module, and ``Normalize`` when it normalizes): the text tower's
    window, and the width both towers project to."""
    text = transformer.config.get("text_config") or {}
    width = transformer.config.get("projection_dim") or text.get("projection_size") or text.get("hidden_size")
    window = int(transformer.st_config.get("max_seq_length") or text.get("max_position_embeddings") or 64)
    unknown = sorted(set(names) - {"Transformer", "CLIPModel", "Normalize"})
    if unknown:
        raise UnsupportedModelError(
            f"model {spec.model_id!r} runs the modules {unknown} after its image-text transformer; embedrank runs "
            f"CLIP and SigLIP models with Normalize only"
        )
    return dataclasses.replace(
        spec,
        kind="image-text",
        normalize="Normalize" in names,
        max_seq_length=window,
        dimension=int(width) if width else None,
    )
