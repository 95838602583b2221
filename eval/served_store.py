"""A BEIR collection searched through a served vector store (OpenAI's Vector Stores API, with the openai SDK):
the corpus uploaded (one JSON Lines file whose lines become documents, their ids as the attribute ``_id``, or one
file a document), a store created over it, every query searched, and the results read back as a run (a
document scores as its best chunk), so ``eval/run.py --served-store URL`` scores it like any other system.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from embedrank.retrieval.data import BeirDataset
from embedrank.types import Run

MAX_RESULTS = 50
"""Chunks a search returns at most (OpenAI's bound): a run holds the distinct documents among them."""


def parse_chunking(text: str) -> dict[str, Any] | None:
    """``auto`` (None: the server's), or ``static:SIZE:OVERLAP`` as OpenAI's chunking strategy.

    >>> parse_chunking("static:254:32")
    {'type': 'static', 'static': {'max_chunk_size_tokens': 254, 'chunk_overlap_tokens': 32}}
    """
    if text == "auto":
        return None
    kind, _, rest = text.partition(":")
    size, _, overlap = rest.partition(":")
    if kind != "static" or not size.isdigit() or not overlap.isdigit():
        raise ValueError(f"chunking must be auto or static:SIZE:OVERLAP, got {text!r}")
    return {"type": "static", "static": {"max_chunk_size_tokens": int(size), "chunk_overlap_tokens": int(overlap)}}


def upload_corpus(
    client: Any, dataset: BeirDataset, layout: Literal["jsonl", "files"]
) -> tuple[list[str], dict[str, str]]:
    """The corpus as uploaded files (``purpose="assistants"``): their ids, and each file's document id when a file
    is a document."""
    if layout == "jsonl":
        lines = "".join(
            json.dumps({"_id": doc_id, "title": doc.get("title", ""), "text": doc.get("text", "")}) + "\n"
            for doc_id, doc in dataset.corpus.items()
        )
        made = client.files.create(file=(f"{dataset.name}.jsonl", lines.encode()), purpose="assistants")
        return [made.id], {}
    by_file: dict[str, str] = {}
    for doc_id, doc in dataset.corpus.items():
        text = "\n".join(part for part in (doc.get("title", ""), doc.get("text", "")) if part)
        made = client.files.create(file=(f"{doc_id}.txt", text.encode()), purpose="assistants")
        by_file[made.id] = doc_id
    return list(by_file), by_file


def create_store(
    client: Any,
    file_ids: list[str],
    *,
    name: str,
    first_stage: str,
    chunking: dict[str, Any] | None,
    model: str | None = None,
    sparse_model: str | None = None,
    hybrid_weights: dict[str, float] | None = None,
    timeout: float = 3600.0,
) -> str:
    """A store over ``file_ids`` (embedded by ``model`` and, if named, the SPLADE ``sparse_model``; its hybrid
    fusing the stages ``hybrid_weights`` names, if given), once every file is read; its id."""
    extra: dict[str, Any] = {"first_stage": first_stage, **({"model": model} if model else {})}
    if sparse_model:
        extra["sparse_model"] = sparse_model
    if hybrid_weights:
        extra["hybrid_weights"] = hybrid_weights
    store = client.vector_stores.create(
        name=name, extra_body=extra, **({"chunking_strategy": chunking} if chunking else {})
    )
    for first in range(0, len(file_ids), 500):
        client.vector_stores.file_batches.create(store.id, file_ids=file_ids[first : first + 500])
    deadline = time.monotonic() + timeout
    while True:
        counts = client.vector_stores.retrieve(store.id).file_counts
        if counts.in_progress == 0:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"vector store {store.id} still reading files after {timeout:.0f} s: {counts}")
        time.sleep(0.2)
    if counts.failed or counts.cancelled:
        raise RuntimeError(f"vector store {store.id}: {counts.failed} files failed, {counts.cancelled} cancelled")
    return str(store.id)


def search_run(
    client: Any,
    store_id: str,
    queries: dict[str, str],
    *,
    ranker: str = "none",
    first_stage: str | None = None,
    by_file: dict[str, str] | None = None,
    concurrency: int = 4,
) -> Run:
    """Every query searched in the store (by ``first_stage``, default the store's): each document's best chunk
    among the top :data:`MAX_RESULTS`."""
    extra = {"first_stage": first_stage} if first_stage else None

    def one(query: str) -> dict[str, float]:
        page = client.vector_stores.search(
            store_id, query=query, max_num_results=MAX_RESULTS, ranking_options={"ranker": ranker}, extra_body=extra
        )
        docs: dict[str, float] = {}
        for hit in page.data:
            doc = by_file[hit.file_id] if by_file else str((hit.attributes or {})["_id"])
            docs.setdefault(doc, hit.score)  # results come best first: a document's first chunk is its best
        return docs

    ids = list(queries)
    with ThreadPoolExecutor(concurrency) as threads:
        return dict(zip(ids, threads.map(one, [queries[q] for q in ids]), strict=True))
