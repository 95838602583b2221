"""The client libraries users already have, driven unchanged against a real server on loopback (the packaged
MiniLM for embeddings, the seeded MiniLM cross-encoder for reranking), each configured as its own docs tell
users to point it at a self-hosted server. Every result is checked against the core: cosine >= 0.9999 with
``Encoder.encode``, rerank order equal and scores within 1e-5 of ``CrossEncoder.score``.

``docs/guides/clients.md`` lists the same configurations; keep the two in step.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from embedrank import CrossEncoder
from embedrank.testing.launch import running_server
from service.token_ids import encoding_file

pytestmark = pytest.mark.slow  # one real server for the module

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM would fetch its price list at import

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
RERANKER = "reranker"
KEY = "client-test-key"
OTHER_KEY = "another-client-key"
TEXTS = ["The tilt of Earth's axis causes the seasons.", "Bananas are rich in potassium.", "naïve café — 東京"]
QUERY = "What causes the seasons?"
DOCS = [
    "Bananas are rich in potassium.",
    "The tilt of Earth's axis causes the seasons.",
    "Seasons change through the year as the Earth orbits the Sun.",
    "Paris is the capital of France.",
]


@pytest.fixture(scope="module")
def server(cross_encoder_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("clients") / "server.log"
    env = {
        "EMBEDRANK_MODELS": f"{MODEL},{RERANKER}={cross_encoder_dir}",
        "EMBEDRANK_API_KEYS": f"{KEY},{OTHER_KEY}",
        "EMBEDRANK_BATCH_DIR": str(tmp_path_factory.mktemp("batches")),
    }
    with running_server(env, log_path=str(log)) as url:
        yield str(url)


@pytest.fixture(scope="module")
def tiktoken_cache(tmp_path_factory):
    """tiktoken's own cache, filled as an online user's is after the first download (LangChain tokenizes with
    ``cl100k_base`` before it sends anything); nothing is downloaded here."""
    cache = tmp_path_factory.mktemp("tiktoken")
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    shutil.copy(encoding_file(), cache / hashlib.sha1(url.encode()).hexdigest())
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("TIKTOKEN_CACHE_DIR", None)
    else:
        os.environ["TIKTOKEN_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def reference(encoder, cross_encoder_dir):
    scores = CrossEncoder.from_pretrained(cross_encoder_dir).score(QUERY, DOCS)
    return encoder.encode(TEXTS), encoder.encode([QUERY])[0], scores


def same_vectors(got, expected):
    got = np.asarray(got, dtype=np.float64).reshape(len(expected), -1)
    got /= np.linalg.norm(got, axis=1, keepdims=True)  # TEI clients may ask for unnormalized vectors
    cosines = np.sum(got * expected, axis=1)
    assert cosines.min() >= 0.9999, cosines


def same_ranking(pairs, scores, top=None):
    """``pairs``: (index, score) as the client returns them, best first."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[: top or len(scores)]
    assert [i for i, _ in pairs] == order
    np.testing.assert_allclose([s for _, s in pairs], [scores[i] for i in order], atol=1e-5)


# -- OpenAI protocol ----------------------------------------------------------------------------------------
def test_openai_sdk(server, reference):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key=KEY)
    out = client.embeddings.create(model=MODEL, input=TEXTS)  # the SDK asks for base64 and decodes it
    same_vectors([d.embedding for d in out.data], reference[0])
    ids = client.embeddings.create(model=MODEL, input=[[9906, 1917]])  # "Hello world" in cl100k_base
    plain = client.embeddings.create(model=MODEL, input=["Hello world"])
    np.testing.assert_allclose(ids.data[0].embedding, plain.data[0].embedding, atol=1e-6)


@pytest.mark.parametrize("check_ctx", [True, False], ids=["defaults-token-ids", "text"])
def test_langchain_openai(server, reference, tiktoken_cache, check_ctx):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model=MODEL, base_url=f"{server}/v1", api_key=KEY, check_embedding_ctx_length=check_ctx
    )
    same_vectors(embeddings.embed_documents(TEXTS), reference[0])
    same_vectors([embeddings.embed_query(QUERY)], reference[1][None])


def test_llama_index_openai_like(server, reference):
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    embeddings = OpenAILikeEmbedding(model_name=MODEL, api_base=f"{server}/v1", api_key=KEY)
    same_vectors(embeddings.get_text_embedding_batch(TEXTS), reference[0])


def test_haystack_openai(server, reference):
    from haystack import Document
    from haystack.components.embedders import OpenAIDocumentEmbedder, OpenAITextEmbedder
    from haystack.utils import Secret

    secret = Secret.from_token(KEY)
    text = OpenAITextEmbedder(api_key=secret, model=MODEL, api_base_url=f"{server}/v1").run(TEXTS[0])
    same_vectors([text["embedding"]], reference[0][:1])
    docs = OpenAIDocumentEmbedder(api_key=secret, model=MODEL, api_base_url=f"{server}/v1").run(
        [Document(content=t) for t in TEXTS]
    )
    same_vectors([d.embedding for d in docs["documents"]], reference[0])


# -- Cohere protocol ----------------------------------------------------------------------------------------
def test_cohere_v1_client(server, reference):
    import cohere

    client = cohere.Client(api_key=KEY, base_url=server)
    same_vectors(client.embed(texts=TEXTS, model=MODEL, input_type="search_document").embeddings, reference[0])
    out = client.rerank(model=RERANKER, query=QUERY, documents=DOCS, top_n=3)
    same_ranking([(r.index, r.relevance_score) for r in out.results], reference[2], top=3)


def test_cohere_v2_client(server, reference):
    import cohere

    client = cohere.ClientV2(api_key=KEY, base_url=server)
    out = client.embed(texts=TEXTS, model=MODEL, input_type="search_document", embedding_types=["float", "int8"])
    same_vectors(out.embeddings.float_, reference[0])
    assert len(out.embeddings.int8) == len(TEXTS) and max(map(max, out.embeddings.int8)) <= 127
    ranked = client.rerank(model=RERANKER, query=QUERY, documents=DOCS, top_n=2)
    same_ranking([(r.index, r.relevance_score) for r in ranked.results], reference[2], top=2)


def test_langchain_cohere(server, reference):
    from langchain_cohere import CohereEmbeddings, CohereRerank
    from langchain_core.documents import Document

    embeddings = CohereEmbeddings(model=MODEL, cohere_api_key=KEY, base_url=server)
    same_vectors(embeddings.embed_documents(TEXTS), reference[0])
    same_vectors([embeddings.embed_query(QUERY)], reference[1][None])
    reranker = CohereRerank(model=RERANKER, cohere_api_key=KEY, base_url=server, top_n=3)
    ranked = reranker.rerank(DOCS, QUERY)  # sends "max_tokens_per_doc": null
    same_ranking([(r["index"], r["relevance_score"]) for r in ranked], reference[2], top=3)
    compressed = reranker.compress_documents([Document(page_content=d) for d in DOCS], QUERY)
    assert [d.page_content for d in compressed] == [DOCS[i] for i, _ in ((r["index"], 0) for r in ranked)]


def test_llama_index_cohere_rerank(server, reference):
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    reranker = CohereRerank(model=RERANKER, api_key=KEY, base_url=server, top_n=3)
    nodes = [NodeWithScore(node=TextNode(text=d, id_=str(i))) for i, d in enumerate(DOCS)]
    out = reranker.postprocess_nodes(nodes, query_bundle=QueryBundle(QUERY))
    same_ranking([(int(n.node.node_id), n.score) for n in out], reference[2], top=3)


def test_haystack_cohere(server, reference):
    from haystack import Document
    from haystack.utils import Secret
    from haystack_integrations.components.embedders.cohere import CohereTextEmbedder
    from haystack_integrations.components.rankers.cohere import CohereRanker

    secret = Secret.from_token(KEY)
    embedder = CohereTextEmbedder(api_key=secret, model=MODEL, api_base_url=server)
    same_vectors([embedder.run(QUERY)["embedding"]], reference[1][None])
    ranker = CohereRanker(api_key=secret, model=RERANKER, api_base_url=server, top_k=3)
    out = ranker.run(query=QUERY, documents=[Document(content=d, id=str(i)) for i, d in enumerate(DOCS)])
    same_ranking([(int(d.id), d.score) for d in out["documents"]], reference[2], top=3)


# -- TEI protocol -------------------------------------------------------------------------------------------
def test_llama_index_tei(server, reference):
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    embeddings = TextEmbeddingsInference(model_name=MODEL, base_url=server, auth_token=KEY)
    same_vectors(embeddings.get_text_embedding_batch(TEXTS), reference[0])


def test_haystack_tei(server, reference, monkeypatch):
    import huggingface_hub

    # huggingface_hub refuses every URL, loopback included, in offline mode (set for this suite)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    from haystack import Document
    from haystack.utils import Secret
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPIDocumentEmbedder,
        HuggingFaceAPITextEmbedder,
    )
    from haystack_integrations.components.rankers.huggingface_api import HuggingFaceTEIRanker

    secret = Secret.from_token(KEY)
    params = {"api_type": "text_embeddings_inference", "api_params": {"url": server}, "token": secret}
    same_vectors([HuggingFaceAPITextEmbedder(**params).run(QUERY)["embedding"]], reference[1][None])
    docs = HuggingFaceAPIDocumentEmbedder(**params).run([Document(content=t) for t in TEXTS])  # normalize=False
    same_vectors([d.embedding for d in docs["documents"]], reference[0])
    ranker = HuggingFaceTEIRanker(url=server, token=secret, top_k=3)
    out = ranker.run(query=QUERY, documents=[Document(content=d, id=str(i)) for i, d in enumerate(DOCS)])
    same_ranking([(int(d.id), d.score) for d in out["documents"]], reference[2], top=3)


# -- LiteLLM ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("provider", "base"),
    [("openai", "/v1"), ("hosted_vllm", ""), ("infinity", ""), ("huggingface", "")],
)
def test_litellm_embedding(server, reference, provider, base):
    import litellm

    extra = {}
    model = MODEL
    if provider == "huggingface":
        # TEI's POST /: LiteLLM asks the Hub for the model's task unless input_type names it, and sends a
        # sentence-similarity body for names containing "sentence-transformers", so the served alias is used
        extra, model = {"input_type": "feature-extraction"}, "all-MiniLM-L6-v2"
    out = litellm.embedding(model=f"{provider}/{model}", input=TEXTS, api_base=f"{server}{base}", api_key=KEY, **extra)
    same_vectors([d["embedding"] for d in out.data], reference[0])


@pytest.mark.parametrize("provider", ["cohere", "hosted_vllm", "infinity", "jina_ai", "huggingface"])
def test_litellm_rerank(server, reference, provider):
    import litellm

    # LiteLLM's infinity provider reads a returned document as a plain string (Infinity's own shape), where
    # Cohere's and vLLM's, which /rerank answers in, is {"text": ...}: it is called without the documents
    extra = {"return_documents": False} if provider == "infinity" else {}
    out = litellm.rerank(
        model=f"{provider}/{RERANKER}", query=QUERY, documents=DOCS, top_n=3, api_base=server, api_key=KEY, **extra
    )
    same_ranking([(r["index"], r["relevance_score"]) for r in out.results], reference[2], top=3)
    if provider != "infinity":
        assert [r["document"]["text"] for r in out.results] == [DOCS[r["index"]] for r in out.results]


def test_openai_batches_of_embeddings_and_reranking(server, reference):
    """The openai SDK runs 2,000 embedding lines and 200 rerank lines as batches; each line equals the direct
    answer (the core's), and another key sees neither batch."""
    import io
    import json
    import time

    from openai import NotFoundError, OpenAI

    client, other = (OpenAI(base_url=f"{server}/v1", api_key=k, max_retries=0) for k in (KEY, OTHER_KEY))

    def run(endpoint, lines):
        content = "".join(json.dumps(line) + "\n" for line in lines).encode()
        upload = client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint=endpoint, completion_window="24h")
        deadline = time.monotonic() + 600
        while batch.status not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
            time.sleep(0.5)
            batch = client.batches.retrieve(batch.id)
        assert batch.status == "completed" and batch.request_counts.failed == 0, batch
        with pytest.raises(NotFoundError):
            other.batches.retrieve(batch.id)
        with pytest.raises(NotFoundError):
            other.files.content(batch.output_file_id)
        out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
        assert [o["custom_id"] for o in out] == [line["custom_id"] for line in lines]
        return [o["response"]["body"] for o in out]

    texts, _, scores = reference
    embed = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": TEXTS}}
        for i in range(2000)
    ]
    for body in run("/v1/embeddings", embed):
        same_vectors([d["embedding"] for d in body["data"]], texts)
    rerank = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/rerank",
            "body": {"model": RERANKER, "query": QUERY, "documents": DOCS},
        }
        for i in range(200)
    ]
    for body in run("/v1/rerank", rerank):
        same_ranking([(r["index"], r["relevance_score"]) for r in body["results"]], scores)
    assert other.batches.list().data == [] and other.files.list().data == []


PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "clients.md"
SNIPPETS = re.findall(r"^```py\n(.*?)^```", PAGE.read_text(encoding="utf-8"), flags=re.S | re.M)


@pytest.mark.parametrize("number", range(len(SNIPPETS)), ids=lambda n: f"snippet-{n + 1}")
def test_the_clients_page_runs(server, tiktoken_cache, monkeypatch, number):
    """Each example on the clients page, against this server: it runs and gets vectors or a ranking."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    code = SNIPPETS[number].replace("http://localhost:8000", server).replace("sk-your-key", KEY)
    namespace: dict = {}
    exec(compile(code, f"docs/guides/clients.md py block {number + 1}", "exec"), namespace)
    assert namespace.get("vectors") or namespace.get("ranked")
    if namespace.get("vectors"):
        assert len(namespace["vectors"][0]) == 384  # MiniLM's width


def test_the_clients_page_shows_every_client():
    page = PAGE.read_text(encoding="utf-8")
    for name in ("OpenAI(", "OpenAIEmbeddings(", "OpenAILikeEmbedding(", "OpenAITextEmbedder(", "cohere.Client(",
                 "cohere.ClientV2(", "CohereEmbeddings(", "CohereRerank(", "CohereTextEmbedder(", "CohereRanker(",
                 "TextEmbeddingsInference(", "HuggingFaceAPITextEmbedder(", "HuggingFaceTEIRanker(",
                 "litellm.embedding(", "litellm.rerank("):  # fmt: skip
        assert name in page, name
