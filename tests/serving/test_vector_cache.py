"""The embedding cache: a cached request answers exactly as an uncached one (vectors, token counts, truncation
flags, errors), computes each missing text once, stays within its size by evicting the least recently
used, never serves the vectors of other weights, and never fails a request when it cannot be used."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedrank.errors import InputTooLongError, RequestTooLargeError
from embedrank.serving import vector_cache
from embedrank.serving.engine import EngineConfig
from embedrank.serving.options import EmbedOptions
from embedrank.serving.pool import ModelEntry, ModelPool
from embedrank.serving.vector_cache import ENTRY_OVERHEAD, CachedVector, VectorCache, cache_key
from embedrank.testing.tiny import tiny_model

TEXTS = ["green tea", "black coffee with milk", "green tea", "a cup of cocoa " * 40, "sparkling water"]


async def embed_with(pool: ModelPool, texts: Sequence[str], *, sparse: bool = False, **options: Any) -> Any:
    """``texts`` through the pool's one model: its dense vectors (``embed``), or its ``sparse`` ones."""
    pool.start(pool.load(), EngineConfig(max_wait_ms=1))
    try:
        model = pool.get(next(iter(pool.entries)), "embeddings")
        return await (model.sparse if sparse else model.embed)(texts, EmbedOptions(**options))
    finally:
        await pool.drain(1.0)


def fake_pool(cache: VectorCache | None) -> ModelPool:
    return ModelPool((ModelEntry(id="enc", path="fake:encoder"),), cache=cache)


@pytest.mark.parametrize(
    "options",
    [{}, {"input_type": "search_query"}, {"truncation_side": "left"}, {"dimensions": 8}, {"types": ("int8",)}],
    ids=["plain", "query", "left", "dimensions", "int8"],
)
def test_a_cached_request_answers_as_an_uncached_one(tmp_path, options):
    cache = VectorCache(tmp_path / "cache.db", 1 << 20)
    direct = asyncio.run(embed_with(fake_pool(None), TEXTS, **options))
    first = asyncio.run(embed_with(fake_pool(cache), TEXTS, cached=True, **options))
    assert (cache.hits, cache.misses) == (0, 5) and cache.stats()[0] == 4  # "green tea" twice, computed once
    again = asyncio.run(embed_with(fake_pool(cache), TEXTS, cached=True, **options))
    assert (cache.hits, cache.misses) == (5, 5)
    for out in (first, again):
        np.testing.assert_array_equal(out.output.embeddings, direct.output.embeddings)
        assert out.output.token_counts == direct.output.token_counts
        assert out.output.truncated == direct.output.truncated and any(out.output.truncated)
        assert out.compact.keys() == direct.compact.keys()
        for name, values in out.compact.items():
            np.testing.assert_array_equal(values, direct.compact[name])


def test_requests_that_do_not_ask_for_the_cache_leave_it_alone_and_errors_stay(tmp_path):
    cache = VectorCache(tmp_path / "cache.db", 1 << 20)
    asyncio.run(embed_with(fake_pool(cache), TEXTS))
    assert (cache.hits, cache.misses) == (0, 0) and not (tmp_path / "cache.db").exists()
    asyncio.run(embed_with(fake_pool(cache), TEXTS[:2], cached=True))
    with pytest.raises(InputTooLongError) as refused:  # the same error, naming the same input, as uncached
        asyncio.run(embed_with(fake_pool(cache), TEXTS, cached=True, truncate=False))
    with pytest.raises(InputTooLongError) as direct:
        asyncio.run(embed_with(fake_pool(None), TEXTS, truncate=False))
    assert (refused.value.param, str(refused.value)) == (direct.value.param, str(direct.value))
    assert "input 3" in str(direct.value) or "input[3]" in str(direct.value), str(direct.value)
    budget = sum(asyncio.run(embed_with(fake_pool(None), TEXTS)).output.token_counts) - 1  # one token too many
    asyncio.run(embed_with(fake_pool(cache), TEXTS, cached=True))  # every text cached now
    with pytest.raises(RequestTooLargeError) as refused:
        asyncio.run(embed_with(fake_pool(cache), TEXTS, cached=True, budget=budget))
    with pytest.raises(RequestTooLargeError) as direct:
        asyncio.run(embed_with(fake_pool(None), TEXTS, budget=budget))
    assert str(refused.value) == str(direct.value)


def sparse_pool(cache: VectorCache | None) -> ModelPool:
    return ModelPool((ModelEntry(id="spl", path="fake:sparse"),), cache=cache)


def test_a_splade_model_caches_its_sparse_vectors_and_answers_as_uncached(tmp_path, monkeypatch):
    """SPLADE vectors come from the cache bit for bit (indices, weights, token counts, truncation), a cached text
    is not tokenized again, and a request that would fail fails as it would uncached."""
    from embedrank.testing.fake import FakeSparseEncoder

    cache = VectorCache(tmp_path / "cache.db", 1 << 20)
    direct = asyncio.run(embed_with(sparse_pool(None), TEXTS, sparse=True))
    first = asyncio.run(embed_with(sparse_pool(cache), TEXTS, sparse=True, cached=True))
    assert (cache.hits, cache.misses) == (0, 5) and cache.stats()[0] == 4
    tokenized: list[str] = []
    original = FakeSparseEncoder.tokenize_rows
    monkeypatch.setattr(
        FakeSparseEncoder,
        "tokenize_rows",
        lambda self, texts, **kw: tokenized.extend(texts) or original(self, texts, **kw),
    )
    again = asyncio.run(embed_with(sparse_pool(cache), TEXTS, sparse=True, cached=True))
    assert (cache.hits, cache.misses) == (5, 5) and not tokenized
    for out in (first, again):
        assert out.output.sparse.shape == direct.output.sparse.shape
        assert (out.output.sparse != direct.output.sparse).nnz == 0
        assert out.sparse == direct.sparse and out.output.token_counts == direct.output.token_counts
        assert out.output.truncated == direct.output.truncated and any(out.output.truncated)
    with pytest.raises(InputTooLongError) as refused:
        asyncio.run(embed_with(sparse_pool(cache), TEXTS, sparse=True, cached=True, truncate=False))
    with pytest.raises(InputTooLongError) as uncached:
        asyncio.run(embed_with(sparse_pool(None), TEXTS, sparse=True, truncate=False))
    assert (refused.value.param, str(refused.value)) == (uncached.value.param, str(uncached.value))
    budget = sum(direct.output.token_counts) - 1
    with pytest.raises(RequestTooLargeError) as refused:
        asyncio.run(embed_with(sparse_pool(cache), TEXTS, sparse=True, cached=True, budget=budget))
    with pytest.raises(RequestTooLargeError) as uncached:
        asyncio.run(embed_with(sparse_pool(None), TEXTS, sparse=True, budget=budget))
    assert str(refused.value) == str(uncached.value)
    asyncio.run(
        embed_with(sparse_pool(cache), ["a prompt-free text"], sparse=True, cached=True, input_type="search_query")
    )


def test_a_cached_text_is_not_tokenized_again(tmp_path, monkeypatch):
    from embedrank.testing.fake import FakeEncoder

    cache = VectorCache(tmp_path / "cache.db", 1 << 20)
    asyncio.run(embed_with(fake_pool(cache), TEXTS, cached=True))
    tokenized: list[str] = []
    original = FakeEncoder.tokenize_rows
    monkeypatch.setattr(
        FakeEncoder, "tokenize_rows", lambda self, texts, **kw: tokenized.extend(texts) or original(self, texts, **kw)
    )
    asyncio.run(embed_with(fake_pool(cache), [*TEXTS, "a new text"], cached=True))
    assert "a new text" in tokenized and not set(TEXTS) & set(tokenized)  # (the rest: the int8 ranges' sample)


def test_the_key_is_every_setting_the_vector_depends_on():
    base = cache_key("model|weights=1", "", "right", "a text")
    others = [
        cache_key("model|weights=2", "", "right", "a text"),  # other weights: another signature
        cache_key("model|weights=1", "query: ", "right", "a text"),
        cache_key("model|weights=1", "", "left", "a text"),
        cache_key("model|weights=1", "", "right", "a text "),
        cache_key("model|weights=1", "a", "right", " text"),  # the same characters split otherwise
    ]
    assert len({base, *others}) == 6 and len(base) == 32


def test_the_cache_stays_within_its_size_and_evicts_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setattr(vector_cache, "TOUCH_SECONDS", 0.0)  # every lookup marks its entries used
    vector = np.arange(64, dtype=np.float32)
    entry = 32 + vector.nbytes + ENTRY_OVERHEAD
    cache = VectorCache(tmp_path / "cache.db", max_bytes=100 * entry)
    keys = [cache_key("m", "", "right", str(i)) for i in range(300)]
    cache.put_many([(k, CachedVector(vector + i, 3, False)) for i, k in enumerate(keys[:90])])
    assert cache.stats() == (90, 90 * entry)
    time.sleep(0.01)
    cache.get_many(keys[:10])  # the oldest ten, used again: the next to go are 10..
    time.sleep(0.01)
    cache.put_many([(k, CachedVector(vector + i, 3, False)) for i, k in enumerate(keys[90:120], 90)])
    entries, held = cache.stats()
    assert held <= 100 * entry and entries == held // entry and cache.evictions == 120 - entries
    kept = cache.get_many(keys[:120])
    assert all(k in kept for k in keys[:10] + keys[90:120])  # used again, or newer: kept
    assert sum(k not in kept for k in keys[10:90]) == cache.evictions == 31  # down to 90% of the bound
    np.testing.assert_array_equal(kept[keys[5]].vector, vector + 5)
    assert kept[keys[5]][1:] == (3, False)
    for start in range(120, 300, 20):  # many writes: the bound holds throughout
        cache.put_many([(k, CachedVector(vector, 3, True)) for k in keys[start : start + 20]])
        assert cache.stats()[1] <= 100 * entry
    reopened = VectorCache(tmp_path / "cache.db", max_bytes=100 * entry)  # another process, the same file
    assert reopened.stats() == cache.stats()


def test_a_model_whose_weights_change_gets_new_vectors_never_the_cached_ones(tmp_path):
    path = tmp_path / "model"
    tiny_model("bert", out=path, seed=0)
    cache = VectorCache(tmp_path / "cache.db", 1 << 20)
    pool = lambda cache: ModelPool((ModelEntry(id="enc", path=str(path), backend="torch"),), cache=cache)  # noqa: E731
    before = asyncio.run(embed_with(pool(cache), TEXTS, cached=True)).output.embeddings
    shutil.rmtree(path)
    tiny_model("bert", out=path, seed=1)  # trained again, saved in the same place
    after = asyncio.run(embed_with(pool(cache), TEXTS, cached=True)).output.embeddings
    fresh = asyncio.run(embed_with(pool(None), TEXTS)).output.embeddings
    assert cache.hits == 0 and cache.misses == 10
    np.testing.assert_allclose(after, fresh, atol=1e-6)
    assert not np.allclose(after, before, atol=1e-3)


def test_a_cache_that_cannot_be_used_counts_misses_and_never_fails_a_request(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    cache = VectorCache(tmp_path / "a-file" / "cache.db", 1 << 20)
    out = asyncio.run(embed_with(fake_pool(cache), TEXTS, cached=True))
    direct = asyncio.run(embed_with(fake_pool(None), TEXTS))
    np.testing.assert_array_equal(out.output.embeddings, direct.output.embeddings)
    assert cache.misses == 5 and cache.failures >= 1 and cache.stats() == (0, 0)


def test_the_file_is_created_only_when_used(tmp_path):
    VectorCache(Path(tmp_path) / "sub" / "cache.db", 1 << 20)
    assert not (tmp_path / "sub").exists()
