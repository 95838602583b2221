"""IdTable against the list and dict it replaces: rows, lookups, duplicates, hash collisions, save/load."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from embedrank.retrieval import ids as ids_module
from embedrank.retrieval.ids import IdTable

pytestmark = pytest.mark.kernel_free


def _ids(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.choice(['MED', 'doc', 'ü', '文'])}-{i}-{rng.randint(0, 10**6)}" for i in range(n)]


def test_rows_and_lookups_equal_a_list_and_a_dict_over_many_batches():
    every = _ids(5000)
    table, reference = IdTable(), []
    rng = random.Random(1)
    at = 0
    while at < len(every):  # batches of uneven sizes: runs are made and merged many times
        size = rng.choice([1, 3, 17, 250, 900])
        batch = every[at : at + size]
        assert table.first_duplicate(batch) is None
        table.extend(batch)
        reference += batch
        at += size
    positions = {d: i for i, d in enumerate(reference)}
    assert len(table) == len(reference) and list(table) == reference and table == reference
    assert [table[i] for i in (0, 1, -1, 2500)] == [reference[i] for i in (0, 1, -1, 2500)]
    sample = rng.sample(reference, 300)
    assert table.rows(sample) == [positions[d] for d in sample]
    assert len(table._runs) <= 2 * np.log2(len(table)) + 1  # merged like a log-structured tree
    assert every[10] in table and "not-an-id" not in table
    with pytest.raises(KeyError, match="not-an-id"):
        table.rows(["not-an-id"])
    assert table.first_duplicate(["new", every[42]]) == every[42]
    assert table.first_duplicate(["x", "y", "x"]) == "x"


def test_two_ids_sharing_a_hash_are_told_apart(monkeypatch):
    def collide(ids):  # every id hashes to one of two values: lookups must compare the ids themselves
        return np.array([len(d) % 2 for d in ids], dtype=np.uint64)

    monkeypatch.setattr(ids_module, "hash_ids", collide)
    table = IdTable(["a", "b", "cc", "dd"])
    table.extend(["e", "ff"])
    assert table.rows(["dd", "a", "e", "ff", "b"]) == [3, 0, 4, 5, 1]
    assert table.first_duplicate(["g", "hh"]) is None
    assert table.first_duplicate(["g", "b"]) == "b" and table.first_duplicate(["g", "i", "g"]) == "g"


def test_save_load_and_the_older_json_list(tmp_path):
    table = IdTable(_ids(1000))
    table.save(tmp_path)
    back = IdTable.load(tmp_path)
    assert back == table and back.rows([table[7], table[999]]) == [7, 999]
    old = tmp_path / "old"
    old.mkdir()
    (old / "ids.json").write_text(json.dumps(list(table)))
    assert IdTable.load(old) == table


def test_an_id_costs_its_bytes_and_24_more():
    every = _ids(20000)
    table = IdTable(every)
    text = sum(len(d.encode()) for d in every)
    assert table.nbytes <= text + 24 * len(every) + 64
