"""What embedrank knows about a model before loading its weights (:class:`ModelSpec`), and its kind."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Literal

from embedrank.math.pooling import PoolingMode

# what a model is, and so what loads, scores and serves it: multi-vector is ColBERT (models.colbert); m3 is bge-m3
# (models.m3), an embedding model whose lexical and multi-vector heads lie beside its weights; image-text is
# CLIP and SigLIP (models.image_text): a text tower and a vision tower embedding into one space
ModelKind = Literal["embedding", "cross-encoder", "sparse", "multi-vector", "m3", "image-text"]


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
    # a PEFT LoRA adapter folder whose updates are merged into the transformer's weights as it loads: the spec of
    # that adapter's model (what an exported backend runs for it: one export per adapter, runtime.lora)
    merged_adapter: str | None = None

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


MODEL_KINDS = ("embedding", "multi-vector", "sparse", "m3", "image-text", "cross-encoder")


def kind_of(spec: ModelSpec) -> str:
    """Deprecated: ``spec.kind`` (which now names bge-m3 models ``m3`` itself)."""
    warnings.warn("kind_of(spec) is deprecated: use spec.kind", DeprecationWarning, stacklevel=2)
    return spec.kind
