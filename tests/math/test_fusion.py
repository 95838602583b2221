"""Fusion, BEIR loading and the demo collection; no model needed."""

from __future__ import annotations

import copy

import pytest

from embedrank.errors import DataNotFoundError, InvalidInputError
from embedrank.math.fusion import reciprocal_rank_fusion, score_fusion
from embedrank.math.metrics import evaluate
from embedrank.math.ranking import ranked_ids, top_k
from embedrank.retrieval.data import (
    DEMO_QRELS,
    load_beir,
    load_trec_run,
    resolve_dataset,
    write_demo_collection,
    write_trec_run,
)
from embedrank.retrieval.pipeline import PipelineResult

pytestmark = pytest.mark.kernel_free


def test_fusion_does_not_mutate_and_is_deterministic():
    a = {"q": {"x": 3.0, "y": 1.0, "z": 1.0}}
    b = {"q": {"y": 0.2, "w": 0.9}}
    snapshot = copy.deepcopy((a, b))
    rrf = reciprocal_rank_fusion([a, b], k=60)
    assert rrf["q"]["y"] == pytest.approx(1 / 63 + 1 / 62)  # tied with z in a, ranked after it (trec_eval order)
    fused = score_fusion(a, b, weight=0.7, normalization="zscore")
    assert set(fused["q"]) == {"w", "x", "y", "z"}
    assert (a, b) == snapshot
    assert list(top_k({"q": {"b": 1.0, "a": 1.0, "c": 0.5}}, 2)["q"]) == ["b", "a"]
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


def test_ties_break_the_trec_eval_way_everywhere(tmp_path):
    """One order for tied documents in fusion, top_k, run files, pipeline frames and metrics: doc id descending."""
    import pytrec_eval

    run = {"q": {"d1": 1.0, "d2": 1.0, "d3": 1.0, "d0": 2.0}}
    assert ranked_ids(run["q"]) == ["d0", "d3", "d2", "d1"]
    assert list(top_k(run, 2)["q"]) == ["d0", "d3"]
    # RRF gives the tied documents distinct ranks in that order, so d3 outranks d1
    rrf = reciprocal_rank_fusion([run], k=1)["q"]
    assert rrf["d3"] > rrf["d2"] > rrf["d1"]
    write_trec_run(run, tmp_path / "r.trec")
    lines = [ln.split() for ln in (tmp_path / "r.trec").read_text().splitlines()]
    assert [(ln[2], ln[3]) for ln in lines] == [("d0", "1"), ("d3", "2"), ("d2", "3"), ("d1", "4")]
    frame = PipelineResult(run=run, first_stage_run=run, timings={}).to_frame()
    assert frame["doc_id"].tolist() == ["d0", "d3", "d2", "d1"]
    # the metric sees the same order as trec_eval itself: d1 (the only relevant one) at rank 4
    qrels = {"q": {"d1": 1}}
    assert evaluate(qrels, run, ["mrr@10"])["mrr@10"] == pytest.approx(0.25)
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)["q"]["recip_rank"]
    assert ref == pytest.approx(0.25)
