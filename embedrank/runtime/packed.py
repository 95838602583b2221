"""Padding-free forward pass for BERT-architecture encoders (what TEI calls unpadded batching).

A padded batch ``(B, T)`` of mixed lengths spends most of its time in the linear layers, and they do the
same work for padding as for real tokens: for ~14-token queries padded to 19, a quarter of it. Here every
token-wise step (embeddings, the Q/K/V/output projections, feed-forward, layer norms) runs on the ``N``
real tokens only, packed as ``(N, H)``; only attention, which mixes tokens, runs on the padded
``(B, heads, T, head_dim)`` layout with a key mask. The weights are the model's own modules, so the result
matches the model's ordinary forward pass up to float rounding (checked against sentence-transformers in
``tests/test_packed.py``).

Plain BERT and RoBERTa/XLM-RoBERTa encoders qualify (MiniLM, BGE, E5, GTE, bge-m3, multilingual-e5 and
most sentence-transformers models), and their sequence classifiers (cross-encoders); :func:`supports`
says no for anything else, and callers then use the model's own ``forward``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

# Packing costs a few copies per layer: with 1-2% padding it ran ~5% slower than the padded forward
# (32 x 200 tokens, 2 cores), with 26% padding (mixed-length queries) 15-50% faster. Below this share of
# padding the model's own forward runs.
MIN_PADDING_SHARE = 0.10


ENCODERS = frozenset({"BertModel", "RobertaModel", "XLMRobertaModel"})
CLASSIFIERS = {  # sequence classifier -> attribute holding its encoder
    "BertForSequenceClassification": "bert",
    "RobertaForSequenceClassification": "roberta",
    "XLMRobertaForSequenceClassification": "roberta",
}


def supports(model: Any) -> bool:
    """True when ``model`` is a BERT or RoBERTa encoder this module reproduces exactly (absolute
    positions, no decoder or cross-attention, no chunked feed-forward, eval mode)."""
    config = getattr(model, "config", None)
    return (
        type(model).__name__ in ENCODERS
        and config is not None
        and getattr(config, "position_embedding_type", "absolute") == "absolute"
        and not getattr(config, "is_decoder", False)
        and not getattr(config, "add_cross_attention", False)
        and not getattr(config, "chunk_size_feed_forward", 0)
        and not model.training
    )


def enabled(supported: bool, tokenizer: Any, requested: bool | None) -> bool:
    """Whether a model runs padding-free: ``supported`` (by :func:`supports` or :func:`supports_classifier`)
    with a right-padding tokenizer; ``requested=None`` means wherever it applies, False turns it off."""
    able = supported and getattr(tokenizer, "padding_side", "right") == "right"
    return able if requested is None else (requested and able)


def _scatter(packed: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    """``(N, C)`` real-token rows -> ``(rows, C)`` with zeros elsewhere."""
    out = packed.new_zeros(rows, packed.shape[1])
    out[index] = packed
    return out


def real_positions(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """``(N,)`` flat positions of the real tokens of a ``(B, T)`` mask, or None when padding is under
    :data:`MIN_PADDING_SHARE` (the model's own forward is then faster). Computed where the mask is: on the
    host before the batch moves to a GPU, it costs the GPU no wait (a count or ``nonzero`` on the device does).

    >>> real_positions(torch.tensor([[1, 1, 1], [1, 0, 0]]))
    tensor([0, 1, 2, 3])
    >>> real_positions(torch.ones(2, 3, dtype=torch.long)) is None
    True
    """
    mask = attention_mask.bool()
    if int(mask.sum()) > (1 - MIN_PADDING_SHARE) * mask.numel():
        return None
    return mask.reshape(-1).nonzero().squeeze(1)


@torch.inference_mode()
def packed_forward(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    *,
    real: torch.Tensor | None = None,
) -> torch.Tensor:
    """Last hidden state ``(B, T, H)`` of a BERT or RoBERTa encoder, computed on real tokens only.

    ``input_ids``, ``attention_mask`` and ``token_type_ids`` are ``(B, T)``; the mask is 1 for real tokens,
    which must come first in each row (right padding). Padding positions of the result are zero.
    ``real``: :func:`real_positions` of the mask if the caller has them (found on the host); None finds them
    here, and runs the model's own forward when there is too little padding to skip.
    """
    batch, length = input_ids.shape
    mask = attention_mask.bool()
    index = real_positions(attention_mask) if real is None else real
    if index is None:  # too little padding to skip
        kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        return model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
    index = index.to(input_ids.device)  # (N,) flat positions of real tokens
    emb = model.embeddings
    if hasattr(emb, "create_position_ids_from_input_ids"):  # RoBERTa: positions start after padding_idx
        positions = emb.create_position_ids_from_input_ids(input_ids, emb.padding_idx).reshape(-1)[index]
    else:
        positions = torch.arange(length, device=input_ids.device).repeat(batch)[index]
    types = token_type_ids.reshape(-1)[index] if token_type_ids is not None else torch.zeros_like(positions)

    hidden = emb.word_embeddings(input_ids.reshape(-1)[index])
    hidden = hidden + emb.token_type_embeddings(types)
    hidden = hidden + emb.position_embeddings(positions)
    hidden = emb.LayerNorm(hidden)  # (N, H)

    key_mask = mask[:, None, None, :]  # (B, 1, 1, T): which keys each query may attend to
    rows = batch * length
    for layer in model.encoder.layer:
        attn = layer.attention.self
        heads, head_dim = attn.num_attention_heads, attn.attention_head_size
        qkv = torch.cat([attn.query(hidden), attn.key(hidden), attn.value(hidden)], dim=1)  # (N, 3 * heads * hd)
        qkv = _scatter(qkv, index, rows).view(batch, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        context = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=key_mask, scale=attn.scaling)
        context = context.transpose(1, 2).reshape(rows, heads * head_dim)[index]  # (N, H)
        out = layer.attention.output
        hidden = out.LayerNorm(out.dense(context) + hidden)
        ffn = layer.output
        hidden = ffn.LayerNorm(ffn.dense(layer.intermediate(hidden)) + hidden)
    return _scatter(hidden, index, rows).view(batch, length, -1)


def supports_classifier(model: Any) -> bool:
    """True for a BERT or RoBERTa sequence classifier (cross-encoder) whose encoder :func:`supports`."""
    attribute = CLASSIFIERS.get(type(model).__name__)
    return attribute is not None and supports(getattr(model, attribute, None))


@torch.inference_mode()
def packed_classifier_logits(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    *,
    real: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits ``(B, L)`` of a sequence classifier: :func:`packed_forward`, then the model's own head, as its
    ``forward`` does (BERT: pooler on ``[CLS]``, dropout, classifier; RoBERTa: classification head on ``<s>``)."""
    encoder = getattr(model, CLASSIFIERS[type(model).__name__])
    hidden = packed_forward(encoder, input_ids, attention_mask, token_type_ids, real=real)
    if CLASSIFIERS[type(model).__name__] == "bert":
        pooled = encoder.pooler(hidden) if encoder.pooler is not None else hidden[:, 0]
        return model.classifier(model.dropout(pooled))
    return model.classifier(hidden)
