"""The sample of real texts shipped with the package: what it holds, where it is documented to come from, and
that calibration, ``auto`` and ranges use it whatever the data directory holds."""

from __future__ import annotations

import json
import re
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from embedrank.runtime.exports import CALIBRATION_SIZE, calibration_texts
from embedrank.texts import SAMPLE_FILE, SAMPLE_NAME, packaged_sample

pytestmark = pytest.mark.kernel_free

ROOT = Path(__file__).resolve().parents[2]
NOTICE = SAMPLE_FILE.with_name("NOTICE.md")


def rows() -> list[dict[str, str]]:
    return [json.loads(line) for line in SAMPLE_FILE.read_text(encoding="utf-8").splitlines()]


def test_the_sample_is_small_real_varied_and_mixed_in_any_prefix():
    sample = rows()
    assert SAMPLE_FILE.stat().st_size < 300 * 1024
    texts = [r["text"] for r in sample]
    assert len(texts) == len(set(texts)) == 800 and texts == packaged_sample()
    kinds = Counter(r["kind"] for r in sample)
    assert kinds == {"passage": 240, "question": 150, "definition": 220, "example": 190}
    words = {kind: sorted(len(r["text"].split()) for r in sample if r["kind"] == kind) for kind in kinds}
    assert words["passage"][len(words["passage"]) // 2] >= 100 and words["question"][-1] <= 25
    for row in sample:  # prose: no reStructuredText left behind, and it ends as a sentence does
        text = row["text"]
        assert row["source"].startswith("wordnet") or not re.search(r"[`|]|\.\. [a-z-]+::", text), text
        assert text[-1] in ".?!\"')", text
    first = Counter(r["kind"] for r in sample[:64])  # auto's 64 check texts cover every kind
    assert set(first) == set(kinds)


def test_every_source_is_documented_with_its_licence_and_installed_with_the_package():
    notice = NOTICE.read_text(encoding="utf-8")
    counts = Counter(r["source"] for r in rows())
    for source, n in counts.items():
        assert re.search(rf"^\| `{source}` \| {n} \|", notice, re.M), source
    for licence in (
        "PSF LICENSE AGREEMENT",
        "BSD 3-Clause License",
        "WordNet 3.0 Copyright 2006 by Princeton University",
    ):
        assert licence.lower() in notice.lower()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {ROOT / "embedrank" / name for name in package_data["embedrank"]}
    assert {SAMPLE_FILE, NOTICE} <= shipped


def test_calibration_defaults_to_the_sample_whatever_the_data_directory_holds(tmp_path, monkeypatch):
    scifact = tmp_path / "scifact"
    scifact.mkdir()
    (scifact / "corpus.jsonl").write_text('{"_id": "1", "title": "", "text": "a SciFact passage"}\n' * 3)
    (scifact / "queries.jsonl").write_text('{"_id": "1", "text": "a SciFact query"}\n' * 3)
    monkeypatch.setenv("EMBEDRANK_DATA", str(tmp_path))
    texts, source = calibration_texts(None)
    assert source == f"{SAMPLE_NAME} ({CALIBRATION_SIZE} of 800 texts)"
    assert len(texts) == CALIBRATION_SIZE and set(texts) <= set(packaged_sample())
    assert calibration_texts(lambda: None) == (texts, source)  # a provider with nothing to give: the same
    own, named = calibration_texts(["my first text", "my second text"])
    assert own == ["my first text", "my second text"] and named == "2 of 2 texts given"


@pytest.mark.parametrize("kind", ["passage", "question", "definition", "example"])
def test_one_kind_of_the_sample(kind):
    picked = packaged_sample(kind)
    assert picked and all(r["kind"] == kind for r in rows() if r["text"] in set(picked))
