"""First stages besides dense retrieval: the protocol they share, a replayed run, fusions of two or more, and any
stage over long documents' windows with a document scored by its best window (MaxP)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Literal, Protocol, runtime_checkable

from embedrank.math.fusion import reciprocal_rank_fusion, score_fusion, weighted_fusion
from embedrank.math.ranking import top_k
from embedrank.types import Queries, Run


@runtime_checkable
class FirstStage(Protocol):
    """Anything that returns a BEIR run for a batch of queries."""

    name: str

    def retrieve(self, queries: Queries, k: int) -> Run: ...


class PrecomputedRun:
    """A first stage that replays a given run (e.g. a collection's published ``bm25_top100.run``)."""

    def __init__(self, run: Run, name: str = "precomputed") -> None:
        self._run, self.name = run, name

    def retrieve(self, queries: Queries, k: int) -> Run:
        return top_k({q: dict(self._run.get(q, {})) for q in queries}, k)


class HybridRetriever:
    """Fuses two first stages with normalized score fusion or reciprocal rank fusion."""

    def __init__(
        self,
        first: FirstStage,
        second: FirstStage,
        *,
        method: Literal["score", "rrf"] = "score",
        weight: float = 0.5,
        normalization: Literal["minmax", "zscore"] = "minmax",
        rrf_k: int = 60,
        depth: int = 1000,
    ) -> None:
        self.first, self.second = first, second
        self.method, self.weight, self.normalization, self.rrf_k, self.depth = (
            method,
            weight,
            normalization,
            rrf_k,
            depth,
        )
        self.name = f"hybrid({first.name}+{second.name},{method})"

    def retrieve(self, queries: Queries, k: int) -> Run:
        depth = max(k, self.depth)
        a, b = self.first.retrieve(queries, depth), self.second.retrieve(queries, depth)
        if self.method == "rrf":
            fused = reciprocal_rank_fusion([a, b], k=self.rrf_k)
        else:
            fused = score_fusion(a, b, weight=self.weight, normalization=self.normalization)
        return top_k(fused, k)


class FusedRetriever:
    """Fuses any number of first stages by weighted normalized score fusion (equal weights by default)."""

    def __init__(
        self,
        stages: list[FirstStage],
        weights: list[float] | None = None,
        *,
        normalization: Literal["minmax", "zscore"] = "minmax",
        depth: int = 1000,
    ) -> None:
        self.stages = stages
        self.weights = weights or [1.0 / len(stages)] * len(stages)
        self.normalization, self.depth = normalization, depth
        self.name = "hybrid:" + "+".join(stage.name for stage in stages)

    def retrieve(self, queries: Queries, k: int) -> Run:
        depth = max(k, self.depth)
        runs = [stage.retrieve(queries, depth) for stage in self.stages]
        return top_k(weighted_fusion(runs, self.weights, normalization=self.normalization), k)


WindowSearch = Callable[[list[int], int], list[list[tuple[str, float]]]]
"""``search(rows, depth)``: for each query row, its top ``depth`` windows as ``(window id, score)`` pairs."""


def best_windows(
    search: WindowSearch, n_queries: int, owners: Sequence[str], k: int, max_depth: int
) -> list[dict[str, float]]:
    """Each query's top ``k`` documents by their best window's score (MaxP), for windows ``"0"`` ... owned by
    ``owners[i]``.

    The top ``2k`` windows are searched first, and the search deepens (doubling, up to ``max_depth``) for the
    queries whose windows so far name fewer than ``k`` documents: a document with a window among the top ``D``
    has its best window there too, and a document with none scores at most the ``D``-th window, so once ``k``
    documents are found their order is final. A query still short at ``max_depth`` keeps the documents found.
    Returns each query's documents and best scores, unsorted and not cut to ``k``.
    """
    found: list[dict[str, float]] = [{} for _ in range(n_queries)]
    pending, depth = list(range(n_queries)), min(2 * k, max_depth)
    while pending:
        short = []
        for row, hits in zip(pending, search(pending, depth), strict=True):
            best: dict[str, float] = {}
            for window, score in hits:
                doc = owners[int(window)]
                best[doc] = max(score, best.get(doc, score))
            found[row] = best
            if len(best) < k and depth < max_depth:
                short.append(row)
        pending, depth = short, min(2 * depth, max_depth)
    return found


class MaxPRetriever:
    """Any first stage over long documents' windows (as :func:`~embedrank.retrieval.dense.corpus_windows`
    splits them), a document scoring as its best window (MaxP: Dai and Callan, 2019).

    A fusion over windows fuses each window's scores before a document takes its best, as a vector store's
    hybrid search fuses chunks: its stages are read ``depth`` deep however many documents are asked for (a
    deeper read would normalize other scores), so a query whose top ``depth`` windows name fewer than ``k``
    documents gets those.
    """

    def __init__(self, windows: FirstStage, owners: Sequence[str], *, name: str | None = None) -> None:
        """``windows``: a stage over the window corpus (window ``i`` has id ``str(i)``); ``owners``: the
        document id of each window, in window order."""
        self.windows, self.owners = windows, list(owners)
        self.name = name or windows.name
        fixed = getattr(windows, "depth", None) if isinstance(windows, HybridRetriever | FusedRetriever) else None
        self.max_depth = min(fixed or len(self.owners), len(self.owners))

    def retrieve(self, queries: Queries, k: int) -> Run:
        qids = list(queries)

        def search(rows: list[int], depth: int) -> list[list[tuple[str, float]]]:
            run = self.windows.retrieve({qids[r]: queries[qids[r]] for r in rows}, depth)
            return [list(run.get(qids[r], {}).items()) for r in rows]

        found = best_windows(search, len(qids), self.owners, k, self.max_depth)
        return top_k(dict(zip(qids, found, strict=True)), k)


def stages_of(stage: FirstStage) -> Iterator[FirstStage]:
    """``stage`` and, for a hybrid, the stages it fuses (not a :class:`MaxPRetriever`'s: they rank windows)."""
    yield stage
    if isinstance(stage, HybridRetriever):
        yield from stages_of(stage.first)
        yield from stages_of(stage.second)
    if isinstance(stage, FusedRetriever):
        for part in stage.stages:
            yield from stages_of(part)
