"""Encoder parity with sentence-transformers on the packaged MiniLM, plus statistics and errors."""

from __future__ import annotations

import numpy as np
import pytest

from embedrank import Encoder, InvalidInputError, ModelKindError, ModelNotFoundError, NotAModelError, resolve
from embedrank.errors import InputTooLongError

pytestmark = pytest.mark.slow

MIXED = [
    "A short query.",
    "",
    "Ünïcödé: naïve café, 日本語のテキスト, Ελληνικά, русский текст, emoji 🚀🔥",
    "Retrieval-augmented generation " * 120,  # far over 256 tokens
    "  leading and trailing whitespace  ",
    "What is the boiling point of water at sea level?",
    "x",
    "The mitochondria is the powerhouse of the cell. " * 8,
]


def test_spec_read_from_model_files():
    spec = resolve("sentence-transformers/all-MiniLM-L6-v2")
    assert (spec.kind, spec.pooling.value, spec.normalize, spec.max_seq_length, spec.dimension, spec.source) == (
        "embedding",
        "mean",
        True,
        256,
        384,
        "package",
    )


def test_encode_matches_sentence_transformers(encoder, st_model):
    ours = encoder.encode(MIXED, batch_size=3)
    ref = st_model.encode(MIXED, normalize_embeddings=True, batch_size=3)
    assert ours.dtype == np.float32 and ours.shape == (len(MIXED), 384)
    assert np.abs(ours - ref).max() < 1e-5
    # Each row alone gives the same vector as in a batch (order and padding do not leak).
    single = np.stack([encoder.encode([t])[0] for t in MIXED])
    assert np.abs(single - ours).max() < 1e-5


def test_token_counts_and_truncation(encoder):
    out = encoder.encode_with_stats(MIXED)
    tok = encoder.tokenizer
    full = [len(tok(t)["input_ids"]) for t in MIXED]
    assert out.token_counts == [min(n, 256) for n in full]
    assert out.truncated == [n > 256 for n in full]
    assert out.truncated[3] and not any(out.truncated[:3])
    assert out.token_counts[1] == 2  # [CLS] [SEP]
    with pytest.raises(InputTooLongError, match=r"texts\[3\] .*256") as info:
        encoder.encode_with_stats(MIXED, truncate=False)
    assert (info.value.param, info.value.index) == ("texts", 3)


def test_exactly_max_length_is_not_truncated(encoder):
    tok = encoder.tokenizer
    text = " ".join(["word"] * 254)  # 254 word pieces + 2 specials = 256
    assert len(tok(text)["input_ids"]) == 256
    out = encoder.encode_with_stats([text, text + " word"])
    assert out.token_counts == [256, 256]
    assert out.truncated == [False, True]


def test_dimensions_truncate_and_renormalize(encoder):
    full = encoder.encode(MIXED[:3])
    short = encoder.encode(MIXED[:3], dimensions=64)
    assert short.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1.0, atol=1e-5)
    expected = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, atol=1e-6)
    with pytest.raises(InvalidInputError, match="between 1 and 384"):
        encoder.encode(["a"], dimensions=385)


def test_pooling_override_changes_vectors(encoder, model_path):
    cls_encoder = Encoder(encoder.spec, encoder.runtime, encoder.tokenizer, pooling="cls")
    a, b = encoder.encode(["hello world"]), cls_encoder.encode(["hello world"])
    assert not np.allclose(a, b)
    np.testing.assert_allclose(np.linalg.norm(b), 1.0, atol=1e-6)


def test_empty_and_bad_inputs(encoder):
    with pytest.raises(InvalidInputError, match="empty"):
        encoder.encode([])
    with pytest.raises(InvalidInputError, match="single string"):
        encoder.encode("not a list")
    with pytest.raises(InvalidInputError, match=r"texts\[1\] must be a string"):
        encoder.encode(["ok", 3])


def test_unknown_model_id_names_what_was_tried():
    with pytest.raises(ModelNotFoundError) as info:
        Encoder.from_pretrained("no-such-org/no-such-model-xyz")
    msg = str(info.value)
    assert "no-such-org/no-such-model-xyz" in msg and "local path" in msg and "hub" in msg.lower()


def test_path_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(NotAModelError, match=r"config\.json"):
        Encoder.from_pretrained(str(tmp_path))


def test_cross_encoder_loaded_as_encoder(cross_encoder_dir):
    with pytest.raises(ModelKindError, match=r"CrossEncoder\.from_pretrained"):
        Encoder.from_pretrained(cross_encoder_dir)


def test_count_tokens_and_encode_batch_agree_with_encode(encoder):
    out = encoder.encode_batch(MIXED)
    assert out.token_counts == [min(n, 256) for n in encoder.count_tokens(MIXED)]
    assert np.abs(out.embeddings - encoder.encode(MIXED)).max() < 1e-5


def test_models_satisfy_the_runner_protocols(encoder, cross_encoder_dir):
    from embedrank import CrossEncoder
    from embedrank.serving.runners import EmbeddingModel, PairScorer
    from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder

    assert isinstance(encoder, EmbeddingModel) and isinstance(FakeEncoder(), EmbeddingModel)
    assert isinstance(CrossEncoder.from_pretrained(cross_encoder_dir), PairScorer)
    assert isinstance(FakeCrossEncoder(), PairScorer)
