"""Retrieval metrics with trec_eval semantics, through pytrec_eval (as BEIR does).

Measures: ``ndcg@k`` (graded), ``recall@k``, ``mrr@k`` (reciprocal rank cut at k), ``map@k`` and ``p@k``.
Rules:

- The query's own id is never counted as a hit (it is removed from the run, as BEIR does).
- Every query in the qrels is scored; one missing from the run scores 0 on everything.
- Ties in score are broken as trec_eval does, by doc id descending, so results are deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
import pytrec_eval

from embedrank.types import Qrels, Run

DEFAULT_K = (1, 3, 5, 10, 100)
_PTE = {"ndcg": "ndcg_cut", "recall": "recall", "map": "map_cut", "p": "P"}


def _trec_order(docs: dict[str, float]) -> list[tuple[str, float]]:
    """trec_eval's ranking: score descending, then doc id descending."""
    return sorted(docs.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)


def clean_run(run: Run, qrels: Qrels) -> Run:
    """A copy of ``run`` restricted to judged queries, without self-hits, with every judged query present."""
    out: Run = {}
    for qid in qrels:
        docs = {d: float(s) for d, s in run.get(qid, {}).items() if d != qid}
        out[qid] = docs
    return out


def evaluate_per_query(
    qrels: Qrels,
    run: Run,
    k_values: Iterable[int] = DEFAULT_K,
    *,
    relevance_level: int = 1,
) -> pd.DataFrame:
    """Per-query metrics: one row per judged query, columns ``ndcg@k``, ``recall@k``, ``mrr@k``, ``map@k``, ``p@k``.

    ``relevance_level`` is the lowest grade that counts as relevant for recall, MAP, P and MRR
    (nDCG always uses the grades). TREC DL uses 2.
    """
    ks = sorted(set(int(k) for k in k_values))
    cleaned = clean_run(run, qrels)
    measures = {f"{name}.{','.join(map(str, ks))}" for name in _PTE.values()} | {"recip_rank"}
    evaluator = pytrec_eval.RelevanceEvaluator(
        {q: dict(r) for q, r in qrels.items()}, measures, relevance_level=relevance_level
    )
    # pytrec_eval skips queries with an empty run; give them a dummy doc that is never judged.
    scoring = {q: (docs if docs else {"__embedrank_empty__": 0.0}) for q, docs in cleaned.items()}
    scores = evaluator.evaluate(scoring)
    # MRR@k: reciprocal rank over the run cut at k in trec_eval order.
    rows = []
    for qid in sorted(qrels):
        row: dict[str, float] = {"query_id": qid}  # type: ignore[dict-item]
        res = scores.get(qid, {})
        for k in ks:
            for name, pte in _PTE.items():
                row[f"{name}@{k}"] = float(res.get(f"{pte}_{k}", 0.0))
        ranked = _trec_order(scoring[qid])
        for k in ks:
            row[f"mrr@{k}"] = _reciprocal_rank(ranked[:k], qrels[qid], relevance_level)
        rows.append(row)
    frame = pd.DataFrame(rows).set_index("query_id")
    order = [f"{m}@{k}" for m in ("ndcg", "recall", "mrr", "map", "p") for k in ks]
    return frame[order]


def _reciprocal_rank(ranked: list[tuple[str, float]], rels: dict[str, int], relevance_level: int) -> float:
    for position, (doc_id, _) in enumerate(ranked, start=1):
        if rels.get(doc_id, 0) >= relevance_level:
            return 1.0 / position
    return 0.0


def evaluate(
    qrels: Qrels, run: Run, k_values: Iterable[int] = DEFAULT_K, *, relevance_level: int = 1
) -> dict[str, float]:
    """Mean of :func:`evaluate_per_query` over all judged queries, e.g. ``{"ndcg@10": 0.6451, ...}``."""
    return evaluate_per_query(qrels, run, k_values, relevance_level=relevance_level).mean().to_dict()
