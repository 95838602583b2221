"""A front's pool (:class:`~embedrank.serving.pool.ModelPool` with ``engine_link``): its models are loaded without
their transformers, its runners submit to the engine process's engines over a socket, and every answer is the one
the engine process's own pool gives: vectors, compact types (the int8/uint8 ranges come from the engine's sample),
sparse and multi-vector outputs, reranking, token counts, a Router model's branches, the models' descriptions and
the models the engine could not load."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from embedrank.errors import ModelUnavailableError, NotReadyError
from embedrank.models.signature import EmbeddingSignature
from embedrank.runtime.backends import ElsewhereRuntime
from embedrank.serving.engine import EngineConfig
from embedrank.serving.options import EmbedOptions, RerankOptions
from embedrank.serving.pool import ModelEntry, ModelPool
from embedrank.serving.remote import EngineHost, EngineLink, RemoteEngine
from embedrank.testing.tiny import tiny_bge_m3, tiny_colbert, tiny_model
from tests.models.test_router import two_transformer_router  # noqa: F401 - a fixture: a Router of two transformers

TEXTS = ["the cat sat on the mat", "a quick brown fox jumps over the lazy dog", "tokens"]
DOCUMENTS = ["cats sit on mats", "foxes jump", "an unrelated sentence about databases and their indexes"]


def run(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """``test`` run in an event loop of its own (as the engine process and a front each run one)."""

    @functools.wraps(test)
    def running(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return running


@contextlib.asynccontextmanager
async def engine_and_front(entries: tuple[ModelEntry, ...], path: str) -> AsyncIterator[tuple[ModelPool, ModelPool]]:
    """The engine process's pool (loaded, started, served on ``path``) and a front's pool over it, in one process."""
    engine_side = ModelPool(entries)
    engine_side.start(await asyncio.to_thread(engine_side.load, keep_going=True), EngineConfig())
    host = EngineHost(engine_side.engines(), engine_side.describe())
    await host.serve(path)
    link = EngineLink(path)
    front = ModelPool(entries, engine_link=link)
    front.start(await asyncio.to_thread(front.load, description=await link.describe()), EngineConfig())
    try:
        yield engine_side, front
    finally:
        await link.close()
        await host.close()
        await engine_side.drain(5)


def _equal(ours: object, theirs: object) -> None:
    if sp.issparse(ours):
        assert sp.issparse(theirs)
        np.testing.assert_array_equal(ours.toarray(), theirs.toarray())  # type: ignore[union-attr]
    elif isinstance(ours, np.ndarray) and ours.dtype == object:
        for a, b in zip(ours, theirs, strict=True):  # type: ignore[call-overload]
            np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_array_equal(ours, theirs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def entries() -> tuple[ModelEntry, ...]:
    return (
        ModelEntry(id="bert", path=tiny_model("bert"), backend="torch"),
        ModelEntry(id="cross", path=tiny_model("bert", "cross-encoder"), backend="torch"),
        ModelEntry(id="splade", path=tiny_model("bert", "masked-lm")),
        ModelEntry(id="colbert", path=tiny_colbert(), backend="torch"),
        ModelEntry(id="m3", path=tiny_bge_m3(), backend="torch"),
        ModelEntry(id="fake", path="fake:encoder"),
    )


@run
async def test_a_front_answers_as_the_engine_process_for_every_kind(entries, tmp_path):
    async with engine_and_front(entries, str(tmp_path / "engine.sock")) as (engine_side, front):
        for model_id in ("bert", "m3", "fake"):
            ours, theirs = front.get(model_id, "embeddings"), engine_side.get(model_id, "embeddings")
            options = EmbedOptions(types=("float", "int8", "ubinary"), dimensions=8, input_type="query")
            a, b = await ours.embed(TEXTS, options), await theirs.embed(TEXTS, options)
            _equal(a.output.embeddings, b.output.embeddings)
            for name in ("float", "int8", "ubinary"):
                _equal(a.compact[name], b.compact[name])
            assert a.output.token_counts == b.output.token_counts
            assert await ours.count(TEXTS, return_tokens=True) == await theirs.count(TEXTS, return_tokens=True)
            assert ours.dimension == theirs.dimension
        for model_id, types in (
            ("splade", ("sparse",)),
            ("m3", ("sparse", "multivector")),
            ("colbert", ("multivector",)),
        ):
            ours, theirs = front.get(model_id, "embeddings"), engine_side.get(model_id, "embeddings")
            a, b = (
                await ours.embed(TEXTS, EmbedOptions(types=types)),
                await theirs.embed(TEXTS, EmbedOptions(types=types)),
            )
            if "sparse" in types:
                _equal(a.sparse_matrix, b.sparse_matrix)
            if "multivector" in types:
                for x, y in zip(a.output.multi, b.output.multi, strict=True):  # type: ignore[attr-defined]
                    np.testing.assert_array_equal(x, y)
        for model_id in ("bert", "cross", "colbert", "m3", "fake"):
            ours, theirs = front.get(model_id, "rerank"), engine_side.get(model_id, "rerank")
            options = RerankOptions(top_n=2)
            a, b = await ours.rerank(TEXTS[0], DOCUMENTS, options), await theirs.rerank(TEXTS[0], DOCUMENTS, options)
            np.testing.assert_array_equal(a.output.scores, b.output.scores)
            assert a.ranking == b.ranking
            assert a.output.token_counts == b.output.token_counts


@run
async def test_a_front_holds_no_weights_and_describes_what_the_engine_process_runs(entries, tmp_path):
    async with engine_and_front(entries, str(tmp_path / "engine.sock")) as (engine_side, front):
        for model_id, theirs in engine_side.models.items():
            ours = front.models[model_id]
            assert (ours.backend, ours.precision, ours.inference_precision) == (
                theirs.backend,
                theirs.precision,
                theirs.inference_precision,
            )
            assert (ours.dimension, ours.auto_choice, ours.fallback_reason) == (
                theirs.dimension,
                theirs.auto_choice,
                theirs.fallback_reason,
            )
            assert ours.batch_bounds == theirs.batch_bounds
            for _, runner in ours.started():
                assert isinstance(runner.engine, RemoteEngine)
        for model_id, sign in (("bert", EmbeddingSignature.of), ("splade", EmbeddingSignature.of_sparse)):
            # the embedding cache's key: vectors cached by a front are those the engine process computes
            assert sign(front.cores[model_id]).cache_key() == sign(engine_side.cores[model_id]).cache_key()
        for model_id in ("bert", "cross", "splade", "colbert", "m3"):
            core = front.cores[model_id]
            runtime = getattr(core, "encoder", core).runtime
            assert isinstance(runtime, ElsewhereRuntime), model_id
            # the transformer's weights stay in the engine process; a head after it (bge-m3's) may be here
            held, loaded = _parameters(core), _parameters(engine_side.cores[model_id])
            assert held < loaded / 10, (model_id, held, loaded)


def _parameters(model: object) -> int:
    """The torch parameters ``model`` holds (with storage: a module on the meta device holds none): in its
    attributes, its encoder's and its runtime's."""
    import torch

    seen: dict[int, torch.nn.Module] = {}
    inner = getattr(model, "encoder", model)
    for owner in (model, inner, getattr(inner, "runtime", None), getattr(model, "runtime", None)):
        for value in vars(owner).values() if owner is not None else ():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, torch.nn.Module):
                    seen[id(item)] = item
    return sum(p.numel() for module in seen.values() for p in module.parameters() if not p.is_meta)


@run
async def test_a_router_models_branches_are_served_through_the_front(two_transformer_router, tmp_path):  # noqa: F811
    entries = (ModelEntry(id="router", path=two_transformer_router, backend="torch"),)
    async with engine_and_front(entries, str(tmp_path / "engine.sock")) as (engine_side, front):
        assert {label for label in engine_side.engines()} == {"router", "router:document"}
        for branch, part in front.cores["router"].branches.items():
            theirs = engine_side.cores["router"].branches[branch]
            assert (part.backend, part.precision, part.dimension) == (
                theirs.backend,
                theirs.precision,
                theirs.dimension,
            )
        ours, theirs = front.get("router", "embeddings"), engine_side.get("router", "embeddings")
        for input_type in ("query", "document"):
            options = EmbedOptions(input_type=input_type, types=("float", "int8"))
            a, b = await ours.embed(TEXTS, options), await theirs.embed(TEXTS, options)
            _equal(a.output.embeddings, b.output.embeddings)
            _equal(a.compact["int8"], b.compact["int8"])


@run
async def test_a_model_the_engine_process_could_not_load_is_unavailable_on_the_front_too(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model("bert"), broken)
    for weights in broken.rglob("*.safetensors"):
        weights.unlink()
    entries = (
        ModelEntry(id="fake", path="fake:encoder"),
        ModelEntry(id="broken", path=str(broken), backend="torch"),
    )
    async with engine_and_front(entries, str(tmp_path / "engine.sock")) as (engine_side, front):
        assert "broken" in engine_side.failed
        with pytest.raises(ModelUnavailableError, match="could not be loaded"):
            front.get("broken", "embeddings")
        assert (await front.get("fake", "embeddings").embed(["hello"])).output.embeddings.shape[0] == 1


@run
async def test_a_host_still_loading_is_not_ready_to_describe(tmp_path):
    host = EngineHost({})
    await host.serve(str(tmp_path / "engine.sock"))
    link = EngineLink(str(tmp_path / "engine.sock"))
    try:
        with pytest.raises(NotReadyError, match="still loading"):
            await link.describe()
    finally:
        await link.close()
        await host.close()


@pytest.mark.parametrize("architecture", ["clip", "siglip2"])
@run
async def test_an_image_text_models_images_are_read_in_the_front_and_embedded_as_the_engine_process_does(
    architecture, tmp_path
):
    """The front reads and preprocesses the images (its processor, no towers: they stay in the engine process)
    and sends their pixels; texts and images of one request answer as the engine process's own pool does."""
    import base64
    import io

    from embedrank.models.image_text import ImageTextEncoder
    from embedrank.serving.image_text import ImageInput
    from embedrank.testing.tiny_images import drawn_image, tiny_image_text

    def png(shape: str, colour: tuple[int, int, int]) -> bytes:
        out = io.BytesIO()
        drawn_image(shape, colour).save(out, format="PNG")
        return out.getvalue()

    square = ImageInput(png("square", (220, 30, 30)), "input", "[1]")
    disc = "data:image/png;base64," + base64.b64encode(png("circle", (30, 30, 220))).decode()
    inputs = ["a red square", square, ImageInput(disc, "input", "[2]"), "a blue circle"]
    entries = (ModelEntry(id="images", path=tiny_image_text(architecture), backend="torch"),)
    async with engine_and_front(entries, str(tmp_path / "engine.sock")) as (engine_side, front):
        core = front.cores["images"]
        assert isinstance(core, ImageTextEncoder) and isinstance(core.runtime, ElsewhereRuntime)
        assert (core.runtime.backend, core.runtime.precision) == ("torch", "fp32")  # what runs it there
        assert _parameters(core) == 0 < _parameters(engine_side.cores["images"])  # shapes only: no storage here
        ours, theirs = front.get("images", "embeddings"), engine_side.get("images", "embeddings")
        assert ours.dimension == theirs.dimension
        for options in (EmbedOptions(), EmbedOptions(dimensions=16, normalize=False)):
            a, b = await ours.embed(inputs, options), await theirs.embed(inputs, options)
            _equal(a.output.embeddings, b.output.embeddings)
            assert a.output.token_counts == b.output.token_counts
        direct = engine_side.cores["images"].encode_images([drawn_image("square", (220, 30, 30))])
        np.testing.assert_allclose((await ours.embed([square])).output.embeddings, direct, atol=1e-6)


@run
async def test_a_models_adapters_run_in_the_engine_process_and_the_front_names_them(tmp_path):
    """An embedding model's and a cross-encoder's LoRA adapters: the front knows their names (its rows carry their
    indexes) and what runs them there (bf16 on torch: it keys the embedding cache), and each adapter's answers are
    the engine process's own."""
    from tests.models.test_adapters import adapted_model
    from tests.models.test_cross_encoder_adapters import adapted_cross_encoder

    embedder, reranker = adapted_model("bert", tmp_path / "embed"), adapted_cross_encoder("bert", tmp_path / "rerank")
    entries = (
        ModelEntry(id="tasks", path=str(embedder), backend="torch", precision="bf16"),
        ModelEntry(id="reranker", path=str(reranker), backend="torch", precision="bf16"),
    )
    async with engine_and_front(entries, str(tmp_path / "engine.sock")) as (engine_side, front):
        for model_id in ("tasks", "reranker"):
            ours, theirs = front.cores[model_id], engine_side.cores[model_id]
            assert isinstance(ours.runtime, ElsewhereRuntime) and ours.adapters == theirs.adapters != ()
            assert (ours.backend, ours.precision) == (theirs.backend, theirs.precision) == ("torch", "bf16")
            assert front.models[model_id].adapter_names == engine_side.models[model_id].adapter_names
        signature = EmbeddingSignature.of(front.cores["tasks"]).cache_key()
        assert signature == EmbeddingSignature.of(engine_side.cores["tasks"]).cache_key()
        ours, theirs = front.get("tasks", "embeddings"), engine_side.get("tasks", "embeddings")
        for adapter in ("text-matching", "retrieval.query", None):
            options = EmbedOptions(adapter=adapter)
            _equal(
                (await ours.embed(TEXTS, options)).output.embeddings,
                (await theirs.embed(TEXTS, options)).output.embeddings,
            )
        ours, theirs = front.get("reranker", "rerank"), engine_side.get("reranker", "rerank")
        for adapter in ("web", "legal", None):
            options = RerankOptions(adapter=adapter)
            a, b = await ours.rerank(TEXTS[0], DOCUMENTS, options), await theirs.rerank(TEXTS[0], DOCUMENTS, options)
            np.testing.assert_array_equal(a.output.scores, b.output.scores)
        base = await ours.rerank(TEXTS[0], DOCUMENTS)
        web = await ours.rerank(TEXTS[0], DOCUMENTS, RerankOptions(adapter="web"))
        assert np.abs(web.output.scores - base.output.scores).max() > 1e-3  # an adapter changes the scores
