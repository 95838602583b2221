"""The architectures of the tiny models (:mod:`embedrank.testing.tiny`): each family's ``transformers`` config
at 2 layers and hidden size 64, its tokenizer kind, how sentence-transformers pools it, and the public models
of that family (the supported-models page names them)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

TokenizerKind = Literal["wordpiece", "bpe", "unigram"]

HIDDEN = 64
LAYERS = 2
HEADS = 4
INTERMEDIATE = 128
BPE_VOCAB = 1000  # trained byte-level BPE and Unigram vocabularies (WordPiece reuses the packaged one)


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One family of public models: its config class, tokenizer and how sentence-transformers pools it."""

    name: str
    config: str  # transformers config class
    tokenizer: str  # transformers tokenizer class
    tokenizer_kind: TokenizerKind
    examples: tuple[str, ...]  # public embedding models of this architecture
    pooling: str = "mean"
    normalize: bool = False
    padding_side: str = "right"
    decoder: bool = False  # causal LM backbone: last-token pooling, EOS appended, left padding
    rerankers: tuple[str, ...] = ()  # public cross-encoders of this architecture
    # sentence-transformers Dense modules after pooling: (out_features, bias, activation) each
    dense: tuple[tuple[int, bool, str], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()  # config overrides
    specials: tuple[tuple[str, str], ...] = ()  # tokenizer special tokens


_BERT_LIKE = (
    ("hidden_size", HIDDEN),
    ("num_hidden_layers", LAYERS),
    ("num_attention_heads", HEADS),
    ("intermediate_size", INTERMEDIATE),
    ("max_position_embeddings", 128),
)
_DECODER = (
    ("hidden_size", HIDDEN),
    ("num_hidden_layers", LAYERS),
    ("num_attention_heads", HEADS),
    ("num_key_value_heads", 2),
    ("head_dim", HIDDEN // HEADS),
    ("intermediate_size", INTERMEDIATE),
    ("max_position_embeddings", 256),
    ("tie_word_embeddings", True),
)

ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture(
            "bert",
            "BertConfig",
            "BertTokenizer",
            "wordpiece",
            ("all-MiniLM-L6-v2", "bge-small/base/large-en-v1.5", "e5-*-v2", "gte-small/base/large"),
            rerankers=("ms-marco-MiniLM-L6-v2", "ms-marco-TinyBERT-L2-v2"),
            normalize=True,
            options=_BERT_LIKE,
        ),
        Architecture(
            "distilbert",
            "DistilBertConfig",
            "DistilBertTokenizer",
            "wordpiece",
            ("msmarco-distilbert-base-v4", "multi-qa-distilbert-cos-v1", "distiluse-base-multilingual-cased"),
            options=(("dim", HIDDEN), ("n_layers", LAYERS), ("n_heads", HEADS), ("hidden_dim", INTERMEDIATE)),
        ),
        Architecture(
            "roberta",
            "RobertaConfig",
            "RobertaTokenizer",
            "bpe",
            ("all-distilroberta-v1", "stsb-roberta-large", "nli-roberta-base-v2"),
            options=(*_BERT_LIKE, ("max_position_embeddings", 130), ("pad_token_id", 1)),
        ),
        Architecture(
            "xlm-roberta",
            "XLMRobertaConfig",
            "XLMRobertaTokenizer",
            "unigram",
            ("bge-m3 (dense)", "multilingual-e5-small/base/large", "paraphrase-multilingual-mpnet-base-v2"),
            rerankers=("bge-reranker-base/large", "bge-reranker-v2-m3", "mmarco-mMiniLMv2-L12-H384-v1"),
            pooling="cls",
            normalize=True,
            options=(*_BERT_LIKE, ("max_position_embeddings", 130), ("pad_token_id", 1)),
        ),
        Architecture(
            "mpnet",
            "MPNetConfig",
            "MPNetTokenizer",
            "wordpiece",
            ("all-mpnet-base-v2", "multi-qa-mpnet-base-dot-v1", "paraphrase-mpnet-base-v2"),
            normalize=True,
            options=(*_BERT_LIKE, ("max_position_embeddings", 130), ("pad_token_id", 1)),
            specials=(("bos_token", "<s>"), ("eos_token", "</s>"), ("pad_token", "<pad>"), ("mask_token", "<mask>")),
        ),
        Architecture(
            "electra",
            "ElectraConfig",
            "ElectraTokenizer",
            "wordpiece",
            ("ELECTRA sentence-transformers fine-tunes",),
            rerankers=("ms-marco-electra-base",),
            options=(*_BERT_LIKE, ("embedding_size", HIDDEN)),
        ),
        Architecture(
            "deberta-v2",
            "DebertaV2Config",
            "DebertaV2Tokenizer",
            "unigram",
            ("DeBERTa-v3 sentence-transformers fine-tunes",),
            rerankers=("mxbai-rerank-xsmall/base/large-v1", "nli-deberta-v3-base"),
            options=(
                *_BERT_LIKE,
                ("relative_attention", True),
                ("position_buckets", 32),
                ("pos_att_type", ["p2c", "c2p"]),
                ("max_relative_positions", -1),
            ),
        ),
        Architecture(
            "modernbert",
            "ModernBertConfig",
            "RobertaTokenizer",
            "bpe",
            ("gte-modernbert-base", "modernbert-embed-base", "modernbert-embed-large"),
            rerankers=("gte-reranker-modernbert-base",),
            pooling="cls",
            normalize=True,
            options=(
                ("hidden_size", HIDDEN),
                ("num_hidden_layers", LAYERS),
                ("num_attention_heads", HEADS),
                ("intermediate_size", INTERMEDIATE),
                ("max_position_embeddings", 256),
                ("global_attn_every_n_layers", 2),
                ("local_attention", 16),
            ),
            specials=(
                ("bos_token", "[CLS]"),
                ("cls_token", "[CLS]"),
                ("eos_token", "[SEP]"),
                ("sep_token", "[SEP]"),
                ("pad_token", "[PAD]"),
                ("unk_token", "[UNK]"),
                ("mask_token", "[MASK]"),
            ),
        ),
        Architecture(
            "t5",
            "T5Config",
            "T5Tokenizer",
            "unigram",
            ("sentence-t5-base/large/xl", "gtr-t5-base/large/xl"),
            normalize=True,
            options=(
                ("d_model", HIDDEN),
                ("num_layers", LAYERS),
                ("num_heads", HEADS),
                ("d_kv", HIDDEN // HEADS),
                ("d_ff", INTERMEDIATE),
                ("decoder_start_token_id", 0),
            ),
            dense=((HIDDEN, False, "Identity"),),  # sentence-t5 and GTR project the mean with one Dense layer
        ),
        Architecture(
            "gemma3",
            "Gemma3TextConfig",
            "GemmaTokenizer",
            "bpe",
            ("embeddinggemma-300m",),
            normalize=True,
            options=(
                *_DECODER,
                ("use_bidirectional_attention", True),  # EmbeddingGemma attends both ways
                ("sliding_window", 16),
                ("query_pre_attn_scalar", HIDDEN // HEADS),
            ),
            dense=((2 * HIDDEN, False, "Identity"), (HIDDEN, False, "Identity")),  # as EmbeddingGemma: 768-3072-768
        ),
        Architecture(
            "mistral",
            "MistralConfig",
            "Qwen2Tokenizer",  # a byte-level BPE as the tiny stand-in for Mistral's own (the graph is what is tested)
            "bpe",
            ("e5-mistral-7b-instruct", "SFR-Embedding-Mistral", "Linq-Embed-Mistral"),
            pooling="lasttoken",
            normalize=True,
            padding_side="left",
            decoder=True,
            options=(*_DECODER, ("sliding_window", None)),
        ),
        Architecture(
            "qwen3",
            "Qwen3Config",
            "Qwen2Tokenizer",
            "bpe",
            ("Qwen3-Embedding-0.6B/4B/8B",),
            rerankers=("Qwen3-Reranker-0.6B/4B/8B in sequence-classification form",),
            pooling="lasttoken",
            normalize=True,
            padding_side="left",
            decoder=True,
            options=_DECODER,
        ),
    )
}


CROSS_ENCODERS = ["bert", "xlm-roberta", "deberta-v2", "modernbert", "electra", "qwen3"]
"""Architectures of the public cross-encoders (sequence classifiers) built as tiny models."""
