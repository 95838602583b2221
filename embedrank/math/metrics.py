"""Retrieval metrics with trec_eval semantics, through pytrec_eval (as BEIR does).

Measures: ``ndcg@k`` (graded), ``recall@k``, ``mrr@k`` (reciprocal rank cut at k), ``map@k`` and ``p@k``.
Rules:

- The query's own id is never counted as a hit (it is removed from the run, as BEIR does).
- Ties in score are broken as trec_eval does, by doc id descending
  (:func:`~embedrank.math.ranking.ranked_ids`), so results are deterministic.
- Which queries are scored: by default the judged queries that appear in the run (``queries="run"``), so
  evaluating a subset of queries gives that subset's figure. ``queries="qrels"`` scores every judged query
  and counts one missing from the run as 0 on everything (trec_eval's ``-c``), which is what a full
  benchmark run that lost queries should report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import pandas as pd

from embedrank.errors import InvalidInputError
from embedrank.math.ranking import ranked_ids
from embedrank.types import Qrels, Run

DEFAULT_K = (1, 3, 5, 10, 100)
NAMES = ("ndcg", "recall", "mrr", "map", "p")
_PTE = {"ndcg": "ndcg_cut", "recall": "recall", "map": "map_cut", "p": "P"}
QuerySet = Literal["run", "qrels"]


def scored_queries(qrels: Qrels, run: Run, queries: QuerySet = "run") -> list[str]:
    """The query ids a metric averages over, sorted: judged ones in the run, or every judged one.

    >>> scored_queries({"q1": {"d": 1}, "q2": {"d": 1}}, {"q2": {"d": 1.0}, "q9": {}})
    ['q2']
    """
    if queries == "qrels":
        return sorted(qrels)
    if queries == "run":
        return sorted(q for q in qrels if q in run)
    raise InvalidInputError(f"queries must be 'run' or 'qrels', got {queries!r}", param="queries")


def parse_measures(measures: Iterable[str]) -> tuple[list[str], list[int]]:
    """Check names like ``"ndcg@10"``; return them and the cut-offs they need.

    >>> parse_measures(["ndcg@10", "recall@100"])
    (['ndcg@10', 'recall@100'], [10, 100])
    """
    names, ks = [], set()
    for m in measures:
        name, _, k = str(m).partition("@")
        if name not in NAMES or not k.isdigit() or int(k) < 1:
            raise InvalidInputError(
                f"unknown measure {m!r}; use <name>@<k> with name in {list(NAMES)}", param="measures"
            )
        names.append(f"{name}@{int(k)}")
        ks.add(int(k))
    return names, sorted(ks)


def evaluate_per_query(
    qrels: Qrels,
    run: Run,
    k_values: Iterable[int] = DEFAULT_K,
    *,
    relevance_level: int = 1,
    queries: QuerySet = "run",
) -> pd.DataFrame:
    """Per-query metrics: one row per scored query (see ``queries`` in the module docstring), columns
    ``ndcg@k``, ``recall@k``, ``mrr@k``, ``map@k``, ``p@k`` for each ``k``.

    ``relevance_level`` is the lowest grade that counts as relevant for recall, MAP, P and MRR
    (nDCG always uses the grades). TREC DL uses 2.
    """
    ks = sorted({int(k) for k in k_values})
    qids = scored_queries(qrels, run, queries)
    if not qids:
        raise InvalidInputError("no query of the run is judged in the qrels; nothing to evaluate", param="run")
    # without self-hits; pytrec_eval skips queries with an empty run, so those get a never-judged dummy doc
    scoring = {
        q: {d: float(s) for d, s in run.get(q, {}).items() if d != q} or {"__embedrank_empty__": 0.0} for q in qids
    }
    measures = {f"{pte}.{','.join(map(str, ks))}" for pte in _PTE.values()}
    import pytrec_eval  # here, not at import: embedrank imports this module for every user, scoring or not

    evaluator = pytrec_eval.RelevanceEvaluator(
        {q: dict(qrels[q]) for q in qids}, measures, relevance_level=relevance_level
    )
    scores = evaluator.evaluate(scoring)
    rows = []
    for qid in qids:
        row: dict[str, float | str] = {"query_id": qid}
        res = scores.get(qid, {})
        for k in ks:
            for name, pte in _PTE.items():
                row[f"{name}@{k}"] = float(res.get(f"{pte}_{k}", 0.0))
        ranked = ranked_ids(scoring[qid])
        for k in ks:  # MRR@k: reciprocal rank over the run cut at k, in trec_eval order
            row[f"mrr@{k}"] = _reciprocal_rank(ranked[:k], qrels[qid], relevance_level)
        rows.append(row)
    frame = pd.DataFrame(rows).set_index("query_id")
    return frame[[f"{m}@{k}" for m in NAMES for k in ks]]


def _reciprocal_rank(ranked: list[str], rels: dict[str, int], relevance_level: int) -> float:
    for position, doc_id in enumerate(ranked, start=1):
        if rels.get(doc_id, 0) >= relevance_level:
            return 1.0 / position
    return 0.0


def evaluate(
    qrels: Qrels,
    run: Run,
    measures: Sequence[str] | None = None,
    *,
    k_values: Iterable[int] = DEFAULT_K,
    relevance_level: int = 1,
    queries: QuerySet = "run",
) -> dict[str, float]:
    """Mean of :func:`evaluate_per_query` over the scored queries.

    By default that is the judged queries present in ``run`` (``queries="qrels"``: every judged query,
    missing ones scoring 0). ``measures`` picks the keys, e.g. ``["ndcg@10", "recall@100", "mrr@10"]``
    returns exactly those three; without it, every measure at every ``k_values`` cut-off (25 keys).

    >>> evaluate({"q1": {"a": 1}, "q2": {"b": 1}}, {"q1": {"a": 2.0, "c": 1.0}}, ["ndcg@10", "mrr@10"])
    {'ndcg@10': 1.0, 'mrr@10': 1.0}
    >>> evaluate({"q1": {"a": 1}, "q2": {"b": 1}}, {"q1": {"a": 2.0}}, ["ndcg@10"], queries="qrels")
    {'ndcg@10': 0.5}
    """
    names, ks = parse_measures(measures) if measures is not None else (None, k_values)
    means = evaluate_per_query(qrels, run, ks, relevance_level=relevance_level, queries=queries).mean()
    return {name: float(means[name]) for name in (names or means.index)}
