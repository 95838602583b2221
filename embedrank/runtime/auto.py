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
  the reference's time over the candidate's in the same round, and each round's score (the geometric mean of
  its two ratios) is kept.

**Confidence**: while the candidates are measured, the share of the machine's CPU time that *other* processes
use is read from ``/proc/stat`` (every CPU's busy time less this process's own, :func:`cpu_clock`). A decision
is *confident* when the others used at most :data:`BUSY_BOUND` of it and the figures decide: the chosen
runtime's median score is within 10% of the runner-up's (either serves as well), or its every round beat the
runner-up's every round. Otherwise it is *provisional* (:attr:`Choice.doubt` says why): the chosen runtime
serves at once, and the trial is repeated when the process is idle: a library call measures again at the next
load, a server in the background once its engines have been idle (:attr:`Choice.remeasure`), and the new
decision replaces the cached one (:attr:`Choice.remeasured` says what it replaced).

**Choice** (:func:`pick`): the largest geometric mean of the two ratios among the candidates within the
quality bound and not slower than the reference on either workload; the reference always qualifies, so
``auto`` is never slower than the default on what it measured. Candidates are measured one at a time (at
most the reference, the best so far and the one measured are loaded at once).

**Cache**: the decision (a confident one), with every candidate's figures, is written to ``<cache>/exports/<model>-auto-<key>.json``
(:mod:`embedrank.runtime.exports`), keyed by the model's weights, head, window, candidates, the CPU's model
name and flags, the thread count, the versions of the libraries that run the graphs and the calibration
texts: a later load on the same machine reads a confident decision and measures nothing (a provisional one
is measured again). Delete the file to measure again.
The chosen runtime carries the decision (:attr:`Choice.summary`, ``Encoder.auto_choice``, ``/v1/models``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
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

RECIPE = 3  # bumped when the measurement or the rule changes, so cached decisions are made again
CHECK_TEXTS = 64  # calibration texts for the quality check
BATCH = 16  # texts in the timed batch
ROUNDS = 5  # alternated timing rounds per candidate
BUSY_BOUND = 0.2  # the share of the machine's CPU other processes may use while measuring, for a confident decision
CLOSE = 1.1  # a runner-up whose median score is within this factor of the chosen's serves as well
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
    rounds: list[float] = dataclasses.field(default_factory=list)  # each round's score (geometric mean of its ratios)

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
    others_busy: float | None = None  # the share of the machine's CPU others used while measuring (None: unknown)
    doubt: str | None = None  # why the decision is provisional (None: it is confident)
    remeasured: str | None = None  # the provisional decision this one replaced, and when it was made
    cached: bool = False
    # measures again and replaces the cached decision (set on a provisional decision; a server calls it when idle)
    remeasure: Callable[[], Choice] | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def confident(self) -> bool:
        return self.doubt is None

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
        busy = f" while others used {self.others_busy:.0%} of the CPU" if self.others_busy is not None else ""
        return (
            f"{chosen.name}: {chosen.batch_ratio:.2f}x batch, {chosen.single_ratio:.2f}x single text vs "
            f"{self.reference}{f' ({quality})' if quality else ''}; others: {others or 'none'}; measured "
            f"{self.measured} on {self.cpu}, {self.threads} threads{busy}, with {self.sample or 'unnamed texts'}"
            + (f"; provisional: {self.doubt}" if self.doubt else "")
            + (f"; replaces {self.remeasured}" if self.remeasured else "")
        )

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("cached", "remeasure")}
        out["trials"] = [dataclasses.asdict(t) for t in self.trials]
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


def cpu_clock() -> tuple[float, float, float] | None:
    """``(busy, own, wall)`` seconds so far: every CPU of this machine busy (``/proc/stat``), this process computing
    (its threads' user and system time), and the wall clock; None where ``/proc/stat`` cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal: busy is all but idle and iowait
    busy = sum(fields[:3]) + sum(fields[5:8])
    own = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), own.user + own.system, time.monotonic()


def others_share(
    since: tuple[float, float, float] | None, now: tuple[float, float, float] | None, cores: int | None = None
) -> float | None:
    """The share of the machine's CPU time (``cores``, default all of them) that other processes used between two
    :func:`cpu_clock` readings (None when either is unknown).

    >>> others_share((100.0, 10.0, 0.0), (103.0, 11.0, 2.0), cores=2)  # 3 s busy, 1 s of them ours, in 2 s
    0.5
    """
    if since is None or now is None or now[2] <= since[2]:
        return None
    others = (now[0] - since[0]) - (now[1] - since[1])
    return round(min(1.0, max(0.0, others / ((now[2] - since[2]) * (cores or os.cpu_count() or 1)))), 3)


def doubt_of(trials: Sequence[Trial], chosen: Trial, others_busy: float | None) -> str | None:
    """Why a decision cannot be trusted, or None: other processes used more than :data:`BUSY_BOUND` of the CPU
    while it was measured, or the rounds' spread covers the difference between the chosen runtime and the
    runner-up (and their medians are more than :data:`CLOSE` apart).

    >>> a, b = Trial("a", "fp32", rounds=[2.0, 2.1, 1.9]), Trial("b", "fp32", rounds=[1.0, 1.1, 2.5])
    >>> doubt_of([a, b], a, 0.05), doubt_of([a, b], a, 0.6) is not None, doubt_of([a], a, 0.0)
    ('the rounds overlap: a fp32 scored 1.90 to 2.10, b fp32 1.00 to 2.50', True, None)
    """
    if others_busy is not None and others_busy > BUSY_BOUND:
        return f"other processes used {others_busy:.0%} of the CPU while it was measured"
    rivals = [t for t in trials if t is not chosen and t.excluded is None and t.rounds]
    if not rivals or not chosen.rounds:
        return None
    runner_up = max(rivals, key=lambda t: statistics.median(t.rounds))
    if statistics.median(chosen.rounds) <= CLOSE * statistics.median(runner_up.rounds):
        return None  # either serves about as well
    if min(chosen.rounds) > max(runner_up.rounds):
        return None
    return (
        f"the rounds overlap: {chosen.name} scored {min(chosen.rounds):.2f} to {max(chosen.rounds):.2f}, "
        f"{runner_up.name} {min(runner_up.rounds):.2f} to {max(runner_up.rounds):.2f}"
    )


def _ratios(reference: Runtime, runtime: Runtime, work: Workload) -> tuple[float, float, list[float]]:
    """Median over :data:`ROUNDS` alternated rounds of the reference's seconds over the candidate's, and each
    round's score (the geometric mean of its two ratios)."""
    for r in (reference, runtime):  # warm up: first calls allocate
        r(work.single)
        r(work.batch)
    batch, single = [], []
    for _ in range(ROUNDS):
        ref_batch, ref_single = _seconds(reference, work.batch), _seconds(reference, work.single, SINGLE_CALLS)
        batch.append(ref_batch / _seconds(runtime, work.batch))
        single.append(ref_single / _seconds(runtime, work.single, SINGLE_CALLS))
    rounds = [round(math.sqrt(b * s), 3) for b, s in zip(batch, single, strict=True)]
    return round(statistics.median(batch), 3), round(statistics.median(single), 3), rounds


def choose(
    model_id: str,
    options: Sequence[tuple[Backend, Precision]],
    load: Callable[[Backend, Precision], Runtime],
    work: Workload,
    cache_file: Path,
) -> tuple[Runtime, Choice]:
    """Measure ``options`` (the reference first, :func:`candidates`) and return the chosen runtime and the
    decision; a confident decision cached in ``cache_file`` loads its runtime without measuring, a provisional
    one is measured again (and replaced). The decision's :attr:`Choice.remeasure` measures again.

    ``load(backend, precision)`` returns a runtime, exporting on first use; an export error leaves the
    candidate out with the reason (an fp32 reference that fails gives its place to the next fp32 one).
    """
    previous: Choice | None = None
    if cache_file.is_file():
        previous = Choice.from_json(json.loads(cache_file.read_text()))
        if previous.confident:
            log.info("embedrank: %s: auto (cached) chose %s", model_id, previous.summary)
            return load(previous.backend, previous.precision), previous
        log.info(
            "embedrank: %s: auto measures again: its cached decision is provisional (%s)", model_id, previous.doubt
        )
    runtime, choice = _measure(model_id, options, load, work, cache_file, previous)
    latest = [choice]

    def remeasure() -> Choice:
        """Measure again, replacing the latest decision (its runtimes are loaded for the trial, then let go)."""
        again = _measure(model_id, options, load, work, cache_file, latest[0])[1]
        again.remeasure = remeasure if again.doubt else None
        latest[0] = again
        return again

    choice.remeasure = remeasure if choice.doubt else None
    return runtime, choice


def _measure(
    model_id: str,
    options: Sequence[tuple[Backend, Precision]],
    load: Callable[[Backend, Precision], Runtime],
    work: Workload,
    cache_file: Path,
    previous: Choice | None,
) -> tuple[Runtime, Choice]:
    """Every candidate measured, the decision written to ``cache_file`` (replacing ``previous``)."""
    trials: list[Trial] = []
    reference: Runtime | None = None
    expected: dict[str, np.ndarray] = {}
    best: tuple[Runtime, Trial] | None = None
    started = cpu_clock()
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
        trial.batch_ratio, trial.single_ratio, trial.rounds = _ratios(reference, runtime, work)
        if best is not None and pick([best[1], trial]) is trial:
            best = (runtime, trial)
    if best is None:
        tried = "; ".join(f"{t.name}: {t.excluded}" for t in trials)
        raise UnsupportedModelError(f"backend/precision auto found no runtime that loads {model_id!r} ({tried})")
    others = others_share(started, cpu_clock())
    ref_trial = next(t for t in trials if t.excluded is None)
    ref_trial.rounds = [1.0] * max((len(t.rounds) for t in trials), default=0)  # the reference against itself
    cpu, _ = cpu_identity()
    choice = Choice(
        backend=best[1].backend,  # type: ignore[arg-type]
        precision=best[1].precision,  # type: ignore[arg-type]
        reference=ref_trial.name,
        cpu=cpu,
        threads=int(torch.get_num_threads()),
        measured=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        trials=trials,
        sample=work.sample,
        others_busy=others,
        doubt=doubt_of(trials, best[1], others),
        remeasured=f"{previous.backend} {previous.precision} (provisional, {previous.measured})" if previous else None,
    )
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(choice.to_json(), indent=2) + "\n")
    tmp.replace(cache_file)
    log.warning("embedrank: %s: auto chose %s (cached in %s)", model_id, choice.summary, cache_file)
    return best[0], choice
