"""Corpus embedding as a job: parquet shards plus a manifest, streaming and resumable.

Output directory layout (the same whatever runner produced it):

- ``part-00000.parquet``, ``part-00001.parquet``, ...: columns ``id`` (string) and ``embedding``
  (list of float32), ``shard_size`` documents each (the last one fewer), in corpus order;
- ``manifest.json``: the embedding signature (model id, dimension, pooling, normalization, window, document
  prompt, precision: :class:`~embedrank.models.signature.EmbeddingSignature`), shard size, the
  corpus file and its size, and per shard its file and document count; written when the job ends.

The local runner (:func:`embed_collection`) reads ``corpus.jsonl`` line by line and keeps one shard in
memory, so memory does not grow with the corpus. A shard is written to a temporary name and renamed when
complete; a rerun after a crash finds the shards already written (``job.json`` says which model and shard
size they were made with, and a rerun with other settings is refused) and encodes only the rest.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from embedrank.errors import IndexMismatchError, InvalidInputError
from embedrank.models.encoder import Encoder
from embedrank.models.signature import EmbeddingSignature
from embedrank.retrieval.data import doc_text

MANIFEST, JOB = "manifest.json", "job.json"


def iter_corpus(path: str | Path) -> Iterator[tuple[str, str]]:
    """``(id, title + " " + text)`` of each document of a BEIR ``corpus.jsonl`` (or a parquet file with
    columns ``_id``, ``text`` and optionally ``title``), streamed."""
    if str(path).endswith(".parquet"):
        yield from _iter_parquet(path)
        return
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    record = json.loads(line)
                    yield str(record["_id"]), doc_text(record)
                except (json.JSONDecodeError, KeyError) as exc:
                    raise InvalidInputError(f"{path}:{number}: not a BEIR corpus record ({exc})") from None


def _iter_parquet(path: str | Path) -> Iterator[tuple[str, str]]:
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)
    names = set(file.schema_arrow.names)
    if not {"_id", "text"} <= names:
        raise InvalidInputError(f"{path}: a parquet corpus needs columns _id and text (it has {sorted(names)})")
    columns = ["_id", "text"] + (["title"] if "title" in names else [])
    for batch in file.iter_batches(columns=columns, batch_size=4096):
        for record in batch.to_pylist():
            yield str(record["_id"]), doc_text(record)


def corpus_file(corpus: str | Path) -> Path:
    """The corpus file of a collection directory (``corpus.jsonl``, else ``corpus.parquet``), or ``corpus``."""
    path = Path(corpus)
    if path.is_dir():
        path = next(
            (path / n for n in ("corpus.jsonl", "corpus.parquet") if (path / n).is_file()), path / "corpus.jsonl"
        )
    if not path.is_file():
        raise InvalidInputError(f"no corpus at {path}")
    return path


def _shards(docs: Iterator[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    shard: list[tuple[str, str]] = []
    for doc in docs:
        shard.append(doc)
        if len(shard) == size:
            yield shard
            shard = []
    if shard:
        yield shard


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def write_shard(path: Path, ids: list[str], vectors: np.ndarray) -> None:
    """Write one shard atomically (temporary file, then rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), type=pa.float32())
    offsets = pa.array(np.arange(0, vectors.size + 1, vectors.shape[1], dtype=np.int32))
    table = pa.table({"id": pa.array(ids, type=pa.string()), "embedding": pa.ListArray.from_arrays(offsets, flat)})
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def read_shard(path: str | Path, dimension: int) -> tuple[list[str], np.ndarray]:
    """The ids and vectors ``(n, dimension)`` float32 of one shard."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    flat = table.column("embedding").combine_chunks().flatten().to_numpy()
    return table.column("id").to_pylist(), flat.reshape(len(table), dimension).astype(np.float32, copy=False)


def read_embeddings(directory: str | Path) -> tuple[list[str], np.ndarray]:
    """All ids and vectors ``(N, D)`` float32 of a finished job directory, in corpus order."""
    root = Path(directory)
    manifest = read_manifest(root)
    dimension = manifest["signature"]["dimension"]
    ids: list[str] = []
    parts = []
    for shard in manifest["shards"]:
        shard_ids, vectors = read_shard(root / shard["file"], dimension)
        ids += shard_ids
        parts.append(vectors)
    vectors = np.vstack(parts) if parts else np.empty((0, dimension), dtype=np.float32)
    return ids, vectors.astype(np.float32, copy=False)


def job_spec(
    encoder: Encoder, corpus: Path, shard_size: int, *, signature: EmbeddingSignature | None = None
) -> dict[str, Any]:
    """What a job directory's shards depend on; a rerun must match it to reuse them (``job.json``): the
    embedding signature (:class:`~embedrank.models.signature.EmbeddingSignature`; ``signature`` when the
    vectors are computed elsewhere than ``encoder``, such as by GPU workers in half precision), where the
    model's files are, the shard size and the corpus."""
    return {
        "signature": (signature or EmbeddingSignature.of(encoder)).to_dict(),
        "model_path": encoder.spec.path,
        "shard_size": shard_size,
        "corpus": str(corpus),
        "corpus_bytes": corpus.stat().st_size,
    }


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """A finished job's ``manifest.json`` (``IndexMismatchError`` when the directory holds none)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise IndexMismatchError(f"{directory} holds no finished embedding job (no {MANIFEST})")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class JobResult:
    directory: Path
    documents: int
    shards_written: int  # by this run
    shards_reused: int  # found complete from an earlier run


def embed_collection(
    encoder: Encoder,
    corpus: str | Path,
    output: str | Path,
    *,
    shard_size: int = 10_000,
    batch_size: int = 64,
    on_shard: Callable[[int], None] | None = None,
) -> JobResult:
    """Embed a BEIR ``corpus.jsonl`` (or the collection directory holding it) into ``output`` (module
    docstring). ``on_shard(i)`` runs after shard ``i`` is written (progress, tests)."""
    from tqdm.auto import tqdm

    path = corpus_file(corpus)
    out = Path(output)
    spec = open_job(job_spec(encoder, path, shard_size), out)
    shards, written, reused, total = [], 0, 0, 0
    with tqdm(desc="Embedding corpus", unit="doc") as bar:
        for index, shard in enumerate(_shards(iter_corpus(path), shard_size)):
            file = out / shard_name(index)
            if not file.is_file():
                ids = [doc_id for doc_id, _ in shard]
                vectors = encoder.encode_document(
                    [text for _, text in shard], batch_size=batch_size, show_progress=False
                )
                write_shard(file, ids, vectors)
                written += 1
            else:
                reused += 1
            shards.append({"file": file.name, "documents": len(shard)})
            total += len(shard)
            bar.update(len(shard))
            if on_shard is not None:
                on_shard(index)
    write_manifest(out, spec, shards)
    return JobResult(out, total, written, reused)


def open_job(spec: dict[str, Any], out: Path) -> dict[str, Any]:
    """Create ``out`` and its ``job.json``, or check that the job already there was made with ``spec``."""
    if spec["shard_size"] < 1:
        raise InvalidInputError(f"shard_size must be >= 1, got {spec['shard_size']}")
    out.mkdir(parents=True, exist_ok=True)
    job_file = out / JOB
    if job_file.is_file():
        previous = json.loads(job_file.read_text())
        if previous != spec:
            changed = sorted(k for k in spec if previous.get(k) != spec[k])
            raise InvalidInputError(
                f"{out} holds a job made with other settings ({', '.join(changed)}); use a new output"
            )
    else:
        job_file.write_text(json.dumps(spec, indent=2))
    return spec


def write_manifest(out: Path, spec: dict[str, Any], shards: list[dict[str, Any]]) -> None:
    """The finished job's ``manifest.json``: its settings, the document count and each shard's file and count."""
    total = sum(s["documents"] for s in shards)
    manifest = {k: v for k, v in spec.items() if k != "model_path"} | {"documents": total, "shards": shards}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))


def completed_shards(out: Path) -> list[Path]:
    """The leading run of complete shard files of an interrupted job (a shard is written atomically)."""
    done: list[Path] = []
    while (out / shard_name(len(done))).is_file():
        done.append(out / shard_name(len(done)))
    return done
