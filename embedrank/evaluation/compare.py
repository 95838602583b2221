"""Many systems on many collections: per-metric tables, significance against a baseline, per-query analysis.

A :class:`SystemRun` is one system's per-query scores on one collection (from :func:`run_benchmark`, or
from a TREC run file through :func:`system_from_run_file`). :func:`compare_systems` tests every system
against the baseline on each collection and metric (:mod:`embedrank.math.significance`: paired t-test
and randomization test), with Holm's correction across the comparisons of one table (one metric: all
collections and systems); :func:`metric_table` prints that table with a † on the significant cells.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from embedrank.errors import InvalidInputError
from embedrank.math.metrics import evaluate_per_query
from embedrank.math.significance import holm, paired_t_test, randomization_test, win_tie_loss
from embedrank.retrieval.data import BeirDataset, doc_text, load_trec_run
from embedrank.types import Run

MARK = "†"


@dataclasses.dataclass(frozen=True)
class SystemRun:
    """One system on one collection: ``per_query`` is indexed by query id, one column per metric."""

    dataset: str
    system: str
    per_query: pd.DataFrame
    run: Run | None = None

    def per_query_json(self) -> dict[str, dict[str, float]]:
        """``{metric: {query_id: value}}``."""
        return {m: {q: round(float(v), 6) for q, v in self.per_query[m].items()} for m in self.per_query.columns}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Comparison:
    """One system against the baseline on one collection and metric."""

    dataset: str
    system: str
    baseline: str
    metric: str
    mean: float
    baseline_mean: float
    wins: int
    ties: int
    losses: int
    t_test_p: float
    randomization_p: float
    p_holm: float = float("nan")
    significant: bool = False

    @property
    def delta(self) -> float:
        return self.mean - self.baseline_mean

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["delta"] = self.delta
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in out.items()}


def run_file_name(dataset: str, system: str) -> str:
    """The stable TREC run file name of a system: ``<dataset>/<system>.trec`` with ``>`` (rerank) spelled
    ``__`` so that shells do not read it as a redirection.

    >>> run_file_name("scifact", "bm25>all-minilm-l6-v2")
    'scifact/bm25__all-minilm-l6-v2.trec'
    """
    return f"{dataset}/{system.replace('>', '__')}.trec"


def system_from_run_file(path: str | Path, dataset: BeirDataset, *, relevance_level: int = 1) -> SystemRun:
    """Evaluate an existing TREC run file on ``dataset``'s qrels (every judged query; a missing one
    scores 0). The system is named after the file (:func:`run_file_name` read backwards)."""
    file = Path(path)
    run = load_trec_run(file)
    per_query = evaluate_per_query(dataset.qrels, run, relevance_level=relevance_level, queries="qrels")
    return SystemRun(dataset.name, file.stem.replace("__", ">"), per_query, run)


def _paired(base: pd.Series, other: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Scores of the baseline's queries in both systems (a query one system lacks scores 0 there)."""
    return base.to_numpy(dtype=np.float64), other.reindex(base.index, fill_value=0.0).to_numpy(dtype=np.float64)


def compare_systems(
    runs: Sequence[SystemRun],
    *,
    baseline: str | None = None,
    metrics: Sequence[str] = ("ndcg@10",),
    permutations: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    tested: Sequence[str] | None = None,
) -> list[Comparison]:
    """Every system (or only those in ``tested``) against ``baseline`` (default: the first system) on each
    collection and metric.

    ``significant`` is ``p_holm < alpha``, where ``p_holm`` is the randomization test's p-value with Holm's
    correction over all comparisons of that metric (the cells of one table). Naming the systems under test
    in advance (``tested``) keeps the family to the comparisons that were planned: the other systems are
    reported but not tested, and do not dilute the correction.
    """
    systems = list(dict.fromkeys(r.system for r in runs))
    baseline = baseline or (systems[0] if systems else None)
    if baseline not in systems:
        raise InvalidInputError(f"baseline {baseline!r} is not one of the systems {systems}", param="baseline")
    unknown = sorted(set(tested or ()) - set(systems))
    if unknown:
        raise InvalidInputError(f"systems to test {unknown} are not among the systems {systems}", param="tested")
    by_key = {(r.dataset, r.system): r for r in runs}
    out: list[Comparison] = []
    for metric in metrics:
        family: list[Comparison] = []
        for run in runs:
            base = by_key.get((run.dataset, baseline))
            if run.system == baseline or base is None or (tested is not None and run.system not in tested):
                continue
            if metric not in run.per_query.columns:
                raise InvalidInputError(f"metric {metric!r} was not computed; have {list(run.per_query.columns)}")
            a, b = _paired(base.per_query[metric], run.per_query[metric])
            wins, ties, losses = win_tie_loss(a, b)
            family.append(
                Comparison(
                    dataset=run.dataset,
                    system=run.system,
                    baseline=baseline,
                    metric=metric,
                    mean=float(b.mean()),
                    baseline_mean=float(a.mean()),
                    wins=wins,
                    ties=ties,
                    losses=losses,
                    t_test_p=paired_t_test(a, b),
                    randomization_p=randomization_test(a, b, permutations=permutations, seed=seed),
                )
            )
        adjusted = holm(np.array([c.randomization_p for c in family]))
        out += [
            dataclasses.replace(c, p_holm=float(p), significant=bool(p < alpha))
            for c, p in zip(family, adjusted, strict=True)
        ]
    return out


def metric_table(
    runs: Sequence[SystemRun], metric: str, comparisons: Sequence[Comparison] = (), *, digits: int = 4
) -> pd.DataFrame:
    """Rows are systems, columns collections plus ``mean`` (over the collections); a cell gets † when the
    system differs significantly from the baseline there (``comparisons``). Values are strings."""
    significant = {(c.dataset, c.system) for c in comparisons if c.metric == metric and c.significant}
    datasets = list(dict.fromkeys(r.dataset for r in runs))
    systems = list(dict.fromkeys(r.system for r in runs))
    values = pd.DataFrame(index=pd.Index(systems, name="system"), columns=datasets, dtype=float)
    for r in runs:
        values.loc[r.system, r.dataset] = float(r.per_query[metric].mean())
    values["mean"] = values[datasets].mean(axis=1, skipna=False)
    table = values.map(lambda v: "-" if pd.isna(v) else f"{v:.{digits}f}")
    for dataset, system in significant:
        table.loc[system, dataset] += MARK
    return table


def biggest_differences(
    a: SystemRun, b: SystemRun, dataset: BeirDataset, *, metric: str = "ndcg@10", n: int = 10, chars: int = 80
) -> pd.DataFrame:
    """The ``n`` queries where ``b`` and ``a`` differ most on ``metric`` (largest ``|b - a|`` first), with
    the query text and each system's top document (needs the systems' runs)."""
    base, other = _paired(a.per_query[metric], b.per_query[metric])
    frame = pd.DataFrame({a.system: base, b.system: other}, index=a.per_query.index)
    frame["delta"] = frame[b.system] - frame[a.system]
    frame = frame.reindex(frame["delta"].abs().sort_values(ascending=False, kind="stable").index[:n])

    def top(system: SystemRun, qid: str) -> str:
        ranked = sorted((system.run or {}).get(qid, {}).items(), key=lambda kv: (-kv[1], kv[0]))
        if not ranked:
            return "-"
        doc = dataset.corpus.get(ranked[0][0])
        return f"{ranked[0][0]}: {doc_text(doc)[:chars]}" if doc else ranked[0][0]

    frame.insert(0, "query", [dataset.queries.get(q, "")[:chars] for q in frame.index])
    frame[f"top doc ({a.system})"] = [top(a, q) for q in frame.index]
    frame[f"top doc ({b.system})"] = [top(b, q) for q in frame.index]
    return frame
