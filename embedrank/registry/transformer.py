"""The transformer a model runs: ``config.json`` (architecture, width, positions), the tokenizer's
``model_max_length`` and sentence-transformers' ``sentence_bert_config.json`` (window, lowercasing)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from embedrank.errors import NotAModelError, UnsupportedModelError
from embedrank.registry.files import read_dict, read_json

# RoBERTa-style models number positions from pad_token_id + 1: 514 position embeddings hold 512 tokens
_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet", "data2vec-text", "longformer"}
# where configs keep the width of the token embeddings (DistilBERT says dim, T5 d_model, GPT-2 n_embd)
_HIDDEN_KEYS = ("hidden_size", "dim", "d_model", "n_embd")


@dataclasses.dataclass(frozen=True)
class Transformer:
    """What a model's transformer files say. ``window``: the longest input its positions and tokenizer
    allow (512 when neither says); ``tokenizer_limit``: the tokenizer's own ``model_max_length``;
    ``st_config``: ``sentence_bert_config.json`` (empty when absent)."""

    config: dict[str, Any]
    window: int
    tokenizer_limit: int | None
    st_config: dict[str, Any]

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or [])

    @property
    def model_type(self) -> str | None:
        return self.config.get("model_type")

    @property
    def hidden(self) -> int | None:
        """The width of the token states."""
        return next((self.config[k] for k in _HIDDEN_KEYS if isinstance(self.config.get(k), int)), None)

    @property
    def is_classifier(self) -> bool:
        return any(a.endswith("ForSequenceClassification") for a in self.architectures)

    @property
    def is_causal_lm(self) -> bool:
        """A causal LM (without sentence-transformers modules: an LLM reranker; an embedding model built on a
        decoder, like Qwen3-Embedding, has ``modules.json``)."""
        return not self.is_classifier and any(a.endswith("ForCausalLM") for a in self.architectures)

    @property
    def is_masked_lm(self) -> bool:
        return any(a.endswith("ForMaskedLM") for a in self.architectures)

    @property
    def is_stanford_colbert(self) -> bool:
        """A Stanford ColBERT checkpoint (colbert-ir/colbertv2.0's ``HF_ColBERT``)."""
        return "HF_ColBERT" in self.architectures

    @property
    def num_labels(self) -> int:
        return int(self.config.get("num_labels") or len(self.config.get("id2label") or {}) or 1)

    @property
    def vocab_size(self) -> int | None:
        return int(self.config.get("vocab_size") or 0) or None


def read_transformer(root: Path, model_id: str, *, static: bool, trust_remote_code: bool) -> Transformer:
    """The transformer files in ``root``. A ``static`` model (a vector per token) has no transformer: its
    ``config.json`` may be missing or hold its module's settings.

    Raises:
        NotAModelError: no readable ``config.json`` and the model is not static.
        UnsupportedModelError: an architecture transformers does not ship (:func:`check_architecture`).
    """
    config = read_json(root / "config.json")
    if not isinstance(config, dict) or (static and "model_type" not in config):
        if not static:
            raise NotAModelError(f"{str(root)!r} has no readable config.json, so it is not a model directory")
        config = {}
    check_architecture(model_id, config, trust_remote_code)
    position_limit = config.get("max_position_embeddings")
    if config.get("model_type") in _OFFSET_POSITIONS and isinstance(position_limit, int):
        position_limit -= int(config.get("pad_token_id") or 1) + 1
    tok_limit = read_dict(root / "tokenizer_config.json").get("model_max_length")
    limits = [int(v) for v in (position_limit, tok_limit) if isinstance(v, int) and 0 < v < 1_000_000]
    return Transformer(
        config=config,
        window=min(limits) if limits else 512,
        tokenizer_limit=tok_limit if isinstance(tok_limit, int) else None,
        st_config=read_dict(root / "sentence_bert_config.json"),
    )


def check_architecture(model_id: str, config: dict[str, Any], trust_remote_code: bool) -> None:
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
