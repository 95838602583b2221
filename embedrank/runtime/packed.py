"""Padding-free forward pass for BERT-architecture encoders (what TEI calls unpadded batching).

A padded batch ``(B, T)`` of mixed lengths spends most of its time in the linear layers, and they do the
same work for padding as for real tokens: for ~14-token queries padded to 19, a quarter of it. Here every
token-wise step (embeddings, the Q/K/V/output projections, feed-forward, layer norms) runs on the ``N``
real tokens only, packed as ``(N, H)``; only attention, which mixes tokens, runs on the padded
``(B, heads, T, head_dim)`` layout with a key mask, unless a variable-length attention kernel is given
(:class:`Varlen`: on a GPU, torch's flash attention over the packed rows, :func:`varlen_kernel`): then no
step sees padding. The weights are the model's own modules, so the result
matches the model's ordinary forward pass up to float rounding (checked against sentence-transformers in
``tests/runtime/test_packed.py``).

Plain BERT and RoBERTa/XLM-RoBERTa encoders qualify (MiniLM, BGE, E5, GTE, bge-m3, multilingual-e5 and
most sentence-transformers models), and their sequence classifiers (cross-encoders); :func:`supports`
says no for anything else, and callers then use the model's own ``forward``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import torch
from torch.nn import functional as F

# Packing costs a few copies per layer: with 1-2% padding it ran ~5% slower than the padded forward
# (32 x 200 tokens, 2 cores), with 26% padding (mixed-length queries) 15-50% faster. Below this share of
# padding the model's own forward runs.
MIN_PADDING_SHARE = 0.10

log = logging.getLogger(__name__)


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


class Varlen(NamedTuple):
    """Variable-length attention over the packed ``(N, heads, head_dim)`` rows of a batch.

    ``kernel`` has :func:`torch.nn.attention.varlen.varlen_attn`'s signature: ``(q, k, v, cu_q, cu_k, max_q,
    max_k, *, scale) -> (N, heads, head_dim)``; ``offsets`` ``(B + 1,)`` int32 is where each sequence's rows
    start (and the last one ends), ``longest`` the longest sequence's length.
    """

    kernel: Callable[..., torch.Tensor]
    offsets: torch.Tensor
    longest: int


def varlen_of(
    attention_mask: torch.Tensor, kernel: Callable[..., torch.Tensor], device: torch.device | str | None = None
) -> Varlen:
    """The :class:`Varlen` of a right-padded ``(B, T)`` mask, computed where the mask is (the host), its offsets
    then sent to ``device`` (the model's) without waiting.

    >>> varlen_of(torch.tensor([[1, 1, 1], [1, 0, 0]]), kernel=print)[1:]
    (tensor([0, 3, 4], dtype=torch.int32), 3)
    """
    lengths = attention_mask.sum(1, dtype=torch.int32)
    offsets = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    return Varlen(kernel, offsets.to(device, non_blocking=True), int(lengths.max()))


def _torch_varlen_attn() -> Callable[..., torch.Tensor] | None:
    """:func:`torch.nn.attention.varlen.varlen_attn` if this torch has it with a ``scale`` argument (2.10 on)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return (
        cast(Callable[..., torch.Tensor], varlen_attn) if "scale" in inspect.signature(varlen_attn).parameters else None
    )


def varlen_kernel(device: torch.device, dtype: torch.dtype, head_dim: int) -> Callable[..., torch.Tensor] | None:
    """torch's variable-length flash attention where it runs and agrees with SDPA, else None.

    It runs on CUDA GPUs of compute capability 8.0 on (A100, H100, L4, RTX 30xx on) in fp16 or bf16 with a
    head size that is a multiple of 8 up to 256. A first call on a small batch is compared with
    :func:`torch.nn.functional.scaled_dot_product_attention`; a kernel that fails or disagrees is logged and
    not used (the packed forward then attends on the padded layout).
    """
    kernel = _torch_varlen_attn()
    if (
        kernel is None
        or device.type != "cuda"
        or dtype not in (torch.float16, torch.bfloat16)
        or head_dim % 8
        or head_dim > 256
        or torch.cuda.get_device_capability(device) < (8, 0)
    ):
        return None
    try:
        agrees = _agrees_with_sdpa(kernel, device, dtype, head_dim)
    except RuntimeError as exc:  # a torch built without flash attention for this GPU
        log.warning("embedrank: variable-length attention failed on %s (%s); attending on padded rows", device, exc)
        return None
    if not agrees:
        log.warning("embedrank: variable-length attention disagreed with SDPA on %s; attending on padded rows", device)
        return None
    return kernel


def _agrees_with_sdpa(
    kernel: Callable[..., torch.Tensor], device: torch.device, dtype: torch.dtype, head_dim: int
) -> bool:
    """Whether ``kernel`` on two sequences (5 and 3 tokens, 2 heads) matches SDPA on each sequence alone."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(8, 2, head_dim, generator=generator).to(device, dtype) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    varlen = varlen_of(mask, kernel, device)
    got = kernel(q, k, v, varlen.offsets, varlen.offsets, 5, 5, scale=head_dim**-0.5)
    for start, end in ((0, 5), (5, 8)):
        one_q, one_k, one_v = (t[start:end].transpose(0, 1) for t in (q, k, v))  # (heads, T, head_dim)
        expected = F.scaled_dot_product_attention(one_q, one_k, one_v, scale=head_dim**-0.5).transpose(0, 1)
        if not torch.allclose(got[start:end].float(), expected.float(), atol=2e-2, rtol=2e-2):
            return False
    return True


@torch.inference_mode()
def packed_forward(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    *,
    real: torch.Tensor | None = None,
    varlen: Varlen | None = None,
) -> torch.Tensor:
    """Last hidden state ``(B, T, H)`` of a BERT or RoBERTa encoder, computed on real tokens only.

    ``input_ids``, ``attention_mask`` and ``token_type_ids`` are ``(B, T)``; the mask is 1 for real tokens,
    which must come first in each row (right padding). Padding positions of the result are zero.
    ``real``: :func:`real_positions` of the mask if the caller has them (found on the host); None finds them
    here, and runs the model's own forward when there is too little padding to skip.
    ``varlen``: attention runs on the packed rows with this kernel (its offsets on the model's device);
    None attends on the padded ``(B, heads, T, head_dim)`` layout with SDPA.
    """
    batch, length = input_ids.shape
    mask = attention_mask.bool()
    index = real_positions(attention_mask) if real is None else real
    if index is None:  # too little padding to skip
        kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        return model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
    index = index.to(input_ids.device)  # (N,) flat positions of real tokens
    positions = _positions(model, input_ids).reshape(-1)[index]
    types = token_type_ids.reshape(-1)[index] if token_type_ids is not None else torch.zeros_like(positions)
    hidden = _embeddings(model, input_ids.reshape(-1)[index], positions, types)  # (N, H)

    key_mask = mask[:, None, None, :]  # (B, 1, 1, T): which keys each query may attend to
    rows = batch * length
    for layer in model.encoder.layer:
        attn = layer.attention.self
        heads, head_dim = attn.num_attention_heads, attn.attention_head_size
        qkv = torch.cat([attn.query(hidden), attn.key(hidden), attn.value(hidden)], dim=1)  # (N, 3 * heads * hd)
        if varlen is not None:
            q, k, v = qkv.view(-1, 3, heads, head_dim).unbind(1)  # each (N, heads, hd)
            cu = varlen.offsets
            context = varlen.kernel(q, k, v, cu, cu, varlen.longest, varlen.longest, scale=attn.scaling)
            context = context.reshape(-1, heads * head_dim)  # (N, H)
        else:
            context = _padded_attention(attn, _scatter(qkv, index, rows), batch, length, key_mask)[index]
        hidden = _after_attention(layer, context, hidden)
    return _scatter(hidden, index, rows).view(batch, length, -1)


@torch.inference_mode()
def padded_forward(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Last hidden state ``(B, T, H)`` of a BERT or RoBERTa encoder on the padded layout, as fixed-shape
    tensor operations with no step that depends on the values (nothing waits for the GPU): what a CUDA graph
    captures (:mod:`embedrank.runtime.graphs`). Padding positions of the result are zero; a row must hold at
    least one real token."""
    batch, length = input_ids.shape
    positions = _positions(model, input_ids).reshape(-1)
    types = token_type_ids.reshape(-1) if token_type_ids is not None else torch.zeros_like(positions)
    hidden = _embeddings(model, input_ids.reshape(-1), positions, types)  # (B * T, H)
    key_mask = attention_mask.bool()[:, None, None, :]
    for layer in model.encoder.layer:
        attn = layer.attention.self
        qkv = torch.cat([attn.query(hidden), attn.key(hidden), attn.value(hidden)], dim=1)
        hidden = _after_attention(layer, _padded_attention(attn, qkv, batch, length, key_mask), hidden)
    return hidden.view(batch, length, -1) * attention_mask[..., None]  # a float times an integer tensor: float


def _positions(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` position ids as the model's embeddings compute them (RoBERTa: after ``padding_idx``)."""
    emb = model.embeddings
    if hasattr(emb, "create_position_ids_from_input_ids"):
        return emb.create_position_ids_from_input_ids(input_ids, emb.padding_idx)
    batch, length = input_ids.shape
    return torch.arange(length, device=input_ids.device).expand(batch, length)


def _embeddings(model: Any, ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
    """``(R,)`` token, position and type ids -> ``(R, H)`` embeddings after the embeddings' layer norm."""
    emb = model.embeddings
    hidden = emb.word_embeddings(ids) + emb.token_type_embeddings(types) + emb.position_embeddings(positions)
    return emb.LayerNorm(hidden)


def _after_attention(layer: Any, context: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """A layer's output projection, feed-forward and layer norms on ``(R, H)`` rows."""
    out = layer.attention.output
    hidden = out.LayerNorm(out.dense(context) + hidden)
    ffn = layer.output
    return ffn.LayerNorm(ffn.dense(layer.intermediate(hidden)) + hidden)


def _padded_attention(attn: Any, qkv: torch.Tensor, batch: int, length: int, key_mask: torch.Tensor) -> torch.Tensor:
    """Attention of ``(B * T, 3 * heads * hd)`` projections on the padded layout: ``(B * T, heads * hd)``."""
    heads, head_dim = attn.num_attention_heads, attn.attention_head_size
    qkv = qkv.view(batch, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
    context = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=key_mask, scale=attn.scaling)
    return context.transpose(1, 2).reshape(batch * length, heads * head_dim)


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
    varlen: Varlen | None = None,
) -> torch.Tensor:
    """Logits ``(B, L)`` of a sequence classifier: :func:`packed_forward`, then the model's own head, as its
    ``forward`` does (BERT: pooler on ``[CLS]``, dropout, classifier; RoBERTa: classification head on ``<s>``)."""
    encoder = getattr(model, CLASSIFIERS[type(model).__name__])
    return classifier_head(
        model, packed_forward(encoder, input_ids, attention_mask, token_type_ids, real=real, varlen=varlen)
    )


def padded_classifier_logits(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Logits ``(B, L)`` of a sequence classifier: :func:`padded_forward`, then the model's own head."""
    encoder = getattr(model, CLASSIFIERS[type(model).__name__])
    return classifier_head(model, padded_forward(encoder, input_ids, attention_mask, token_type_ids))


def classifier_head(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """A sequence classifier's logits ``(B, L)`` from its encoder's last hidden state ``(B, T, H)``, as its
    ``forward`` does (BERT: pooler on ``[CLS]``, dropout, classifier; RoBERTa: classification head on ``<s>``)."""
    if CLASSIFIERS[type(model).__name__] == "bert":
        encoder = model.bert
        pooled = encoder.pooler(hidden) if encoder.pooler is not None else hidden[:, 0]
        return model.classifier(model.dropout(pooled))
    return model.classifier(hidden)
