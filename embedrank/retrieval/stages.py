"""First stages besides dense retrieval: the protocol they share, a replayed run, and fusions of two or more."""

from __future__ import annotations

from collections.abc import Iterator
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


def stages_of(stage: FirstStage) -> Iterator[FirstStage]:
    """``stage`` and, for a hybrid, the stages it fuses."""
    yield stage
    if isinstance(stage, HybridRetriever):
        yield from stages_of(stage.first)
        yield from stages_of(stage.second)
    if isinstance(stage, FusedRetriever):
        for part in stage.stages:
            yield from stages_of(part)
