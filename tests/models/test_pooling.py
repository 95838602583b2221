"""Each pooling mode against a hand-computed case with padding, and against sentence-transformers' Pooling."""

from __future__ import annotations

import pytest
import torch

from embedrank.errors import InvalidInputError
from embedrank.math.pooling import PoolingMode, pool
from embedrank.math.similarity import l2_normalize, similarity, truncate_dims

# Two sequences, T=3, H=2. Row 0 has one padding position holding huge values that must never leak.
X = torch.tensor(
    [
        [[1.0, -2.0], [3.0, 4.0], [1000.0, 1000.0]],
        [[-1.0, 5.0], [2.0, -6.0], [7.0, 0.5]],
    ]
)
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])

EXPECTED = {
    PoolingMode.MEAN: [[2.0, 1.0], [8.0 / 3, -0.5 / 3]],
    PoolingMode.CLS: [[1.0, -2.0], [-1.0, 5.0]],
    PoolingMode.MAX: [[3.0, 4.0], [7.0, 5.0]],
    PoolingMode.LAST_TOKEN: [[3.0, 4.0], [7.0, 0.5]],
    PoolingMode.MEAN_SQRT_LEN: [[4.0 / 2**0.5, 2.0 / 2**0.5], [8.0 / 3**0.5, -0.5 / 3**0.5]],
}


@pytest.mark.parametrize("mode", list(PoolingMode))
def test_pooling_hand_computed(mode):
    got = pool(X, MASK, mode)
    assert got.shape == (2, 2)
    torch.testing.assert_close(got, torch.tensor(EXPECTED[mode]), rtol=0, atol=1e-6)


def test_last_token_left_padding():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    torch.testing.assert_close(pool(X, mask, "lasttoken"), torch.tensor([[1000.0, 1000.0], [7.0, 0.5]]))


@pytest.mark.parametrize(
    ("mode", "st_kwargs"),
    [
        ("mean", {"pooling_mode": "mean"}),
        ("cls", {"pooling_mode": "cls"}),
        ("max", {"pooling_mode": "max"}),
        ("lasttoken", {"pooling_mode": "lasttoken"}),
        ("mean_sqrt_len", {"pooling_mode": "mean_sqrt_len_tokens"}),
    ],
)
def test_pooling_matches_sentence_transformers(mode, st_kwargs):
    from sentence_transformers.models import Pooling

    torch.manual_seed(0)
    emb = torch.randn(4, 7, 8)
    mask = torch.tensor([[1] * 7, [1] * 3 + [0] * 4, [1] * 5 + [0] * 2, [1] + [0] * 6])
    ref = Pooling(8, **st_kwargs)({"token_embeddings": emb, "attention_mask": mask})["sentence_embedding"]
    torch.testing.assert_close(pool(emb, mask, mode), ref, rtol=0, atol=1e-6)


def test_normalize_and_truncate_match_torch():
    import numpy as np

    x = torch.randn(16, 24, generator=torch.Generator().manual_seed(3))
    x[3] = 0.0  # an all-zero row stays zero, as in torch
    ref = torch.nn.functional.normalize(x, p=2.0, dim=-1)
    np.testing.assert_allclose(l2_normalize(x.numpy()), ref.numpy(), rtol=0, atol=1e-7)
    # Matryoshka: the first d components of the normalized vector, renormalized (sentence-transformers' truncate_dim)
    t = truncate_dims(l2_normalize(x.numpy()), 8)
    np.testing.assert_allclose(t, torch.nn.functional.normalize(ref[:, :8], dim=-1).numpy(), atol=1e-7)
    np.testing.assert_allclose(truncate_dims(np.array([[3.0, 4.0, 12.0]]), 2), [[0.6, 0.8]], atol=1e-7)
    assert truncate_dims(x.numpy(), None).shape == (16, 24)
    with pytest.raises(InvalidInputError, match="between 1 and 24") as info:
        truncate_dims(x.numpy(), 25)
    assert info.value.param == "dimensions"
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InvalidInputError):
            truncate_dims(x.numpy(), bad)


def test_similarity_matches_sentence_transformers():
    import numpy as np
    from sentence_transformers.util import cos_sim, dot_score

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(3, 5)), rng.normal(size=(4, 5))
    np.testing.assert_allclose(similarity(a, b), cos_sim(torch.tensor(a), torch.tensor(b)).numpy(), atol=1e-6)
    np.testing.assert_allclose(similarity(a, b, "dot"), dot_score(torch.tensor(a), torch.tensor(b)).numpy(), atol=1e-5)
    with pytest.raises(InvalidInputError):
        similarity(a, rng.normal(size=(2, 4)))
