"""``backend="auto"`` and ``precision="auto"``: the fastest runtime on this CPU whose outputs stay within the
quality bound, chosen by measuring the candidates at first load, and cached.

Which setting is fastest depends on the CPU: static int8 on OpenVINO is the fastest where the CPU has VNNI
(int8 dot products) and no faster than fp32 where it has AVX2 only; bf16 helps only where the CPU computes
in bf16. So ``auto`` measures instead of assuming.

**Candidates** (:func:`candidates`): every backend and precision the request leaves open that this machine
can run: ``openvino`` fp32, bf16 (only where the CPU has AVX512-BF16 or AMX; elsewhere bf16 computes in f32
and is the fp32 candidate again), int8 (with NNCF installed); ``onnx`` fp32 and int8 (with ONNX Runtime
installed); ``torch`` fp32. ``backend="openvino", precision="auto"`` tries OpenVINO's precisions only;
``backend="auto", precision="fp32"`` the fp32 runtimes only.

**Reference**: the default runtime (``openvino`` fp32, which agrees with torch to 1e-5), or the first
fp32 candidate that loads.

**Measurement** (:func:`choose`), on the calibration texts (the int8 calibration's: by default 300 texts of the
sample of real texts shipped with the package, :func:`~embedrank.texts.packaged_sample`, whatever the data
directory holds; the decision names the sample it was measured on, :attr:`Choice.sample`):

- quality against the reference on :data:`CHECK_TEXTS` texts (:data:`BOUNDS`): an embedding model's pooled,
  normalized vectors must keep the smallest cosine at 0.98 or more, and ranking must agree: with each
  text's first 8 words as a query over the texts, the top 10 overlap the reference's by 0.9 or more on
  average; a cross-encoder's scores (the first 12 words of a text against it and its neighbour) must keep
  Spearman's rho at 0.95 or more;
- speed: a batch of :data:`BATCH` texts at the model's window and a single short text, each candidate
  timed in :data:`ROUNDS` rounds alternating with the reference (R C R C ...); ratios are the medians of
  the reference's time over the candidate's in the same round.

**Choice** (:func:`pick`): the largest geometric mean of the two ratios among the candidates within the
quality bound and not slower than the reference on either workload; the reference always qualifies, so
``auto`` is never slower than the default on what it measured. Candidates are measured one at a time (at
most the reference, the best so far and the one measured are loaded at once).

**Cache**: the decision, with every candidate's figures, is written to ``<cache>/exports/<model>-auto-<key>.json``
(:mod:`embedrank.runtime.exports`), keyed by the model's weights, head, window, candidates, the CPU's model
name and flags, the thread count, the versions of the libraries that run the graphs and the calibration
texts: a later load on the same machine reads it and measures nothing. Delete the file to measure again.
The chosen runtime carries the decision (:attr:`Choice.summary`, ``Encoder.auto_choice``, ``/v1/models``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedrank.errors import UnsupportedModelError
from embedrank.math.pooling import PoolingMode, pool
from embedrank.runtime.backends import AUTO, PRECISIONS, Backend, Head, Precision, Runtime
from embedrank.runtime.cpus import cpu_identity

log = logging.getLogger("embedrank.exports")

RECIPE = 2  # bumped when the measurement or the rule changes, so cached decisions are made again
CHECK_TEXTS = 64  # calibration texts for the quality check
BATCH = 16  # texts in the timed batch
ROUNDS = 3  # alternated timing rounds per candidate
SINGLE_CALLS = 3  # single-text calls per round (their median is the round's figure)
BOUNDS = {"cosine": 0.98, "overlap": 0.9, "rho": 0.95}
REFERENCE: tuple[Backend, Precision] = ("openvino", "fp32")
_ORDER: tuple[tuple[Backend, Precision], ...] = (
    ("openvino", "fp32"),
    ("torch", "fp32"),
    ("onnx", "fp32"),
    ("openvino", "bf16"),
    ("openvino", "int8"),
    ("onnx", "int8"),
)


@dataclasses.dataclass
class Trial:
    """One candidate's figures: ratios to the reference (> 1 is faster), quality, or why it was left out."""

    backend: str
    precision: str
    batch_ratio: float | None = None
    single_ratio: float | None = None
    quality: dict[str, float] = dataclasses.field(default_factory=dict)
    within_bound: bool = False
    excluded: str | None = None  # why it was not measured or not eligible

    @property
    def name(self) -> str:
        return f"{self.backend} {self.precision}"

    @property
    def score(self) -> float:
        """The geometric mean of the two speed ratios (0 without both)."""
        return math.sqrt(self.batch_ratio * self.single_ratio) if self.batch_ratio and self.single_ratio else 0.0


@dataclasses.dataclass
class Choice:
    """What ``auto`` chose, on which CPU, and every candidate's figures."""

    backend: Backend
    precision: Precision
    reference: str
    cpu: str
    threads: int
    measured: str  # UTC date and time of the measurement
    trials: list[Trial]
    sample: str = ""  # the texts measured on (and the int8 exports calibrated on)
    cached: bool = False

    @property
    def summary(self) -> str:
        """One line: the choice and why, e.g. ``openvino int8: 3.10x batch, 2.02x single text vs openvino fp32 ...``."""
        chosen = next(t for t in self.trials if (t.backend, t.precision) == (self.backend, self.precision))
        quality = ", ".join(f"{k} {v:.4f}" for k, v in chosen.quality.items())
        others = "; ".join(
            f"{t.name} {t.excluded}" if t.excluded else f"{t.name} {t.batch_ratio:.2f}x/{t.single_ratio:.2f}x"
            for t in self.trials
            if t is not chosen
        )
        return (
            f"{chosen.name}: {chosen.batch_ratio:.2f}x batch, {chosen.single_ratio:.2f}x single text vs "
            f"{self.reference}{f' ({quality})' if quality else ''}; others: {others or 'none'}; measured "
            f"{self.measured} on {self.cpu}, {self.threads} threads, with {self.sample or 'unnamed texts'}"
        )

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("cached")
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Choice:
        trials = [Trial(**t) for t in data.pop("trials")]
        return cls(**data, trials=trials, cached=True)


def candidates(
    backend: str, precision: str, *, cpu_flags: Sequence[str], installed: Callable[[str], bool]
) -> list[tuple[Backend, Precision]]:
    """The (backend, precision) pairs ``auto`` measures, the reference's first.

    Args:
        backend: as validated by :func:`~embedrank.runtime.backends.check_backend`; ``"auto"`` leaves it open.
        precision: likewise.
        cpu_flags: the CPU's flags (``/proc/cpuinfo``); bf16 is a candidate only with ``avx512_bf16`` or
            ``amx_bf16``.
        installed: whether a module can be imported (``nncf`` for OpenVINO int8, ``onnxruntime`` for ONNX).

    >>> candidates("auto", "auto", cpu_flags=["avx2"], installed=lambda m: True)
    [('openvino', 'fp32'), ('torch', 'fp32'), ('onnx', 'fp32'), ('openvino', 'int8'), ('onnx', 'int8')]
    >>> candidates("openvino", "auto", cpu_flags=["avx512_bf16"], installed=lambda m: m != "nncf")
    [('openvino', 'fp32'), ('openvino', 'bf16')]
    """
    needs = {("openvino", "int8"): "nncf", ("onnx", "fp32"): "onnxruntime", ("onnx", "int8"): "onnxruntime"}
    has_bf16 = bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags))
    out = []
    for b, p in _ORDER:
        if backend not in (AUTO, b) or precision not in (AUTO, p) or p not in PRECISIONS[b]:
            continue
        if (p == "bf16" and not has_bf16) or ((b, p) in needs and not installed(needs[b, p])):
            continue
        out.append((b, p))
    return out


def pick(trials: Sequence[Trial]) -> Trial:
    """The trial ``auto`` chooses: within the quality bound, not slower than the reference (ratio >= 1) on
    either workload, and the largest geometric mean of the two ratios; the first trial (the reference,
    1.0/1.0) when none beats it.

    >>> ref = Trial("openvino", "fp32", 1.0, 1.0, within_bound=True)
    >>> fast_but_wrong = Trial("openvino", "int8", 3.0, 2.0, within_bound=False)
    >>> slower_single = Trial("onnx", "int8", 1.5, 0.9, within_bound=True)
    >>> good = Trial("openvino", "bf16", 2.0, 1.2, within_bound=True)
    >>> pick([ref, fast_but_wrong, slower_single, good]).name
    'openvino bf16'
    >>> pick([ref, fast_but_wrong, slower_single]).name
    'openvino fp32'
    """
    eligible = [
        t
        for t in trials
        if t.excluded is None and t.within_bound and (t.batch_ratio or 0) >= 1.0 and (t.single_ratio or 0) >= 1.0
    ]
    return max(eligible, key=lambda t: t.score) if eligible else trials[0]


def embedding_agreement(
    reference: np.ndarray, candidate: np.ndarray, ref_queries: np.ndarray, cand_queries: np.ndarray, k: int = 10
) -> dict[str, float]:
    """How closely a candidate's embeddings follow the reference's.

    Args:
        reference: ``(N, D)`` normalized document vectors by the reference runtime.
        candidate: ``(N, D)`` the same texts' vectors by the candidate.
        ref_queries: ``(Q, D)`` normalized query vectors by the reference runtime.
        cand_queries: ``(Q, D)`` the same queries' vectors by the candidate.
        k: the ranking depth compared.

    Returns:
        ``{"cosine": smallest cosine of a document's two vectors, "overlap": mean share of the reference's
        top-k documents that the candidate's top-k holds, over the queries}``.

    >>> v = np.eye(3, dtype=np.float32)
    >>> embedding_agreement(v, v, v, v, k=2)
    {'cosine': 1.0, 'overlap': 1.0}
    """
    cosine = float(np.min(np.sum(reference * candidate, axis=1)))
    k = min(k, len(reference))
    want = np.argsort(-(ref_queries @ reference.T), axis=1, kind="stable")[:, :k]
    got = np.argsort(-(cand_queries @ candidate.T), axis=1, kind="stable")[:, :k]
    overlap = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(want, got, strict=True)]))
    return {"cosine": round(cosine, 6), "overlap": round(overlap, 6)}


def score_agreement(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """Spearman's rho between a cross-encoder's reference scores and a candidate's, ``(N,)`` each (every
    logit of a several-label model, flattened).

    >>> score_agreement(np.array([0.1, 0.5, 0.3]), np.array([1.0, 9.0, 2.0]))
    {'rho': 1.0}
    """
    from scipy.stats import spearmanr

    rho = spearmanr(np.ravel(reference), np.ravel(candidate)).statistic
    return {"rho": round(float(rho), 6) if np.isfinite(rho) else 0.0}


def within_bound(quality: dict[str, float]) -> bool:
    """Every figure at or above its :data:`BOUNDS` entry.

    >>> within_bound({"cosine": 0.99, "overlap": 0.95}), within_bound({"cosine": 0.97})
    (True, False)
    """
    return all(value >= BOUNDS[name] for name, value in quality.items())


Batches = list[dict[str, torch.Tensor]]


@dataclasses.dataclass
class Workload:
    """The tokenized texts ``auto`` runs: ``checks`` (and ``queries`` for an embedding model) for quality,
    ``batch`` and ``single`` for speed, and the pooling of an embedding model (None for a cross-encoder)."""

    checks: Batches
    queries: Batches
    batch: dict[str, torch.Tensor]
    single: dict[str, torch.Tensor]
    pooling: PoolingMode | None
    sample: str = ""  # where the texts came from (:func:`~embedrank.runtime.exports.calibration_texts`)


def workload(
    tokenizer: Any, head: Head, texts: Sequence[str], max_length: int, pooling: PoolingMode | None, sample: str = ""
) -> Workload:
    """The tokenized texts of the measurement, as the runtime is fed (length-sorted, padded per batch):
    :data:`CHECK_TEXTS` texts (an embedding model's queries: their first 8 words; a cross-encoder's pairs,
    :func:`~embedrank.runtime.converters.calibration_batches`), a batch of :data:`BATCH` texts at the window
    (a cross-encoder: as many pairs), and one short text (a cross-encoder: one pair)."""
    from embedrank.runtime.converters import calibration_batches

    def tensors(batches: list[Any]) -> Batches:
        return [{k: torch.from_numpy(np.asarray(v, dtype=np.int64)) for k, v in b.items()} for b in batches]

    def tokens(*columns: list[str]) -> dict[str, torch.Tensor]:
        encoded = tokenizer(*columns, padding=True, truncation=True, max_length=max_length, return_tensors="np")
        return tensors([dict(encoded)])[0]

    checks = list(texts)[:CHECK_TEXTS]
    heads = [" ".join(t.split()[:8]) for t in checks]
    batch = list(texts)[:BATCH]
    if head == "encoder":
        return Workload(
            checks=tensors(calibration_batches(tokenizer, head, checks, max_length)),
            queries=tensors(calibration_batches(tokenizer, head, heads, max_length)),
            batch=tokens(batch),
            single=tokens(heads[:1]),
            pooling=PoolingMode(pooling or PoolingMode.MEAN),
            sample=sample,
        )
    return Workload(
        checks=tensors(calibration_batches(tokenizer, head, checks, max_length)),
        queries=[],
        batch=tokens([" ".join(t.split()[:12]) for t in batch], batch),
        single=tokens(heads[:1], checks[:1]),
        pooling=None,
        sample=sample,
    )


def _outputs(runtime: Runtime, batches: Batches, pooling: PoolingMode | None) -> np.ndarray:
    rows = []
    for features in batches:
        out = runtime(features).float()
        if pooling is not None:
            out = torch.nn.functional.normalize(pool(out, features["attention_mask"], pooling), dim=-1)
        rows.append(out.reshape(out.shape[0], -1).numpy())
    return np.concatenate(rows)


def _quality(reference: dict[str, np.ndarray], runtime: Runtime, work: Workload) -> dict[str, float]:
    docs = _outputs(runtime, work.checks, work.pooling)
    if work.pooling is None:
        return score_agreement(reference["checks"], docs)
    return embedding_agreement(
        reference["checks"], docs, reference["queries"], _outputs(runtime, work.queries, work.pooling)
    )


def _seconds(runtime: Runtime, features: dict[str, torch.Tensor], calls: int = 1) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        runtime(features)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _ratios(reference: Runtime, runtime: Runtime, work: Workload) -> tuple[float, float]:
    """Median over :data:`ROUNDS` alternated rounds of the reference's seconds over the candidate's."""
    for r in (reference, runtime):  # warm up: first calls allocate
        r(work.single)
        r(work.batch)
    batch, single = [], []
    for _ in range(ROUNDS):
        ref_batch, ref_single = _seconds(reference, work.batch), _seconds(reference, work.single, SINGLE_CALLS)
        batch.append(ref_batch / _seconds(runtime, work.batch))
        single.append(ref_single / _seconds(runtime, work.single, SINGLE_CALLS))
    return round(statistics.median(batch), 3), round(statistics.median(single), 3)


def choose(
    model_id: str,
    options: Sequence[tuple[Backend, Precision]],
    load: Callable[[Backend, Precision], Runtime],
    work: Workload,
    cache_file: Path,
) -> tuple[Runtime, Choice]:
    """Measure ``options`` (the reference first, :func:`candidates`) and return the chosen runtime and the
    decision; a decision cached in ``cache_file`` loads its runtime without measuring.

    ``load(backend, precision)`` returns a runtime, exporting on first use; an export error leaves the
    candidate out with the reason (an fp32 reference that fails gives its place to the next fp32 one).
    """
    if cache_file.is_file():
        choice = Choice.from_json(json.loads(cache_file.read_text()))
        log.info("embedrank: %s: auto (cached) chose %s", model_id, choice.summary)
        return load(choice.backend, choice.precision), choice
    trials: list[Trial] = []
    reference: Runtime | None = None
    expected: dict[str, np.ndarray] = {}
    best: tuple[Runtime, Trial] | None = None
    for backend, precision in options:
        trial = Trial(backend, precision)
        trials.append(trial)
        try:
            runtime = load(backend, precision)
        except MemoryError:
            raise
        except Exception as exc:  # an export error (with the converter's reason), a graph the plugin cannot compile
            log.info("embedrank: %s: auto leaves %s %s out: %s", model_id, backend, precision, exc)
            trial.excluded = f"not loaded ({type(exc).__name__}: {' '.join(str(exc).split())[:240]})"
            continue
        if reference is None:
            if precision != "fp32":
                trial.excluded = "no fp32 reference loaded before it"
                continue
            reference = runtime
            expected = {"checks": _outputs(runtime, work.checks, work.pooling)}
            if work.pooling is not None:
                expected["queries"] = _outputs(runtime, work.queries, work.pooling)
            trial.batch_ratio, trial.single_ratio, trial.within_bound = 1.0, 1.0, True
            best = (runtime, trial)
            continue
        trial.quality = _quality(expected, runtime, work)
        trial.within_bound = within_bound(trial.quality)
        if not trial.within_bound:
            trial.excluded = (
                "outside the quality bound (" + ", ".join(f"{k} {v:.4f}" for k, v in trial.quality.items()) + ")"
            )
            continue
        trial.batch_ratio, trial.single_ratio = _ratios(reference, runtime, work)
        if best is not None and pick([best[1], trial]) is trial:
            best = (runtime, trial)
    if best is None:
        tried = "; ".join(f"{t.name}: {t.excluded}" for t in trials)
        raise UnsupportedModelError(f"backend/precision auto found no runtime that loads {model_id!r} ({tried})")
    ref_trial = next(t for t in trials if t.excluded is None)
    cpu, _ = cpu_identity()
    choice = Choice(
        backend=best[1].backend,  # type: ignore[arg-type]
        precision=best[1].precision,  # type: ignore[arg-type]
        reference=ref_trial.name,
        cpu=cpu,
        threads=int(torch.get_num_threads()),
        measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        trials=trials,
        sample=work.sample,
    )
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(choice.to_json(), indent=2) + "\n")
    tmp.replace(cache_file)
    log.warning("embedrank: %s: auto chose %s (cached in %s)", model_id, choice.summary, cache_file)
    return best[0], choice
