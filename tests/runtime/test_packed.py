"""The padding-free forward pass (embedrank.runtime.packed) against the model's own padded forward and sentence-transformers."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from embedrank import CrossEncoder, Encoder
from embedrank.runtime.packed import packed_forward, supports, supports_classifier
from embedrank.testing.tiny import TINY_SIZES, right_padded

pytestmark = pytest.mark.slow

# Lengths from 3 to 256 tokens (the last is truncated), so one padded batch is mostly padding.
TEXTS = [
    "A short query.",
    "",
    "Ünïcödé: naïve café, 日本語のテキスト, Ελληνικά, русский текст, emoji 🚀🔥",
    "Retrieval-augmented generation " * 120,
    "What is the boiling point of water at sea level?",
    "The mitochondria is the powerhouse of the cell. " * 8,
]


@pytest.fixture(scope="module")
def encoder():
    """The torch backend: packing is a torch-path optimization (the default backend is OpenVINO)."""
    return Encoder.from_pretrained(backend="torch")


def test_packed_forward_equals_padded_forward(encoder):
    batch = encoder.tokenize(TEXTS)
    mask = batch.features["attention_mask"].bool()
    assert not mask.all()  # the batch is padded, so the packed path runs
    with torch.inference_mode():
        ref = encoder.model(**batch.features).last_hidden_state
        ours = packed_forward(encoder.model, **batch.features)
    assert ours.shape == ref.shape
    assert (ours[mask] - ref[mask]).abs().max() < 1e-5
    assert ours[~mask].abs().max() == 0  # padding positions are zero, not garbage


def test_padded_batch_embeddings_match_sentence_transformers(encoder, st_model):
    assert encoder.padding_free
    ours = encoder.embed_tokenized(encoder.tokenize(TEXTS))  # one padded batch, as the service engine runs it
    ref = st_model.encode(TEXTS, normalize_embeddings=True, batch_size=len(TEXTS))
    assert np.abs(ours - ref).max() < 1e-5


def test_cross_encoder_pairs_with_token_types_match(cross_encoder_dir):
    from sentence_transformers import CrossEncoder as STCrossEncoder

    packed_ce = CrossEncoder.from_pretrained(cross_encoder_dir, backend="torch")
    assert packed_ce.padding_free
    plain = CrossEncoder.from_pretrained(cross_encoder_dir, backend="torch")
    plain.padding_free = False
    query = "what causes the seasons on earth"
    batch = packed_ce.tokenize([query] * len(TEXTS), TEXTS)
    assert int(batch.features["token_type_ids"].max()) == 1
    ours = packed_ce.forward(batch.features)
    assert np.abs(ours - plain.forward(batch.features)).max() < 1e-5
    ref = STCrossEncoder(cross_encoder_dir, device="cpu").predict([(query, t) for t in TEXTS], batch_size=len(TEXTS))
    assert np.abs(ours - ref).max() < 1e-5


@pytest.mark.parametrize("kind", ["RobertaModel", "XLMRobertaModel"])
def test_roberta_family_encoders_match_their_own_forward(kind):
    import transformers

    torch.manual_seed(0)
    config_cls = getattr(transformers, kind.replace("Model", "Config"))
    model = getattr(transformers, kind)(config_cls(**TINY_SIZES)).eval()
    assert supports(model)
    ids, mask = right_padded(model.config.pad_token_id, [12, 3, 7, 1])
    with torch.inference_mode():
        ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
        ours = packed_forward(model, ids, mask)
    real = mask.bool()
    assert (ours[real] - ref[real]).abs().max() < 1e-5  # positions start after padding_idx, as RoBERTa's do


@pytest.mark.parametrize("kind", ["BertForSequenceClassification", "XLMRobertaForSequenceClassification"])
def test_sequence_classifiers_match_their_own_forward(kind):
    import transformers

    from embedrank.runtime.packed import packed_classifier_logits

    torch.manual_seed(0)
    config_cls = getattr(transformers, kind.replace("ForSequenceClassification", "Config"))
    model = getattr(transformers, kind)(config_cls(**TINY_SIZES, num_labels=2)).eval()
    assert supports_classifier(model)
    ids, mask = right_padded(model.config.pad_token_id or 0, [12, 3, 7, 1])
    types = (torch.arange(12) >= 2).long().expand(4, 12) * mask if kind.startswith("Bert") else None
    with torch.inference_mode():
        ref = model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        ours = packed_classifier_logits(model, ids, mask, types)
    assert ours.shape == (4, 2)
    assert (ours - ref).abs().max() < 1e-5


def test_only_plain_bert_and_roberta_encoders_qualify(encoder, model_path):
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertModel

    tiny = DistilBertModel(DistilBertConfig(dim=32, n_layers=1, n_heads=2, hidden_dim=37, vocab_size=99))
    assert not supports(tiny.eval())
    assert not supports_classifier(encoder.model)  # an encoder has no classification head
    training = copy.deepcopy(encoder.model).train()  # the shared fixture stays untouched
    assert not supports(training)  # dropout would be skipped
    left = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    assert not Encoder(encoder.spec, encoder.model, left).padding_free  # packing assumes right padding
    assert not Encoder(encoder.spec, encoder.model, encoder.tokenizer, padding_free=False).padding_free


def test_little_padding_runs_the_models_own_forward(encoder, monkeypatch):
    calls = []
    forward = encoder.model.forward
    monkeypatch.setattr(encoder.model, "forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    ids = torch.randint(1000, 2000, (4, 40))
    mask = torch.ones(4, 40, dtype=torch.long)
    mask[0, -2:] = 0  # 1% padding: packing would cost more than it saves
    packed_forward(encoder.model, ids, mask)
    assert calls == [1]
    mask[:, 20:] = 0  # half padding: the packed path runs, not the model's forward
    packed_forward(encoder.model, ids, mask)
    assert calls == [1]


def test_the_runtime_finds_real_positions_on_the_host_and_packs_with_them(encoder, monkeypatch):
    from embedrank.runtime import packed

    seen = []
    real = packed.real_positions
    monkeypatch.setattr(packed, "real_positions", lambda mask: seen.append(mask.device.type) or real(mask))
    batch = encoder.tokenize(TEXTS)
    with torch.inference_mode():
        ref = encoder.model(**batch.features).last_hidden_state
    ours = encoder.runtime(batch.features)
    mask = batch.features["attention_mask"].bool()
    assert seen == ["cpu"] and (ours[mask] - ref[mask]).abs().max() < 1e-5


def reference_varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None):
    """What torch.nn.attention.varlen.varlen_attn computes, one sequence at a time with SDPA: ``(N, heads, hd)``."""
    assert cu_q is cu_k and max_q == max_k
    assert int((cu_q[1:] - cu_q[:-1]).max()) == max_q
    out = torch.empty_like(q)
    for start, end in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
        one = [t[start:end].transpose(0, 1) for t in (q, k, v)]
        out[start:end] = torch.nn.functional.scaled_dot_product_attention(*one, scale=scale).transpose(0, 1)
    return out


def test_variable_length_attention_over_the_packed_rows_equals_the_padded_forward(encoder, cross_encoder_dir):
    from embedrank.runtime import packed

    batch = encoder.tokenize(TEXTS)
    mask = batch.features["attention_mask"]
    varlen = packed.varlen_of(mask, reference_varlen_attn)
    assert varlen.offsets.tolist() == [0, *mask.sum(1).cumsum(0).tolist()] and varlen.longest == mask.shape[1]
    with torch.inference_mode():
        ref = encoder.model(**batch.features).last_hidden_state
        ours = packed_forward(encoder.model, **batch.features, varlen=varlen)
    real = mask.bool()
    assert (ours[real] - ref[real]).abs().max() < 1e-5 and ours[~real].abs().max() == 0

    ce = CrossEncoder.from_pretrained(cross_encoder_dir, backend="torch")
    pairs = ce.tokenize(["what causes the seasons on earth"] * len(TEXTS), TEXTS).features
    with torch.inference_mode():
        expected = ce.model(**pairs).logits
        got = packed.packed_classifier_logits(
            ce.model, **pairs, varlen=packed.varlen_of(pairs["attention_mask"], reference_varlen_attn)
        )
    assert (got - expected).abs().max() < 1e-4


def test_the_runtime_attends_on_the_packed_rows_where_a_kernel_is_found(encoder, monkeypatch):
    from embedrank.runtime import packed
    from embedrank.runtime.backends import TorchRuntime

    assert encoder.runtime.varlen is None  # a CPU: torch's kernel is flash attention, CUDA only
    calls = []

    def kernel(*args, **kwargs):
        calls.append(args[3].device.type)
        return reference_varlen_attn(*args, **kwargs)

    monkeypatch.setattr(packed, "varlen_kernel", lambda device, dtype, head_dim: kernel)
    runtime = TorchRuntime(encoder.model, encoder.tokenizer, "encoder")
    batch = encoder.tokenize(TEXTS)
    with torch.inference_mode():
        ref = encoder.model(**batch.features).last_hidden_state
    ours = runtime(batch.features)
    real = batch.features["attention_mask"].bool()
    assert calls == ["cpu"] * encoder.model.config.num_hidden_layers
    assert (ours[real] - ref[real]).abs().max() < 1e-5


def test_a_variable_length_kernel_is_used_only_where_it_runs_and_agrees_with_sdpa():
    from embedrank.runtime import packed

    cpu = torch.device("cpu")
    assert packed.varlen_kernel(cpu, torch.float16, 64) is None  # no CUDA device
    assert packed._agrees_with_sdpa(reference_varlen_attn, cpu, torch.float32, 32)

    def across_the_border(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None):  # sequences of 4 and 4, not 5 and 3
        wrong = torch.tensor([0, 4, 8], dtype=torch.int32)
        return reference_varlen_attn(q, k, v, wrong, wrong, 4, 4, scale=scale)

    assert not packed._agrees_with_sdpa(across_the_border, cpu, torch.float32, 32)
