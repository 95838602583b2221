"""Tiny models of every architecture embedrank serves, built offline with seeded random weights.

Each is a ``transformers`` config of the architecture (2 layers, hidden 64) with weights drawn from a
seeded generator and a tokenizer of the architecture's own kind (WordPiece, byte-level BPE or Unigram, as
the public models of that family use) trained on the packaged model's vocabulary sentences, saved in
sentence-transformers' layout (embedding models) or as a plain sequence classifier (cross-encoders). The
tests, the support matrix (``eval/quality/support_matrix.py``) and the docs load them like any downloaded model and
compare embedrank with sentence-transformers on them. Their outputs mean nothing; their shapes, special
tokens, padding sides, attention implementations and graph exports are those of the real models.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from embedrank.paths import build_directory, default_cache_dir
from embedrank.registry import DEFAULT_EMBEDDING_MODEL, quiet_loading, resolve_path
from embedrank.testing.architectures import ARCHITECTURES, BPE_VOCAB, HIDDEN, Architecture
from embedrank.texts import vocabulary_texts

RECIPE = 5  # bumped when what is built changes, so cached tiny models are rebuilt

# an embedding model, a sequence classifier, a causal LM scored as an LLM reranker (Qwen3-Reranker's form),
# or a masked LM pooled as SPLADE (sentence-transformers' SparseEncoder layout)
Kind = Literal["embedding", "cross-encoder", "causal-lm", "masked-lm"]


def _trained_tokenizer(arch: Architecture) -> Any:
    """A tokenizer of ``arch``'s class: the packaged WordPiece vocabulary, or a BPE/Unigram vocabulary
    trained on its vocabulary sentences (seeded, deterministic)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    cls = getattr(transformers, arch.tokenizer)
    specials = dict(arch.specials)
    packaged, _ = resolve_path(DEFAULT_EMBEDDING_MODEL)
    vocab_lines = (Path(packaged) / "vocab.txt").read_text(encoding="utf-8").splitlines()
    if arch.tokenizer_kind == "wordpiece":
        vocab = {tok: i for i, tok in enumerate(vocab_lines)}
        for token in specials.values():  # MPNet's <s>, </s>, <pad>, <mask> join BERT's vocabulary
            vocab.setdefault(token, len(vocab))
        return cls(vocab=vocab, **specials)
    texts = vocabulary_texts({tok: i for i, tok in enumerate(vocab_lines)}, n=600)
    if arch.tokenizer_kind == "unigram":
        probe = cls()
        # the ids the public models give them: XLM-R <s>=0 <pad>=1 </s>=2 <unk>=3, DeBERTa-v2 [PAD]=0 [CLS]=1 ...
        first = [probe.pad_token] if arch.name == "deberta-v2" else [probe.cls_token]
        first += [probe.cls_token, probe.pad_token, probe.sep_token, probe.unk_token]
        special_tokens = [t for t in dict.fromkeys(first + list(probe.all_special_tokens)) if t]
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=BPE_VOCAB, special_tokens=special_tokens, unk_token=probe.unk_token, shrinking_factor=0.75
        )
        tok.train_from_iterator(texts, trainer)
        pieces = json.loads(tok.to_str())["model"]["vocab"]
        return cls(vocab=[(p, float(s)) for p, s in pieces], **specials)
    probe = cls(**specials)
    special_tokens = list(dict.fromkeys(probe.all_special_tokens))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe_trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB, special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, bpe_trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return cls(vocab=model["vocab"], merges=merges, **specials)


def _config(arch: Architecture, tokenizer: Any, kind: Kind, num_labels: int) -> Any:
    import transformers

    options = dict(arch.options)
    options["vocab_size"] = len(tokenizer)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        token_id = getattr(tokenizer, name, None)
        if token_id is not None:
            options[name] = token_id
    if arch.name == "modernbert":
        options.update(cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id)
    if kind == "cross-encoder":
        options["num_labels"] = num_labels
    return getattr(transformers, arch.config)(**options)


def _write_sentence_transformers_layout(out: Path, arch: Architecture, tokenizer: Any) -> None:
    """``modules.json``, the pooling and normalize folders and ``sentence_bert_config.json`` as
    sentence-transformers saves them."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    width = HIDDEN
    for out_features, bias, activation in arch.dense:
        import torch
        from safetensors.torch import save_file

        folder = f"{len(modules)}_Dense"
        modules.append(
            {
                "idx": len(modules),
                "name": str(len(modules)),
                "path": folder,
                "type": "sentence_transformers.models.Dense",
            }
        )
        (out / folder).mkdir()
        config = {
            "in_features": width,
            "out_features": out_features,
            "bias": bias,
            "activation_function": f"torch.nn.modules.linear.{activation}",
        }
        (out / folder / "config.json").write_text(json.dumps(config))
        generator = torch.Generator().manual_seed(len(modules))
        weights = {"linear.weight": torch.randn(out_features, width, generator=generator) * 0.2}
        if bias:
            weights["linear.bias"] = torch.randn(out_features, generator=generator) * 0.02
        save_file(weights, str(out / folder / "model.safetensors"))
        width = out_features
    if arch.normalize:
        folder = f"{len(modules)}_Normalize"
        modules.append(
            {
                "idx": len(modules),
                "name": str(len(modules)),
                "path": folder,
                "type": "sentence_transformers.models.Normalize",
            }
        )
        (out / folder).mkdir(exist_ok=True)
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir(exist_ok=True)
    pooling = {
        "word_embedding_dimension": HIDDEN,
        "pooling_mode_cls_token": arch.pooling == "cls",
        "pooling_mode_mean_tokens": arch.pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": arch.pooling == "lasttoken",
        "include_prompt": True,
    }
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 120, "do_lower_case": False}))
    prompts: dict[str, Any] = {"prompts": {"query": "query: ", "document": ""}, "default_prompt_name": None}
    if arch.decoder:  # instruction prompts, as Qwen3-Embedding and e5-mistral write them
        prompts["prompts"]["query"] = "Instruct: Given a web search query, retrieve relevant passages\nQuery:"
    (out / "config_sentence_transformers.json").write_text(json.dumps(prompts, indent=2))


def _build(arch: Architecture, kind: Kind, out: Path, seed: int, num_labels: int) -> None:
    import torch
    import transformers

    tokenizer = _trained_tokenizer(arch)
    tokenizer.padding_side = arch.padding_side
    if kind == "causal-lm":  # the chat markers of the reranker's template, and its two answers as tokens
        if not arch.decoder:
            raise ValueError(f"{arch.name} is not a decoder; a causal-LM reranker needs one")
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tokenizer.add_tokens(["<think>", "</think>", "yes", "no"])
    elif arch.decoder:  # the embedding is the hidden state of the EOS token appended to every input
        from tokenizers import processors

        eos = tokenizer.eos_token
        tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, tokenizer.eos_token_id)]
        )
    config = _config(arch, tokenizer, kind, num_labels)
    offset = 2 if arch.name in ("roberta", "xlm-roberta", "mpnet") else 0  # positions start after padding_idx
    # as the public models' files say (T5's relative positions have no limit; its tokenizer says 512)
    tokenizer.model_max_length = getattr(config, "max_position_embeddings", 512) - offset
    torch.manual_seed(seed)
    loader = {
        "embedding": transformers.AutoModel,
        "cross-encoder": transformers.AutoModelForSequenceClassification,
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
    }[kind]
    with quiet_loading():
        model = loader.from_config(config).eval()
        spread_weights(model, seed)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    if kind == "embedding":
        _write_sentence_transformers_layout(out, arch, tokenizer)
    if kind == "masked-lm":  # SPLADE: the layout sentence-transformers' SparseEncoder saves
        from sentence_transformers.sparse_encoder import SparseEncoder
        from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

        with quiet_loading():
            SparseEncoder(modules=[MLMTransformer(str(out), max_seq_length=120), SpladePooling("max")]).save(str(out))


def tiny_model(
    architecture: str,
    kind: Kind = "embedding",
    out: str | Path | None = None,
    *,
    seed: int = 0,
    num_labels: int = 1,
    build: Callable[[Architecture, Kind, Path, int, int], None] = _build,
) -> str:
    """A tiny seeded model of ``architecture`` (a key of :data:`ARCHITECTURES`), saved to ``out``; returns
    its path.

    Without ``out`` it goes to ``<cache>/models/tiny-<architecture>-<kind>-<key>`` and is built once (the
    build is deterministic), so its exports are cached too.
    """
    if architecture not in ARCHITECTURES:
        raise KeyError(f"unknown architecture {architecture!r}; choose one of {sorted(ARCHITECTURES)}")
    arch = ARCHITECTURES[architecture]
    name = f"tiny-{architecture}-{kind}"
    return built_once(out, name, f"{RECIPE}:{seed}:{num_labels}", lambda tmp: build(arch, kind, tmp, seed, num_labels))


def spread_weights(model: Any, seed: int) -> None:
    """Draw ``model``'s weights from a seeded generator, spread so that outputs differ visibly between inputs
    (matrices N(0, 0.2²), biases N(0, 0.02²); norms and other vectors keep their initial values)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
            elif "bias" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)


def built_once(out: str | Path | None, name: str, facts: str, build: Callable[[Path], None]) -> str:
    """``build`` into ``out`` (a temporary folder renamed into place); without ``out``, into the cache's
    ``models/<name>-<key>`` once (``key``: ``facts`` and transformers' version), found there by later calls."""
    if out is None:
        import transformers

        key = hashlib.sha256(f"{facts}:{transformers.__version__}".encode()).hexdigest()[:10]
        out = default_cache_dir() / "models" / f"{name}-{key}"
        if (Path(out) / "config.json").is_file():
            return str(out)
    return build_directory(out, build)


def _m3_heads(out: Path, seed: int) -> None:
    """bge-m3's two heads, seeded, beside the transformer: ``sparse_linear.pt`` (a positive bias, so most
    tokens get a weight) and ``colbert_linear.pt``, as FlagEmbedding saves them."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    sparse = {"weight": torch.randn(1, HIDDEN, generator=generator) * 0.1, "bias": torch.tensor([0.3])}
    colbert = {
        "weight": torch.randn(HIDDEN, HIDDEN, generator=generator) * 0.2,
        "bias": torch.randn(HIDDEN, generator=generator) * 0.02,
    }
    torch.save(sparse, out / "sparse_linear.pt")
    torch.save(colbert, out / "colbert_linear.pt")


def tiny_bge_m3(out: str | Path | None = None, *, seed: int = 0) -> str:
    """A tiny XLM-R (:func:`tiny_model`) with seeded bge-m3 heads beside it (bge-m3's layout); returns its path."""
    import shutil

    import transformers

    if out is None:
        key = hashlib.sha256(f"{RECIPE}:{transformers.__version__}:{seed}".encode()).hexdigest()[:10]
        out = default_cache_dir() / "models" / f"tiny-bge-m3-{key}"
        if (Path(out) / "colbert_linear.pt").is_file():
            return str(out)
    source = tiny_model("xlm-roberta", seed=seed)

    def build(tmp: Path) -> None:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        _m3_heads(tmp, seed)

    return build_directory(out, build)


COLBERT_SETTINGS = {
    "query_prefix": "[Q] ",
    "document_prefix": "[D] ",
    "query_length": 12,
    "document_length": 40,
    "attend_to_expansion_tokens": False,
    "do_query_expansion": True,
}


def tiny_colbert(out: str | Path | None = None, *, seed: int = 0, **settings: Any) -> str:
    """A tiny BERT (:func:`tiny_model`) in PyLate's ColBERT layout: ``[Q] ``/``[D] `` marker tokens added
    (embeddings resized), a seeded projection to 16 dimensions in ``1_Dense`` and the ColBERT settings in
    ``config_sentence_transformers.json`` (:data:`COLBERT_SETTINGS` updated by ``settings``: a 12-token
    query, 40-token documents); returns its path."""
    import shutil

    import transformers

    config = {**COLBERT_SETTINGS, **settings}
    if out is None:
        recipe = f"{RECIPE}:{transformers.__version__}:{seed}:{sorted(config.items())}"
        out = default_cache_dir() / "models" / f"tiny-colbert-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"
        if (Path(out) / "1_Dense" / "model.safetensors").is_file():
            return str(out)
    source = tiny_model("bert", seed=seed)

    def build(tmp: Path) -> None:
        import torch
        from safetensors.torch import save_file

        for name in (
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "vocab.txt",
            "special_tokens_map.json",
            "sentence_bert_config.json",
        ):
            if (Path(source) / name).is_file():
                shutil.copy(Path(source) / name, tmp / name)
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp))
        tokenizer.add_tokens([p for p in (config["query_prefix"], config["document_prefix"]) if p])
        torch.manual_seed(seed)
        with quiet_loading():
            model = transformers.AutoModel.from_pretrained(str(tmp))
            model.resize_token_embeddings(len(tokenizer))
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
        ]
        (tmp / "modules.json").write_text(json.dumps(modules, indent=2))
        (tmp / "1_Dense").mkdir()
        dense = {
            "in_features": HIDDEN,
            "out_features": 16,
            "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity",
            "use_residual": False,
        }
        (tmp / "1_Dense" / "config.json").write_text(json.dumps(dense))
        generator = torch.Generator().manual_seed(seed + 1)
        save_file(
            {"linear.weight": torch.randn(16, HIDDEN, generator=generator) * 0.2},
            str(tmp / "1_Dense" / "model.safetensors"),
        )
        st = {
            **config,
            "skiplist_words": list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
            "similarity_fn_name": "MaxSim",
            "model_type": "ColBERT",
            "prompts": {},
            "default_prompt_name": None,
        }
        (tmp / "config_sentence_transformers.json").write_text(json.dumps(st, indent=2))

    return build_directory(out, build)


def tiny_stanford_colbert(out: str | Path | None = None, *, seed: int = 0) -> str:
    """A tiny BERT in the Stanford ColBERT checkpoint layout (``colbert-ir/colbertv2.0``'s): ``config.json``
    naming ``HF_ColBERT``, one ``model.safetensors`` holding the transformer under ``bert.`` and the projection
    as ``linear.weight`` (to 16 dimensions), the ``[unused0]``/``[unused1]`` markers in the vocabulary, and
    the settings in ``artifact.metadata`` (a 12-token query, 40-token documents); returns its path."""
    import shutil

    import transformers

    if out is None:
        recipe = f"{RECIPE}:{transformers.__version__}:{seed}:stanford"
        out = (
            default_cache_dir() / "models" / f"tiny-stanford-colbert-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"
        )
        if (Path(out) / "artifact.metadata").is_file():
            return str(out)
    source = tiny_model("bert", seed=seed)

    def build(tmp: Path) -> None:
        import torch
        from safetensors.torch import save_file

        for name in (
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "vocab.txt",
            "special_tokens_map.json",
        ):
            if (Path(source) / name).is_file():
                shutil.copy(Path(source) / name, tmp / name)
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp))
        tokenizer.add_tokens(["[unused0]", "[unused1]"], special_tokens=False)  # in BERT's own vocabulary
        with quiet_loading():
            model = transformers.AutoModel.from_pretrained(str(tmp))
            model.resize_token_embeddings(len(tokenizer))
        tokenizer.save_pretrained(tmp)
        (tmp / "model.safetensors").unlink()
        generator = torch.Generator().manual_seed(seed + 1)
        weights = {f"bert.{k}": v.contiguous() for k, v in model.state_dict().items()}
        weights["linear.weight"] = torch.randn(16, HIDDEN, generator=generator) * 0.2
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config["architectures"] = ["HF_ColBERT"]
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        metadata = {
            "query_token_id": "[unused0]",
            "doc_token_id": "[unused1]",
            "query_maxlen": 12,
            "doc_maxlen": 40,
            "dim": 16,
            "similarity": "cosine",
            "attend_to_mask_tokens": False,
            "mask_punctuation": True,
        }
        (tmp / "artifact.metadata").write_text(json.dumps(metadata, indent=2))

    return build_directory(out, build)


TINY_SIZES = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 37,
    "vocab_size": 99,
}
"""A transformers config's sizes for a model built in a test on the spot (``BertConfig(**TINY_SIZES)``)."""


def right_padded(pad_id: int, lengths: list[int], width: int = 12, *, vocab_size: int = 99) -> tuple[Any, Any]:
    """A seeded ``(len(lengths), width)`` batch of token ids right-padded with ``pad_id``, and its mask: row ``i``
    has ``lengths[i]`` real tokens (ids from 3 up, below ``vocab_size``)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.full((len(lengths), width), pad_id)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(3, vocab_size, (n,), generator=generator)
        mask[row, :n] = 1
    return ids, mask
