"""The Ray runner of the corpus embedding job: Ray Data reads the corpus and an actor pool of encoders embeds it.

The output is the local runner's (:mod:`embedrank.retrieval.embed_job`): the same parquet shards, in corpus
order, the same ``job.json`` and ``manifest.json``; either runner can resume the other's job.

How it runs:

- ``ray.data.read_text`` (BEIR ``corpus.jsonl``) or ``ray.data.read_parquet`` reads the corpus in blocks;
  a stateless task turns each block into ``(id, title + " " + text)`` and drops the documents whose shard an
  earlier run already wrote;
- ``map_batches`` with an actor pool (``concurrency`` actors, ``num_cpus`` each, one model load per actor;
  with ``device="cuda"``, one GPU each) embeds them; order is preserved (``DataContext.execution_options.preserve_order``);
- the driver streams the embedded rows (``iter_batches``) into shards of ``shard_size`` and writes each one
  atomically as soon as it is full: the driver holds at most one shard.

Failures: an actor that dies (a killed or crashed process, a lost node) is restarted and its task retried
(Ray Data's actor pools restart actors and retry their tasks without limit). A retried task recomputes its
whole block and the block's rows come out once, so no document is lost or duplicated. An exception raised by
the code (a bad record, a model error) is not retried, since it would fail again: the job stops with it, and
a rerun resumes after the last shard written.

Ray is the optional extra ``embedrank[ray]``; nothing else in embedrank imports this module.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from embedrank.errors import EmbedrankError, InvalidInputError
from embedrank.models.encoder import Encoder
from embedrank.models.signature import EmbeddingSignature
from embedrank.retrieval.data import doc_text
from embedrank.retrieval.embed_job import (
    JobResult,
    completed_shards,
    corpus_file,
    job_spec,
    open_job,
    shard_name,
    write_manifest,
    write_shard,
)
from embedrank.runtime.exports import gpu_runtime

BatchHook = Callable[[list[str]], None]


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise EmbedrankError("the Ray runner needs Ray: pip install 'embedrank[ray]'") from None
    return ray


def _cluster_cpus(ray: Any) -> tuple[float, float]:
    """(CPUs in the cluster, CPUs of its largest node), as Ray counts them now."""
    nodes = [n.get("Resources", {}).get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]
    return float(ray.cluster_resources().get("CPU", 0.0)), float(max(nodes, default=0.0))


def actor_plan(
    cpus: tuple[float, float], concurrency: int | None, num_cpus: float | None, *, reserve: float
) -> tuple[int, float]:
    """How many encoder actors of how many CPUs each, so that ``reserve`` CPUs stay free for the read tasks.

    Args:
        cpus: (CPUs in the cluster, CPUs of its largest node).
        concurrency: the caller's choice of actors; None: one per CPU left after ``reserve`` (rounded).
        num_cpus: the caller's CPUs per actor; None: the CPUs left after ``reserve``, shared equally.
        reserve: CPUs the read and parse tasks need beside the actors.

    Returns:
        ``(concurrency, num_cpus)``.

    Raises:
        InvalidInputError: the actors and the reserve do not fit the cluster, or one actor does not fit
            its largest node (Ray would wait for them forever).

    Examples:
        >>> actor_plan((2.0, 2.0), None, None, reserve=0.25)
        (2, 0.87)
        >>> actor_plan((16.0, 8.0), None, 2.0, reserve=0.25)
        (7, 2.0)
        >>> actor_plan((2.0, 2.0), 2, 1.0, reserve=0.25)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        embedrank.errors.InvalidInputError: 2 actors x 1 CPU + 0.25 CPU for reading = 2.25 CPUs, but the cluster has 2 ...
    """
    total, largest = cpus
    free = total - reserve
    if concurrency is None:
        concurrency = max(1, int(free // num_cpus) if num_cpus else round(free))
    if num_cpus is None:
        num_cpus = max(0.01, min(largest, int(free / concurrency * 100) / 100))
    need = concurrency * num_cpus + reserve
    if need > total + 1e-9 or num_cpus > largest + 1e-9:
        raise InvalidInputError(
            f"{concurrency} actors x {num_cpus:g} CPU + {reserve:g} CPU for reading = {need:g} CPUs, but the "
            f"cluster has {total:g} (largest node {largest:g}); Ray would wait for them forever: lower "
            f"concurrency or num_cpus, or leave them unset to size them from the cluster"
        )
    return concurrency, num_cpus


def _parse_lines(batch: dict[str, np.ndarray], skip: frozenset[str]) -> dict[str, np.ndarray]:
    """A block of ``corpus.jsonl`` lines -> ``id``/``text`` columns, without the ids in ``skip``."""
    ids, texts = [], []
    for line in batch["text"]:
        try:
            record = json.loads(line)
            doc_id = str(record["_id"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InvalidInputError(f"not a BEIR corpus record ({exc}): {str(line)[:80]!r}") from None
        if doc_id not in skip:
            ids.append(doc_id)
            texts.append(doc_text(record))
    return {"id": np.array(ids, dtype=object), "text": np.array(texts, dtype=object)}


def _parse_records(batch: dict[str, np.ndarray], skip: frozenset[str]) -> dict[str, np.ndarray]:
    """A block of a parquet corpus (``_id``, ``text``, optional ``title``) -> ``id``/``text`` columns."""
    titles = batch.get("title", [""] * len(batch["_id"]))
    rows = [
        (str(i), doc_text({"title": t or "", "text": x or ""}))
        for i, t, x in zip(batch["_id"], titles, batch["text"], strict=True)
        if str(i) not in skip
    ]
    return {"id": np.array([r[0] for r in rows], dtype=object), "text": np.array([r[1] for r in rows], dtype=object)}


def gpu_plan(gpus: float, concurrency: int | None, num_cpus: float | None) -> tuple[int, float]:
    """``(actors, CPUs per actor)`` for actors of one GPU each on a cluster with ``gpus`` GPUs: one actor per
    GPU unless ``concurrency`` says fewer, 1 CPU each (tokenizing for its GPU) unless ``num_cpus`` says.

    >>> gpu_plan(4, None, None)
    (4, 1.0)
    >>> gpu_plan(0, None, None)
    Traceback (most recent call last):
    ...
    embedrank.errors.InvalidInputError: device 'cuda' gives each Ray actor one GPU, and this cluster has none
    """
    whole = int(gpus)
    if whole < 1:
        raise InvalidInputError("device 'cuda' gives each Ray actor one GPU, and this cluster has none", param="device")
    if concurrency is not None and concurrency > whole:
        raise InvalidInputError(
            f"{concurrency} actors of one GPU each, but the cluster has {whole} GPU{'s' if whole > 1 else ''}: "
            "lower concurrency, or leave it unset (one actor per GPU)",
            param="concurrency",
        )
    return concurrency or whole, num_cpus or 1.0


def gpu_signature(encoder: Encoder, options: dict[str, Any]) -> EmbeddingSignature:
    """The signature of the vectors actors on GPUs compute: ``encoder``'s (loaded on the driver's CPU) in the
    backend and precision a GPU runs the model with (:func:`~embedrank.runtime.exports.gpu_runtime`), so a
    job is never resumed with vectors of another precision."""
    backend, precision = gpu_runtime(options.get("backend"), options.get("precision"), encoder.spec)
    signature = EmbeddingSignature.of(encoder)
    if backend == "torch" and precision not in (None, "fp32"):
        signature = dataclasses.replace(signature, precision=f"torch:{precision}")
    return signature


class EncoderActor:
    """One model load per actor; each call embeds one batch of documents."""

    def __init__(
        self, model: str, options: dict[str, Any], threads: int, batch_size: int, on_batch: BatchHook | None
    ) -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        self.encoder = Encoder.from_pretrained(model, **options)
        self.batch_size, self.on_batch = batch_size, on_batch

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = [str(i) for i in batch["id"]]
        if not ids:  # a block whose documents an earlier run already embedded
            return {"id": np.array([], dtype=object), "embedding": np.zeros((0, self.encoder.dimension), np.float32)}
        if self.on_batch is not None:
            self.on_batch(ids)
        vectors = self.encoder.encode_document(
            [str(t) for t in batch["text"]], batch_size=self.batch_size, show_progress=False
        )
        return {"id": np.array(ids, dtype=object), "embedding": np.asarray(vectors, dtype=np.float32)}


def embed_collection_ray(
    model: str,
    corpus: str | Path,
    output: str | Path,
    *,
    model_options: dict[str, Any] | None = None,
    shard_size: int = 10_000,
    batch_size: int = 64,
    rows_per_call: int = 128,
    concurrency: int | None = None,
    num_cpus: float | None = None,
    read_cpus: float = 0.25,
    block_bytes: int = 256 << 10,
    address: str | None = None,
    device: str = "cpu",
    on_batch: BatchHook | None = None,
) -> JobResult:
    """Embed a BEIR ``corpus.jsonl`` or parquet corpus (or the collection directory holding it) into
    ``output`` on Ray (module docstring).

    ``concurrency`` actors of ``num_cpus`` CPUs each encode ``rows_per_call`` documents per call (in
    batches of ``batch_size``); reading and parsing take ``read_cpus`` per task, and a parquet corpus needs
    1 CPU free for Ray's file listing. Left as None, ``concurrency`` and ``num_cpus`` are sized from the
    cluster's CPUs with that room left (:func:`actor_plan`); a plan the cluster cannot schedule is refused
    with the numbers (an :class:`InvalidInputError`) rather than left waiting. Blocks (the unit of work an
    actor takes, and of a retry) are cut at ``block_bytes`` of text. Connects to ``address`` (``"auto"``: the cluster this machine is part of)
    unless Ray is already initialized; with neither, starts a local instance. ``on_batch(ids)`` runs in the
    actor before each call (fault injection in tests).

    ``device="cuda"`` gives each actor one of the cluster's GPUs (one actor per GPU, 1 CPU each, unless
    ``concurrency`` and ``num_cpus`` say otherwise; :func:`gpu_plan`), where the model computes as on any GPU
    (torch in half precision unless ``model_options`` names them); the job's signature records that precision.
    ``"auto"``: GPUs when the cluster has any, else CPUs."""
    if device not in ("cpu", "cuda", "auto"):
        raise InvalidInputError(
            f"on Ray, device is 'cpu', 'cuda' (one GPU per actor) or 'auto', got {device!r}", param="device"
        )
    ray = import_ray()
    if (concurrency is not None and concurrency < 1) or (num_cpus is not None and num_cpus <= 0):
        raise InvalidInputError("concurrency must be >= 1 and num_cpus > 0 (or None: sized from the cluster)")
    if read_cpus < 0 or rows_per_call < 1:
        raise InvalidInputError("rows_per_call must be >= 1 and read_cpus >= 0")
    options = dict(model_options or {})
    path = corpus_file(corpus)
    out = Path(output)
    # the job's settings, and a fast failure on a bad model, on the driver's CPU (fp16 runs on a GPU only)
    checked = {k: v for k, v in options.items() if not (k == "precision" and v == "fp16")}
    encoder = Encoder.from_pretrained(model, **checked)
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    gpus = float(ray.cluster_resources().get("GPU", 0.0))
    on_gpus = device == "cuda" or (device == "auto" and gpus >= 1)
    try:
        if on_gpus:
            concurrency, num_cpus = gpu_plan(gpus, concurrency, num_cpus)
        else:
            reserve = max(read_cpus, 1.0 if path.suffix == ".parquet" else 0)
            concurrency, num_cpus = actor_plan(_cluster_cpus(ray), concurrency, num_cpus, reserve=reserve)
        signature = gpu_signature(encoder, options) if on_gpus else None
        spec = open_job(job_spec(encoder, path, shard_size, signature=signature), out)
    except EmbedrankError:
        if started:
            ray.shutdown()
        raise
    del encoder
    done = completed_shards(out)
    shards: list[dict[str, Any]] = []
    skip: set[str] = set()
    for file in done:
        import pyarrow.parquet as pq

        ids = pq.read_table(file, columns=["id"]).column("id").to_pylist()
        skip.update(ids)
        shards.append({"file": file.name, "documents": len(ids)})
    if on_gpus:  # inside an actor, Ray makes its one GPU the only visible one: cuda:0
        options["device"] = "cuda"
    from ray.data import DataContext

    ctx = DataContext.get_current()
    saved = (ctx.execution_options.preserve_order, ctx.target_max_block_size)
    ctx.execution_options.preserve_order = True
    # small blocks (a few hundred documents), so that even one corpus file spreads over every actor
    ctx.target_max_block_size = block_bytes
    try:
        if path.suffix == ".parquet":
            ds = ray.data.read_parquet(str(path), num_cpus=read_cpus)
        else:
            ds = ray.data.read_text(str(path), num_cpus=read_cpus)
        ds = ds.map_batches(
            _parse_records if path.suffix == ".parquet" else _parse_lines,
            fn_kwargs={"skip": frozenset(skip)},
            batch_format="numpy",
            num_cpus=read_cpus,
        )
        ds = ds.map_batches(
            EncoderActor,
            fn_constructor_kwargs={
                "model": model,
                "options": options,
                "threads": max(1, round(num_cpus)),
                "batch_size": batch_size,
                "on_batch": on_batch,
            },
            batch_size=rows_per_call,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=concurrency),
            num_cpus=num_cpus,
            num_gpus=1 if on_gpus else 0,
        )
        written = _write_stream(ds, out, shard_size, first=len(done), shards=shards)
    finally:
        ctx.execution_options.preserve_order, ctx.target_max_block_size = saved
        if started:
            ray.shutdown()
    write_manifest(out, spec, shards)
    return JobResult(out, sum(int(s["documents"]) for s in shards), written, len(done))


def _write_stream(ds: Any, out: Path, shard_size: int, *, first: int, shards: list[dict[str, Any]]) -> int:
    """Cut the ordered stream of embedded rows into shards ``first, first + 1, ...``; returns how many."""
    from tqdm.auto import tqdm

    ids: list[str] = []
    parts: list[np.ndarray] = []
    pending = written = 0

    def flush(n: int) -> None:
        nonlocal ids, parts, pending, written
        vectors = np.vstack(parts)
        file = out / shard_name(first + written)
        write_shard(file, ids[:n], vectors[:n])
        shards.append({"file": file.name, "documents": n})
        ids, parts, pending = ids[n:], [vectors[n:]], pending - n
        written += 1

    with tqdm(desc="Embedding corpus (ray)", unit="doc") as bar:
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            ids += [str(i) for i in batch["id"]]
            parts.append(np.asarray(batch["embedding"], dtype=np.float32).reshape(len(batch["id"]), -1))
            pending += len(batch["id"])
            bar.update(len(batch["id"]))
            while pending >= shard_size:
                flush(shard_size)
        if pending:
            flush(pending)
    return written
