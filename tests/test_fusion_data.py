"""Fusion, BEIR loading and the demo collection; no model needed."""

from __future__ import annotations

import copy

import pytest

from embedrank.errors import DataNotFoundError, InvalidInputError
from embedrank.math.fusion import reciprocal_rank_fusion, score_fusion, top_k
from embedrank.retrieval.data import (
    DEMO_QRELS,
    load_beir,
    load_trec_run,
    resolve_dataset,
    write_demo_collection,
    write_trec_run,
)


def test_fusion_does_not_mutate_and_is_deterministic():
    a = {"q": {"x": 3.0, "y": 1.0, "z": 1.0}}
    b = {"q": {"y": 0.2, "w": 0.9}}
    snapshot = copy.deepcopy((a, b))
    rrf = reciprocal_rank_fusion([a, b], k=60)
    assert rrf["q"]["y"] == pytest.approx(1 / 62 + 1 / 62)
    fused = score_fusion(a, b, weight=0.7, normalization="zscore")
    assert set(fused["q"]) == {"w", "x", "y", "z"}
    assert (a, b) == snapshot
    assert list(top_k({"q": {"b": 1.0, "a": 1.0, "c": 0.5}}, 2)["q"]) == ["a", "b"]
    with pytest.raises(InvalidInputError):
        score_fusion(a, b, weight=1.5)


def test_demo_collection_roundtrip(tmp_path):
    root = write_demo_collection(tmp_path)
    ds = load_beir(root)
    assert ds.qrels == DEMO_QRELS
    assert set(ds.queries) == set(DEMO_QRELS)
    assert ds.doc_text("d2").startswith("Seasons Earth's")
    run = {"q1": {"d2": 2.0, "d1": 1.0}}
    write_trec_run(run, tmp_path / "x.run")
    assert load_trec_run(tmp_path / "x.run") == run


def test_missing_dataset_message_says_how_to_get_it(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        resolve_dataset("fiqa", data_dir=tmp_path)
    msg = str(info.value)
    assert "fiqa" in msg and "fiqa.zip" in msg and str(tmp_path) in msg and "corpus.jsonl" in msg


def test_missing_split(tmp_path):
    root = write_demo_collection(tmp_path)
    with pytest.raises(DataNotFoundError, match="train"):
        load_beir(root, split="train")
