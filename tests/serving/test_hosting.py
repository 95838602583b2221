"""Hosting a model in the core (embedrank.serving.hosting): what a kind can do comes from one table, and a
request's prompt and branch are resolved once, in a notebook as in the service."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from embedrank.errors import InvalidInputError
from embedrank.serving.engine import EngineConfig
from embedrank.serving.hosting import KINDS, HostedModel, ModelPlan
from embedrank.serving.options import EmbedOptions
from embedrank.testing.fake import FakeCrossEncoder, FakeEncoder, FakeSparseEncoder

pytestmark = pytest.mark.kernel_free


@pytest.mark.parametrize(
    ("model", "kind", "capabilities", "outputs"),
    [
        (FakeEncoder("e"), "embedding", ["embeddings", "rerank"], ["dense"]),
        (FakeSparseEncoder("s"), "sparse", ["embeddings", "sparse"], ["sparse"]),
        (FakeCrossEncoder("c"), "cross-encoder", ["rerank"], []),
    ],
)
def test_capabilities_come_from_the_kind_table(model, kind, capabilities, outputs):
    plan = ModelPlan(spec=model.spec)
    assert (model.spec.kind, plan.capabilities, plan.outputs) == (kind, capabilities, outputs)
    assert set(KINDS) == {"embedding", "multi-vector", "sparse", "m3", "image-text", "cross-encoder"}


def test_resolve_picks_the_prompt_once_and_refuses_what_the_model_lacks():
    model = FakeEncoder("e", prompts={"query": "query: ", "passage": "passage: "})

    async def run() -> None:
        hosted = HostedModel.start(ModelPlan(spec=model.spec), model, EngineConfig(max_wait_ms=0))
        try:
            assert hosted.resolve(input_type="search_query").prompt == "query: "
            assert hosted.resolve(input_type="document").prompt == "passage: "
            assert hosted.resolve(prompt_name="passage").task == "document"
            assert hosted.resolve().prompt == "" and hosted.resolve().runner is hosted.runner
            with pytest.raises(InvalidInputError, match="not both"):
                hosted.resolve(input_type="query", prompt_name="query")
            with pytest.raises(InvalidInputError):
                hosted.resolve(prompt_name="no-such-prompt")
        finally:
            for runner in hosted.runners():
                await runner.engine.drain(1.0)

    asyncio.run(run())


def test_a_notebook_hosts_a_model_as_the_service_does():
    model = FakeEncoder("e", prompts={"query": "query: "})

    async def run() -> np.ndarray:
        hosted = HostedModel.start(ModelPlan(spec=model.spec), model, EngineConfig(max_wait_ms=0))
        assert [branch for branch, _ in hosted.started()] == [None] and hosted.runners() == [hosted.runner]
        assert (hosted.backend, hosted.inference_precision, hosted.dimension) == ("fake", "f32", model.dimension)
        chosen = hosted.resolve(input_type="query")
        out = await chosen.runner.embed(["green tea"], prompt=chosen.prompt)
        for runner in hosted.runners():
            await runner.engine.drain(1.0)
        return out.embeddings

    vectors = asyncio.run(run())
    np.testing.assert_allclose(vectors, model.encode(["query: green tea"]), atol=1e-6)


def test_embed_gives_the_compact_types_and_refuses_outputs_the_kind_lacks():
    from embedrank.errors import OutputNotAvailableError
    from embedrank.math.quantization import quantize

    model = FakeEncoder("e")

    async def run():
        hosted = HostedModel.start(ModelPlan(spec=model.spec), model, EngineConfig(max_wait_ms=0))
        try:
            embedded = await hosted.embed(["a b", "c"], EmbedOptions(types=("float", "binary", "binary")))
            with pytest.raises(OutputNotAvailableError, match="no sparse output") as err:
                await hosted.embed(["a"], EmbedOptions(types=("sparse",)))
            assert err.value.param == "embedding_types"
            return embedded
        finally:
            for runner in hosted.runners():
                await runner.engine.drain(1.0)

    embedded = asyncio.run(run())
    assert list(embedded.compact) == ["float", "binary"]
    np.testing.assert_array_equal(embedded.compact["binary"], quantize(embedded.output.embeddings, "binary", None))


def test_every_kind_row_names_a_runner_with_the_protocols_signatures():
    """The runner of each kind has every keyword of the protocols its capabilities promise, with the same
    default (a runner that dropped or renamed one would silently ignore what a request asked for)."""
    import inspect

    from embedrank.registry import MODEL_KINDS
    from embedrank.serving.hosting import DenseRunner, EmbeddingRunner, RerankRunner

    assert tuple(KINDS) == MODEL_KINDS
    for kind, row in KINDS.items():
        protocols = [RerankRunner] if "rerank" in row.capabilities else []
        if "embeddings" in row.capabilities:
            protocols.append(DenseRunner if "dense" in row.outputs else EmbeddingRunner)
        assert protocols, kind
        for protocol in protocols:
            methods = [n for n, v in vars(protocol).items() if inspect.iscoroutinefunction(v)]
            methods += [
                n for base in protocol.__mro__[1:] for n, v in vars(base).items() if inspect.iscoroutinefunction(v)
            ]
            assert methods, protocol
            for name in methods:
                declared = inspect.signature(getattr(protocol, name)).parameters
                given = inspect.signature(getattr(row.runner, name)).parameters
                for param, spec in declared.items():
                    assert param in given, f"{row.runner.__name__}.{name} lacks {param!r} ({kind})"
                    assert given[param].default == spec.default, f"{row.runner.__name__}.{name}({param}) ({kind})"
                    assert not any(p.kind is p.VAR_KEYWORD for p in given.values()), f"{row.runner.__name__}.{name}"


def test_the_pool_plans_at_construction_and_hosts_complete_models_once_started():
    import dataclasses

    from embedrank.errors import NotReadyError
    from embedrank.serving.pool import ModelEntry, ModelPool

    pool = ModelPool((ModelEntry(id="demo", path="fake:encoder", aliases=("d",)),))
    assert pool.models == {} and pool.plans["demo"].aliases == ("d",) and pool.default("embeddings") == "demo"
    assert pool.described() == {"demo": pool.plans["demo"]}  # what /v1/models and the schema describe meanwhile
    with pytest.raises(NotReadyError, match="still loading"):
        pool.get("d", "embeddings")

    async def run():
        pool.start(pool.load(), EngineConfig(max_wait_ms=0))
        hosted = pool.get("d", "embeddings")
        try:
            assert isinstance(hosted, HostedModel) and pool.described() == {"demo": hosted}
            assert hosted.runner is not None and hosted.inference_precision == "f32" and hosted.dimension
            assert hosted.created == pool.plans["demo"].created and hosted.aliases == ("d",)
            with pytest.raises(dataclasses.FrozenInstanceError):
                hosted.runner = None  # type: ignore[misc]
        finally:
            await pool.drain(1.0)

    asyncio.run(run())
