"""Tokenization on the Rust tokenizer and padding in numpy give what the tokenizer's own calls give."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from embedrank.models import tokens
from embedrank.registry import DEFAULT_EMBEDDING_MODEL, resolve_path
from embedrank.testing.architectures import ARCHITECTURES
from embedrank.testing.tiny import tiny_model

TEXTS = [
    "",
    " ",
    "What is the capital of France?",
    "  leading and trailing  spaces \t and\ttabs\n",
    "Ünïcödé, accents, ß, 東京, emoji 🙂 and a zero-width\u200bjoiner",
    "a [SEP] b </s> c <s> [CLS] <pad> [MASK] <|endoftext|> <unk>",
    "number 3.14159 and url https://example.org/a?b=c",
    " ".join(f"word{i} tokens" for i in range(150)),  # over every max_length below
]


def _tokenizers():
    path, _ = resolve_path(DEFAULT_EMBEDDING_MODEL)
    yield "packaged", AutoTokenizer.from_pretrained(path)
    for name in ARCHITECTURES:
        yield name, AutoTokenizer.from_pretrained(tiny_model(name))


@pytest.fixture(scope="module")
def tokenizers():
    return dict(_tokenizers())


@pytest.mark.parametrize("max_length", [8, 32, 512])
def test_rust_rows_equal_the_tokenizer_call(tokenizers, max_length):
    for name, tokenizer in tokenizers.items():
        backend = tokens._backend(tokenizer, max_length)
        assert backend is not None, name
        rows, cut = tokens._encode_backend(tokenizer, backend, TEXTS)
        enc = tokenizer(TEXTS, truncation=True, max_length=max_length, return_attention_mask=True)
        full = tokenizer(TEXTS, truncation=False, verbose=False)["input_ids"]
        assert [sorted(r) for r in rows] == [sorted(enc)] * len(TEXTS), name
        for key in enc:
            assert [r[key] for r in rows] == enc[key], (name, key)
        assert cut == [len(ids) > max_length for ids in full], name
        if max_length < 100:
            assert cut[-1], name


def test_the_tokenizer_call_does_not_change_the_kept_copy(tokenizers):
    tokenizer = tokenizers["packaged"]
    rows, _ = tokens.encode_rows(tokenizer, TEXTS, max_length=8)
    tokenizer(TEXTS, truncation=True, max_length=300)  # sets truncation on the tokenizer's own Rust tokenizer
    again, _ = tokens.encode_rows(tokenizer, TEXTS, max_length=8)
    assert again == rows and max(len(r["input_ids"]) for r in rows) == 8


@pytest.mark.parametrize("side", ["right", "left"])
def test_collate_pads_as_the_tokenizer_does(tokenizers, side):
    for name, tokenizer in tokenizers.items():
        tokenizer.padding_side = side
        try:
            rows, cut = tokens.encode_rows(tokenizer, TEXTS, max_length=24)
            batch = tokens.collate(tokenizer, rows, cut)
            expected = tokenizer.pad(rows, padding=True, return_tensors="pt")
        finally:
            tokenizer.padding_side = "right"
        assert sorted(batch.features) == sorted(expected), name
        for key, value in expected.items():
            assert batch.features[key].dtype == torch.long, (name, key)
            assert torch.equal(batch.features[key], value), (name, key, side)
        assert batch.token_counts == [len(r["input_ids"]) for r in rows]


def test_a_slow_tokenizer_keeps_its_own_path():
    class Slow:
        is_fast = False
        model_input_names = ("input_ids", "attention_mask")

        def __call__(self, texts, *pairs, truncation=None, max_length=None, **_):
            ids = [[1] + [5] * len(t.split()) + [2] for t in texts]
            if truncation:
                ids = [row[:max_length] for row in ids]
            return {"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids]}

    assert tokens._backend(Slow(), 4) is None
    rows, cut = tokens.encode_rows(Slow(), ["a b c d e", "a"], max_length=4)
    assert [r["input_ids"] for r in rows] == [[1, 5, 5, 5], [1, 5, 2]] and cut == [True, False]


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "256"])
def test_every_loader_refuses_a_window_that_is_not_a_positive_integer(value):
    """max_seq_length=0 used to fall back to the model's own window without a word; every kind of model
    refuses it, before any weights load."""
    from embedrank.errors import InvalidInputError
    from embedrank.models.cross_encoder import CrossEncoder
    from embedrank.models.encoder import Encoder
    from embedrank.models.sparse import SparseEncoder
    from embedrank.registry import DEFAULT_EMBEDDING_MODEL, resolve

    spec = resolve(DEFAULT_EMBEDDING_MODEL)
    for loader in (Encoder, CrossEncoder, SparseEncoder):
        with pytest.raises(InvalidInputError, match="max_seq_length must be a positive integer"):
            loader.from_spec(spec, max_seq_length=value)
