"""sentence-transformers' Router (asymmetric models): each branch loads and runs as sentence-transformers'
``encode_query`` / ``encode_document`` / ``encode(task=)`` do, in the core and over HTTP."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from embedrank import Encoder
from embedrank.errors import InvalidInputError, UnsupportedModelError
from embedrank.models.router import BranchTable, pick_branch, read_branches, task_of
from embedrank.registry import describe, resolve
from embedrank.testing.tiny import tiny_model

TEXTS = ["green tea health benefits", "what causes the seasons on earth", "a b", "retrieval " * 40]


def _save(modules, path, **options) -> str:
    SentenceTransformer(modules=modules, device="cpu", **options).save(str(path))
    return str(path)


def _static_query_branches(seed: int) -> tuple[object, list]:
    """A static embedding for queries and a tiny BERT's transformer (mean pooling) for documents, seeded."""
    import torch
    from sentence_transformers.models import StaticEmbedding
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    bert = tiny_model("bert")
    document = SentenceTransformer(bert, device="cpu")
    static = StaticEmbedding(AutoTokenizer.from_pretrained(bert)._tokenizer, embedding_dim=64)
    return static, [document[0], document[1]]


@pytest.fixture(scope="module")
def static_query_router(tmp_path_factory):
    """A static embedding for queries, a transformer (mean pooling) for documents, then Normalize; query and
    document prompts (as ``Router.for_query_document`` models are built)."""
    from sentence_transformers.models import Normalize, Router

    static, document = _static_query_branches(0)
    router = Router.for_query_document(query_modules=[static], document_modules=document)
    prompts = {"query": "query: ", "document": ""}
    return _save([router, Normalize()], tmp_path_factory.mktemp("router") / "static-query", prompts=prompts)


@pytest.fixture(scope="module")
def static_default_router(tmp_path_factory):
    """The static query branch is the default (``default_route="query"``): what the model runs when no task is
    named. The transformer branch of documents must still run on the backend asked for."""
    from sentence_transformers.models import Normalize, Router

    static, document = _static_query_branches(2)
    router = Router({"query": [static], "document": document}, default_route="query", allow_empty_key=True)
    return _save([router, Normalize()], tmp_path_factory.mktemp("router") / "static-default")


@pytest.fixture(scope="module")
def two_transformer_router(tmp_path_factory):
    """Two transformers of different architectures (BERT with CLS pooling and a Dense layer for queries,
    RoBERTa with mean pooling and a Dense layer for documents), no default branch named (the first branch
    is the default, as sentence-transformers does), and a mapping that sends ``"search"`` to the queries."""
    import torch
    from sentence_transformers.models import Dense, Pooling, Router, Transformer

    torch.manual_seed(1)
    query = Transformer(tiny_model("bert"), max_seq_length=120)
    document = Transformer(tiny_model("roberta"), max_seq_length=120)
    width = query.get_embedding_dimension()
    router = Router(
        {
            "query": [query, Pooling(width, "cls"), Dense(width, 16)],
            "document": [document, Pooling(width, "mean"), Dense(width, 16)],
        },
        route_mappings={("search", None): "query"},
    )
    return _save([router], tmp_path_factory.mktemp("router") / "two-transformers")


def _st_outputs(st: SentenceTransformer) -> dict[str, np.ndarray]:
    return {
        "query": st.encode_query(TEXTS),
        "document": st.encode_document(TEXTS),
        "none": st.encode(TEXTS),
        "task=query": st.encode(TEXTS, task="query"),
    }


def _ours(enc: Encoder) -> dict[str, np.ndarray]:
    return {
        "query": enc.encode_query(TEXTS),
        "document": enc.encode_document(TEXTS),
        "none": enc.encode(TEXTS),
        "task=query": enc.encode(TEXTS, task="query"),
    }


@pytest.mark.parametrize("backend", ["torch", "openvino", "onnx"])
@pytest.mark.parametrize("which", ["static_query_router", "two_transformer_router"])
def test_every_branch_matches_sentence_transformers(request, which, backend):
    path = request.getfixturevalue(which)
    expected = _st_outputs(SentenceTransformer(path, device="cpu"))
    enc = Encoder.from_pretrained(path, backend=backend)
    assert set(enc.branches) == {"query", "document"} and enc.branches[enc.spec.branch] is enc
    got = _ours(enc)
    tolerance = 1e-5 if backend == "torch" else 1e-4
    for name, want in expected.items():
        assert got[name].shape == want.shape, name
        assert np.abs(got[name] - want).max() < tolerance, (name, np.abs(got[name] - want).max())
    assert np.abs(got["query"] - got["document"]).max() > 1e-3  # the branches really differ
    static = which == "static_query_router"
    # a static branch runs in torch whatever the backend named; a transformer branch on the backend named
    assert enc.branches["query"].backend == ("torch" if static else backend)
    assert enc.branches["document"].backend == backend
    if backend == "openvino":  # streams splits the transformer branch's batches; the static one is a lookup
        two = Encoder.from_pretrained(path, backend=backend, streams=2)
        runtime = two.branches["document"].runtime
        assert runtime.streams == min(2, int(runtime.compiled.get_property("INFERENCE_NUM_THREADS")))
        assert np.abs(two.encode_document(TEXTS) - got["document"]).max() < 1e-5
        assert np.abs(two.encode_query(TEXTS) - got["query"]).max() < 1e-5


def test_a_static_default_branch_leaves_the_transformer_branch_on_the_backend_named(static_default_router):
    enc = Encoder.from_pretrained(static_default_router, backend="onnx")
    assert enc.spec.branch == "query" and enc.spec.static is not None
    assert enc.backend == "torch"  # the static default is a lookup in torch
    assert enc.branches["document"].backend == "onnx"  # not cleared with the static branch's
    st = SentenceTransformer(static_default_router, device="cpu")
    assert np.abs(enc.encode_document(TEXTS) - st.encode_document(TEXTS)).max() < 1e-4
    assert np.abs(enc.encode(TEXTS) - st.encode(TEXTS)).max() < 1e-5  # no task: the default, static branch


def test_token_counts_are_those_of_each_branchs_tokenizer(static_query_router, two_transformer_router):
    static = SentenceTransformer(static_query_router, device="cpu")
    enc = Encoder.from_pretrained(static_query_router, backend="torch")
    query_counts = enc.encode_with_stats(TEXTS, task="query", prompt="query: ").token_counts
    tokenizer = static[0].sub_modules["query"][0].tokenizer  # StaticEmbedding: no special tokens
    assert query_counts == [len(tokenizer.encode("query: " + t, add_special_tokens=False).ids) for t in TEXTS]
    st = SentenceTransformer(two_transformer_router, device="cpu")
    enc = Encoder.from_pretrained(two_transformer_router, backend="torch")
    for branch in ("query", "document"):
        features = st.preprocess(TEXTS, task=branch)
        assert enc.encode_with_stats(TEXTS, task=branch).token_counts == features["attention_mask"].sum(1).tolist()


def test_branches_are_described_and_picked_as_sentence_transformers_does(two_transformer_router):
    spec = resolve(two_transformer_router)
    assert (spec.branches, spec.branch, spec.dimension) == (("query", "document"), "query", 16)  # first branch
    assert describe("m", two_transformer_router, "local", branch="document").model_type == "roberta"
    table = read_branches(two_transformer_router)
    assert (table.default, dict(table.mappings)) == ("query", {("search", None): "query"})
    assert pick_branch(table, "search") == "query" and pick_branch(table, "document") == "document"
    with pytest.raises(InvalidInputError, match="no branch for task 'summary'"):
        pick_branch(table, "summary")
    mapped = BranchTable(("a", "b"), None, {(None, None): "b", ("query", "text"): "a"})
    assert (pick_branch(mapped, "query"), pick_branch(mapped, "document"), pick_branch(mapped, None)) == ("a", "b", "b")
    with pytest.raises(InvalidInputError, match="no default branch"):
        pick_branch(BranchTable(("a", "b"), None), None)
    assert (task_of("search_document"), task_of(None, "query"), task_of("classification", "x")) == (
        "document",
        "query",
        "x",
    )
    enc = Encoder.from_pretrained(two_transformer_router, backend="torch")
    assert np.abs(enc.encode(TEXTS, task="search") - enc.encode_query(TEXTS)).max() == 0


def test_a_router_without_its_config_or_with_an_unknown_branch_is_named(static_query_router, tmp_path):
    path = tmp_path / "model"
    shutil.copytree(static_query_router, path)
    with pytest.raises(UnsupportedModelError, match="no branch 'image'"):
        describe("m", str(path), "local", branch="image")
    (path / "router_config.json").unlink()
    with pytest.raises(UnsupportedModelError, match=r"Router has no readable router_config\.json"):
        resolve(str(path))
    (path / "router_config.json").write_text(json.dumps({"structure": {"q": ["q"]}}))  # no types
    with pytest.raises(UnsupportedModelError, match=r"no readable router_config\.json"):
        resolve(str(path))
    config = {"types": {"q": "x.CLIPModel"}, "structure": {"q": ["q"]}, "parameters": {}}
    (path / "router_config.json").write_text(json.dumps(config))
    (path / "q").mkdir()
    (path / "q" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UnsupportedModelError, match="CLIPModel"):
        resolve(str(path))


def test_the_service_picks_the_branch_by_input_type_and_reranks_query_against_documents(
    static_query_router, fake_service
):
    enc = Encoder.from_pretrained(static_query_router, backend="torch")
    query, documents = TEXTS[0], TEXTS[1:]
    with fake_service({"r": enc}) as client:

        def embed(**fields):
            body = client.post("/v1/embeddings", json={"model": "r", "input": TEXTS, **fields})
            assert body.status_code == 200, body.text
            return np.array([d["embedding"] for d in body.json()["data"]], dtype=np.float32)

        assert np.abs(embed(input_type="query") - enc.encode_query(TEXTS)).max() < 1e-5
        assert np.abs(embed(input_type="search_query") - enc.encode_query(TEXTS)).max() < 1e-5
        assert np.abs(embed(input_type="document") - enc.encode_document(TEXTS)).max() < 1e-5
        assert np.abs(embed() - enc.encode(TEXTS)).max() < 1e-5  # no input type: the default branch
        cohere = client.post("/v2/embed", json={"model": "r", "texts": TEXTS, "input_type": "search_query"})
        got = np.array(cohere.json()["embeddings"]["float"], dtype=np.float32)
        assert np.abs(got - enc.encode_query(TEXTS)).max() < 1e-5
        body = client.post("/v1/rerank", json={"model": "r", "query": query, "documents": documents}).json()
        scores = {r["index"]: r["relevance_score"] for r in body["results"]}
        want = enc.encode_document(documents) @ enc.encode_query([query])[0]
        assert np.abs(np.array([scores[i] for i in range(len(documents))]) - want).max() < 1e-5
        counts = client.post("/v1/tokenize", json={"model": "r", "input": TEXTS, "input_type": "query"}).json()
        assert [c["count"] for c in counts["data"]] == enc.branches["query"].count_tokens(TEXTS, prompt="query: ")


def test_the_former_route_names_still_work_with_a_deprecation_warning(static_query_router):
    import embedrank.models.router as router

    encoder = Encoder.from_pretrained(static_query_router, backend="torch")
    for old, new in (
        ("RouteTable", router.BranchTable),
        ("read_routes", router.read_branches),
        ("pick_route", router.pick_branch),
        ("Routed", router.Branched),
        ("routed", router.on_branch),
    ):
        with pytest.warns(DeprecationWarning, match="branch"):
            assert getattr(router, old) is new
    with pytest.warns(DeprecationWarning, match="branches"):
        assert encoder.routes is encoder.branches
    with pytest.warns(DeprecationWarning, match="branch_table"):
        assert encoder.route_table is encoder.branch_table
    with pytest.warns(DeprecationWarning, match="branches"):
        assert encoder.spec.routes == encoder.spec.branches == ("query", "document")
    with pytest.warns(DeprecationWarning, match="branch"):
        assert encoder.spec.route == encoder.spec.branch
    with pytest.warns(DeprecationWarning, match="branch="):
        spec = describe("m", static_query_router, "local", route="query")
    assert spec.branch == "query"
    with pytest.raises(AttributeError):
        router.no_such_name  # noqa: B018
