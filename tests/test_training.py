"""The training entry point on a tiny slice of SciFact's training split (a few steps)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from embedrank.errors import InvalidInputError
from embedrank.training.finetune import FinetuneConfig, finetune, split_queries, training_pairs

pytestmark = pytest.mark.slow


def _tiny(data_dir):
    from embedrank.retrieval.data import load_beir

    ds = load_beir(data_dir / "scifact", split="train")
    queries = sorted(ds.qrels)[:24]
    judged = sorted({d for q in queries for d in ds.qrels[q]})
    others = [d for d in sorted(ds.corpus) if d not in set(judged)][:80]
    keep = set(judged) | set(others)
    return dataclasses.replace(
        ds,
        queries={q: ds.queries[q] for q in queries},
        qrels={q: ds.qrels[q] for q in queries},
        corpus={d: ds.corpus[d] for d in keep},
    )


def test_split_and_pairs_keep_validation_queries_out_of_training(data_dir):
    ds = _tiny(data_dir)
    train, val = split_queries(list(ds.qrels), 0.25, 0)
    assert not set(train) & set(val) and len(val) == 6 and sorted(train + val) == sorted(ds.qrels)
    pairs = training_pairs(ds, train)
    assert len(pairs["anchor"]) == sum(1 for q in train for g in ds.qrels[q].values() if g > 0)
    assert not {ds.queries[q] for q in val} & set(pairs["anchor"])
    with pytest.raises(InvalidInputError, match="validation_fraction"):
        split_queries(["a", "b"], 1.0, 0)


def test_finetune_a_few_steps_saves_a_model_embedrank_loads(data_dir, tmp_path, monkeypatch, encoder):
    from embedrank import Encoder

    monkeypatch.setenv("EMBEDRANK_CACHE", str(tmp_path / "cache"))
    cfg = FinetuneConfig(
        max_steps=2, eval_steps=1, batch_size=8, warmup_ratio=0.0, validation_fraction=0.25, validation_distractors=20
    )
    result = finetune(_tiny(data_dir), tmp_path / "model", cfg)
    assert result.steps == 2 and result.best_validation_ndcg is not None and len(result.history) == 2
    record = json.loads((tmp_path / "model" / "embedrank_training.json").read_text())
    assert record["train_queries"] == 18 and record["validation_queries"] == 6 and record["steps"] == 2
    tuned = Encoder.from_pretrained(str(tmp_path / "model"))
    texts = ["the tilt of the earth causes seasons", "bananas are rich in potassium"]
    after, before = tuned.encode(texts), encoder.encode(texts)
    assert after.shape == before.shape == (2, 384)
    assert np.allclose(np.linalg.norm(after, axis=1), 1, atol=1e-5)
    assert 0.9 < float((after * before).sum(axis=1).min()) < 1 - 1e-6  # moved a little, not destroyed
