"""The torch backend in bf16 (what a GPU computes in by default, in bf16 or fp16) checked on the CPU for every
model kind: it loads and reports its precision, pooling, normalization and scores come out in fp32, the
heads that run after the transformer (Dense layers, ColBERT projections, bge-m3's heads) take its states,
and the results stay close to fp32's. fp16 is refused on the CPU, naming what runs there."""

from __future__ import annotations

import numpy as np
import pytest

from embedrank import CrossEncoder, Encoder
from embedrank.errors import InvalidInputError
from embedrank.models.colbert import ColBERTEncoder
from embedrank.models.m3 import M3Encoder
from embedrank.models.sparse import SparseEncoder
from embedrank.testing.tiny import tiny_bge_m3, tiny_colbert, tiny_model

TEXTS = ["green tea with lemon", "a cup of black coffee", "sparkling water", "what causes the seasons on earth"]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.mark.parametrize("architecture", ["bert", "xlm-roberta", "modernbert"])
def test_an_embedding_model_in_bf16_pools_in_fp32_close_to_fp32(architecture):
    path = tiny_model(architecture)
    fp32 = Encoder.from_pretrained(path, backend="torch")
    bf16 = Encoder.from_pretrained(path, backend="torch", precision="bf16")
    assert (bf16.precision, bf16.runtime.inference_precision, fp32.precision) == ("bf16", "bf16", "fp32")
    got, want = bf16.encode(TEXTS), fp32.encode(TEXTS)
    assert got.dtype == np.float32 and np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    assert cosines(got, want).min() >= 0.99


def test_a_cross_encoder_and_an_llm_reranker_in_bf16_score_as_in_fp32():
    for path in (tiny_model("bert", "cross-encoder"), tiny_model("qwen3", "causal-lm")):
        fp32 = CrossEncoder.from_pretrained(path, backend="torch")
        bf16 = CrossEncoder.from_pretrained(path, backend="torch", precision="bf16")
        got, want = bf16.score(TEXTS[3], TEXTS), fp32.score(TEXTS[3], TEXTS)
        assert got.dtype == np.float32 and np.abs(got - want).max() <= 0.05 * max(1.0, np.abs(want).max())


def test_splade_colbert_and_bge_m3_in_bf16_keep_their_heads_in_fp32():
    sparse32 = SparseEncoder.from_pretrained(tiny_model("bert", "masked-lm"), backend="torch")
    sparse16 = SparseEncoder.from_pretrained(tiny_model("bert", "masked-lm"), backend="torch", precision="bf16")
    got, want = sparse16.encode(TEXTS).toarray(), sparse32.encode(TEXTS).toarray()
    assert got.dtype == np.float32 and cosines(got, want).min() >= 0.99

    colbert32 = ColBERTEncoder.from_pretrained(tiny_colbert(), backend="torch")
    colbert16 = ColBERTEncoder.from_pretrained(tiny_colbert(), backend="torch", precision="bf16")
    for a, b in zip(colbert16.encode(TEXTS, query=False), colbert32.encode(TEXTS, query=False), strict=True):
        assert a.dtype == np.float32 and a.shape == b.shape and cosines(a, b).min() >= 0.99

    m3_32 = M3Encoder.from_pretrained(tiny_bge_m3(), backend="torch")
    m3_16 = M3Encoder.from_pretrained(tiny_bge_m3(), backend="torch", precision="bf16")
    got, want = m3_16.encode(TEXTS), m3_32.encode(TEXTS)
    assert got.dense.dtype == np.float32 and cosines(got.dense, want.dense).min() >= 0.99
    assert got.token_counts == want.token_counts


def test_fp16_is_refused_on_the_cpu_and_other_backends_name_theirs():
    with pytest.raises(InvalidInputError, match="fp16 runs on a GPU; on the CPU the torch backend runs fp32 or bf16"):
        Encoder.from_pretrained(tiny_model("bert"), backend="torch", precision="fp16")
    with pytest.raises(InvalidInputError, match="backend 'onnx' runs precision fp32, int8; got 'fp16'"):
        Encoder.from_pretrained(tiny_model("bert"), backend="onnx", precision="half")


@pytest.mark.slow
def test_the_packaged_model_in_bf16_is_within_the_gpu_parity_bound_of_fp32():
    """The bound the GPU check holds fp16 and bf16 to (cosine >= 0.999), on real weights, on the CPU."""
    texts = [*TEXTS, "The tilt of the Earth's axis relative to its orbital plane causes the seasons." * 3]
    fp32 = Encoder.from_pretrained(backend="torch").encode(texts)
    bf16 = Encoder.from_pretrained(backend="torch", precision="bf16").encode(texts)
    assert cosines(bf16, fp32).min() >= 0.999
