"""Every architecture users bring, against sentence-transformers on tiny seeded models of it: the same
vectors and scores, the same token counts, on torch and on every backend that exports it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import CrossEncoder as STCrossEncoder
from sentence_transformers import SentenceTransformer

from embedrank import CrossEncoder, Encoder
from embedrank.errors import InvalidInputError, UnsupportedModelError
from embedrank.registry import resolve
from embedrank.testing.architectures import ARCHITECTURES, CROSS_ENCODERS
from embedrank.testing.model_cards import qwen3_reranker_scores
from embedrank.testing.tiny import tiny_model

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "green tea health benefits",
    "Ünïcödé: les saisons sont causées par l'inclinaison de la Terre. 季節",
    "retrieval " * 150,  # cut at the max length (120)
    "x",
]
PAIRS = [
    ("green tea", "Green tea is a drink with health benefits."),
    ("green tea", "The fox jumps."),
    ("what is a fox", "a"),
    ("long", "retrieval " * 150),
]


def _st_token_counts(model: SentenceTransformer, texts: list[str]) -> list[int]:
    features = model.tokenize(texts)
    return features["attention_mask"].sum(dim=1).tolist()


@pytest.fixture(scope="module")
def st_encoders():
    return {}


def _st(name: str, cache: dict) -> tuple[str, SentenceTransformer]:
    if name not in cache:
        path = tiny_model(name)
        cache[name] = (path, SentenceTransformer(path, device="cpu"))
    return cache[name]


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_encoder_matches_sentence_transformers_on_torch(name, st_encoders):
    path, st = _st(name, st_encoders)
    enc = Encoder.from_pretrained(path, backend="torch")
    ours = enc.encode_with_stats(TEXTS, batch_size=2)
    assert np.abs(ours.embeddings - st.encode(TEXTS, batch_size=2)).max() < 1e-5
    assert ours.token_counts == _st_token_counts(st, TEXTS)
    assert ours.truncated == [False, False, False, True, False]
    assert enc.dimension == st.get_sentence_embedding_dimension()
    # the model's query prompt (an instruction for the decoder embedders)
    queries = enc.encode(TEXTS[:2], prompt_name="query")
    assert np.abs(queries - st.encode(TEXTS[:2], prompt_name="query")).max() < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "mpnet", "deberta-v2"])
def test_exports_choose_the_attention_the_architecture_has(name, st_encoders):
    """Every architecture's exports are checked against sentence-transformers by the support matrix test
    below; here, the attention each export chose: SDPA where transformers has it for the architecture,
    eager where it does not (MPNet, DeBERTa-v2)."""
    path, st = _st(name, st_encoders)
    enc = Encoder.from_pretrained(path, backend="openvino")
    assert (enc.backend, enc.runtime.inference_precision) == ("openvino", "f32")  # exported, no fallback
    assert np.abs(enc.encode(TEXTS, batch_size=2) - st.encode(TEXTS, batch_size=2)).max() < 1e-4
    info = json.loads((enc.runtime.path.parent / "export.json").read_text())
    assert info["attention"] == ("sdpa" if name == "bert" else "eager")


FUSED_ONNX = {"bert", "distilbert", "roberta", "xlm-roberta", "electra"}  # ONNX Runtime fuses their attention


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_onnx_exports_fuse_attention_where_onnx_runtime_can_and_stay_exact(name, st_encoders):
    """The ONNX backend takes ONNX Runtime's fused-attention graph where its optimizer fuses every layer and
    the graph agrees with torch on two batch shapes; elsewhere torch.export's graph. Either way the vectors
    are sentence-transformers' own."""
    path, st = _st(name, st_encoders)
    enc = Encoder.from_pretrained(path, backend="onnx")
    assert np.abs(enc.encode(TEXTS, batch_size=2) - st.encode(TEXTS, batch_size=2)).max() < 1e-4
    info = json.loads((enc.runtime.path.parent / "export.json").read_text())
    assert (info["attention"] == "eager, fused by ONNX Runtime") == (name in FUSED_ONNX), info["attention"]
    assert sorted(p.name for p in enc.runtime.path.parent.iterdir()) == ["export.json", "model.onnx"]


@pytest.fixture(scope="module")
def st_cross_encoders():
    return {}


def _st_ce(name: str, cache: dict) -> tuple[str, STCrossEncoder]:
    if name not in cache:
        path = tiny_model(name, "cross-encoder")
        cache[name] = (path, STCrossEncoder(path, device="cpu"))
    return cache[name]


@pytest.mark.parametrize("name", CROSS_ENCODERS)
def test_cross_encoder_matches_sentence_transformers_on_torch(name, st_cross_encoders):
    path, st = _st_ce(name, st_cross_encoders)
    ce = CrossEncoder.from_pretrained(path, backend="torch")
    ours = ce.score_pairs_with_stats(PAIRS, batch_size=2)
    assert np.abs(ours.scores - st.predict(PAIRS, batch_size=2)).max() < 1e-5
    assert ours.truncated == [False, False, False, True]


def test_width_is_read_from_every_config_spelling(tmp_path):
    path = tmp_path / "distilbert"
    shutil.copytree(tiny_model("distilbert"), path)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    spec = resolve(str(path))
    assert spec.dimension == 64  # DistilBERT's config says "dim", not "hidden_size"
    enc = Encoder.from_spec(spec.__class__(**{**spec.__dict__, "dimension": None}), backend="torch")
    assert enc.dimension == 64  # and with nothing to read, measured


def test_an_unknown_sentence_transformers_module_is_named(tmp_path):
    path = tmp_path / "model"
    shutil.copytree(tiny_model("bert"), path)
    modules = json.loads((path / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Mystery", "type": "my_package.Mystery"})
    (path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UnsupportedModelError, match=r"'my_package\.Mystery'.*supports \["):
        resolve(str(path))


_CONFIGURATION = """from transformers import BertConfig


class TinyConfig(BertConfig):
    model_type = "tiny-own-code"
"""
_MODELING = """from transformers import BertModel

from .configuration_tiny import TinyConfig


class TinyModel(BertModel):
    config_class = TinyConfig

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.last_hidden_state = out.last_hidden_state.abs() + 0.5  # its own computation
        return out
"""


@pytest.fixture(scope="module")
def own_code_model(tmp_path_factory):
    """A tiny model that ships its own modeling code, as nomic-embed and jina-embeddings do."""
    path = tmp_path_factory.mktemp("own-code") / "model"
    shutil.copytree(tiny_model("bert"), path)
    (path / "configuration_tiny.py").write_text(_CONFIGURATION)
    (path / "modeling_tiny.py").write_text(_MODELING)
    config = json.loads((path / "config.json").read_text())
    config.update(
        model_type="tiny-own-code",
        architectures=["TinyModel"],
        auto_map={"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"},
    )
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_a_model_with_its_own_code_needs_the_opt_in(own_code_model):
    with pytest.raises(UnsupportedModelError, match=r"modeling_tiny\.TinyModel.*trust_remote_code=True"):
        Encoder.from_pretrained(own_code_model, backend="torch")
    with pytest.raises(UnsupportedModelError, match="trust_remote_code"):
        CrossEncoder.from_pretrained(own_code_model, backend="torch")
    enc = Encoder.from_pretrained(own_code_model, backend="torch", trust_remote_code=True)
    assert type(enc.model).__name__ == "TinyModel"
    st = SentenceTransformer(own_code_model, device="cpu", trust_remote_code=True)
    assert np.abs(enc.encode(TEXTS) - st.encode(TEXTS)).max() < 1e-5
    plain = Encoder.from_pretrained(tiny_model("bert"), backend="torch")
    assert np.abs(enc.encode(TEXTS) - plain.encode(TEXTS)).max() > 0.01  # its own code ran


@pytest.mark.slow
def test_a_model_with_its_own_code_exports(own_code_model):
    enc = Encoder.from_pretrained(own_code_model, backend="openvino", trust_remote_code=True)
    st = SentenceTransformer(own_code_model, device="cpu", trust_remote_code=True)
    assert enc.backend == "openvino" and np.abs(enc.encode(TEXTS) - st.encode(TEXTS)).max() < 1e-4


@pytest.mark.slow
def test_the_service_serves_the_architectures_on_the_default_backend(monkeypatch, own_code_model, st_encoders):
    from litestar.testing import TestClient

    from service.app import create_app
    from service.settings import Settings

    monkeypatch.delenv("EMBEDRANK_BACKEND", raising=False)
    monkeypatch.delenv("EMBEDRANK_PRECISION", raising=False)
    models = {
        "mpnet": tiny_model("mpnet"),
        "qwen3-embedding": tiny_model("qwen3"),
        "deberta-reranker": tiny_model("deberta-v2", "cross-encoder"),
        "llm-reranker": tiny_model("qwen3", "causal-lm"),
        "own-code": own_code_model,
    }
    env = {"EMBEDRANK_API_KEYS": "k", "EMBEDRANK_MODELS": ",".join(f"{k}={v}" for k, v in models.items())}
    with pytest.raises(UnsupportedModelError, match="trust_remote_code"):  # the service refuses to start
        create_app(Settings.from_env(env))
    settings = Settings.from_env({**env, "EMBEDRANK_TRUST_REMOTE_CODE": "own-code"})
    with TestClient(create_app(settings, wait_for_models=True)) as client:
        client.headers.update({"Authorization": "Bearer k"})
        cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert {k: c["backend"] for k, c in cards.items()} == dict.fromkeys(cards, "openvino")
        for model_id, name in (("mpnet", "mpnet"), ("qwen3-embedding", "qwen3")):
            body = client.post("/v1/embeddings", json={"model": model_id, "input": TEXTS}).json()
            got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
            assert np.abs(got - _st(name, st_encoders)[1].encode(TEXTS)).max() < 1e-4
        own = client.post("/v1/embeddings", json={"model": "own-code", "input": TEXTS}).json()
        expected = SentenceTransformer(own_code_model, device="cpu", trust_remote_code=True).encode(TEXTS)
        assert np.abs(np.array([d["embedding"] for d in own["data"]]) - expected).max() < 1e-4
        query = client.post(
            "/v1/embeddings", json={"model": "qwen3-embedding", "input": TEXTS[:2], "input_type": "query"}
        ).json()
        expected = _st("qwen3", st_encoders)[1].encode(TEXTS[:2], prompt_name="query")
        assert np.abs(np.array([d["embedding"] for d in query["data"]]) - expected).max() < 1e-4
        docs = [d for _, d in PAIRS[:3]]  # documents that fit one window (the service splits longer ones)
        body = client.post("/v1/rerank", json={"model": "deberta-reranker", "query": "green tea", "documents": docs})
        ref = STCrossEncoder(tiny_model("deberta-v2", "cross-encoder"), device="cpu").predict(
            [("green tea", d) for d in docs]
        )
        for r in body.json()["results"]:
            assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=1e-4)
        body = client.post("/v1/rerank", json={"model": "llm-reranker", "query": "green tea", "documents": docs})
        ref = qwen3_reranker_scores(tiny_model("qwen3", "causal-lm"), [("green tea", d) for d in docs], 256)
        assert [r["index"] for r in body.json()["results"]] == sorted(range(len(docs)), key=lambda i: -ref[i])
        for r in body.json()["results"]:
            assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=1e-4)


LLM_PAIRS = [*PAIRS, ("long", "retrieval " * 300)]


def test_an_llm_reranker_calibrates_int8_on_its_template(monkeypatch, tmp_path):
    from embedrank.runtime import converters, exports
    from embedrank.texts import vocabulary_texts

    path = tiny_model("qwen3", "causal-lm")
    seen = []
    calibrate = converters.calibration_batches

    def recorded(tokenizer, head, texts, max_length):
        batches = calibrate(tokenizer, head, texts, max_length)
        seen.append((tokenizer, batches))
        return batches

    monkeypatch.setattr(converters, "calibration_batches", recorded)
    monkeypatch.setattr(exports.converters, "calibration_batches", recorded)
    ce = CrossEncoder.from_pretrained(path, backend="openvino", precision="int8", cache_dir=tmp_path)
    (tokenizer, batches), *_ = seen
    prefix, suffix = tokenizer.prefix_ids, tokenizer.suffix_ids
    for batch in batches:  # every calibration row is a templated pair, padded on the left
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
            real = [int(i) for i, m in zip(ids, mask, strict=True) if m]
            assert real[: len(prefix)] == prefix and real[-len(suffix) :] == suffix and mask[-1] == 1
    texts = vocabulary_texts(tokenizer.get_vocab(), n=64)
    many = [("green tea", t) for t in texts]
    from scipy.stats import spearmanr

    rho = spearmanr(np.ravel(ce.score_pairs(many)), qwen3_reranker_scores(path, many, ce.max_seq_length)).statistic
    assert rho >= 0.9


@pytest.mark.parametrize("backend", ["torch", pytest.param("openvino", marks=pytest.mark.slow),
                                     pytest.param("onnx", marks=pytest.mark.slow)])  # fmt: skip
def test_a_causal_lm_reranker_scores_as_its_model_card_says(backend):
    path = tiny_model("qwen3", "causal-lm")
    ce = CrossEncoder.from_pretrained(path, backend=backend)
    assert (ce.backend, ce.num_labels, ce.activation) == (backend, 1, "Sigmoid")
    expected = qwen3_reranker_scores(path, LLM_PAIRS, ce.max_seq_length)
    out = ce.score_pairs_with_stats(LLM_PAIRS, batch_size=3)  # batches mix lengths: left padding matters
    assert np.abs(out.scores - expected).max() < (1e-5 if backend == "torch" else 1e-4)
    assert out.truncated == [False, False, False, True, True]
    assert out.token_counts[-1] == ce.max_seq_length
    # long documents are split into windows that fit beside the query and the template, like any reranker
    from embedrank.models.chunking import Chunking

    long_doc = "green tea " * 400
    chunked = ce.score("green tea", [long_doc, "a"], chunking=Chunking())
    assert np.all((chunked > 0) & (chunked < 1))
    assert chunked[1] == pytest.approx(ce.score("green tea", ["a"])[0], abs=1e-6)
    with pytest.raises(Exception, match="LLM reranker"):
        Encoder.from_pretrained(path, backend="torch")


def test_several_labels_score_by_the_relevance_label(tmp_path, fake_service):
    from embedrank.errors import ModelKindError

    docs = [d for _, d in PAIRS[:3]]
    pairs = [("green tea", d) for d in docs]
    two = CrossEncoder.from_pretrained(tiny_model("bert", "cross-encoder", num_labels=2), backend="torch")
    logits = two.score_pairs(pairs)  # (N, 2): every label, as sentence-transformers returns them
    assert logits.shape == (3, 2)
    monobert = np.exp(logits[:, 1]) / np.exp(logits).sum(axis=1)  # [not relevant, relevant], softmax
    np.testing.assert_allclose(two.score("green tea", docs), monobert, rtol=1e-5)
    assert list(two.rank("green tea", docs)["index"]) == list(np.argsort(-monobert))
    # three labels: the one named as relevance (an NLI model's entailment), else a clear refusal
    path = tmp_path / "nli"
    shutil.copytree(tiny_model("bert", "cross-encoder", num_labels=3), path)
    config = json.loads((path / "config.json").read_text())
    config["id2label"] = {"0": "contradiction", "1": "entailment", "2": "neutral"}
    config["label2id"] = {v: int(k) for k, v in config["id2label"].items()}
    (path / "config.json").write_text(json.dumps(config))
    nli = CrossEncoder.from_pretrained(str(path), backend="torch")
    raw = nli.score_pairs(pairs)
    expected = np.exp(raw[:, 1]) / np.exp(raw).sum(axis=1)
    np.testing.assert_allclose(nli.score("green tea", docs), expected, rtol=1e-5)
    with fake_service({"nli": nli}) as client:
        body = client.post("/v1/rerank", json={"model": "nli", "query": "green tea", "documents": docs})
        assert body.status_code == 200
        for r in body.json()["results"]:
            assert r["relevance_score"] == pytest.approx(float(expected[r["index"]]), abs=1e-5)
    config["id2label"] = {"0": "a", "1": "b", "2": "c"}
    config["label2id"] = {"a": 0, "b": 1, "c": 2}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelKindError, match=r"3 labels \(\['a', 'b', 'c'\]\) and none names relevance"):
        CrossEncoder.from_pretrained(str(path), backend="torch").score("q", ["d"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("systems", "texts"),
    [
        (["openvino:fp32"], 8),  # the default backend; torch's parity is checked per architecture above
        pytest.param(["torch:fp32", "openvino:fp32"], 16, marks=pytest.mark.extended),
    ],
    ids=["default-backend", "torch-and-default"],
)
def test_the_support_matrix_runs_and_every_row_holds(systems, texts):
    """The script behind the supported-models page (ONNX, bf16 and int8 rows are recorded by ``make
    bench NAME=support``); the exports made by the tests above are reused."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    command = [
        sys.executable,
        "-m",
        "eval",
        "bench",
        "support",
        "--systems",
        *systems,
        "--rounds",
        "1",
        "--texts",
        str(texts),
    ]
    run = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    detail = re.compile(r"\| \S+ \| (embedding|cross-encoder|llm-reranker) \| \w+:fp32 \|")
    rows = [line for line in run.stdout.splitlines() if detail.match(line)]
    llm_rerankers = 1  # qwen3, checked against its model card's recipe
    assert len(rows) == len(systems) * (len(ARCHITECTURES) + len(CROSS_ENCODERS) + llm_rerankers)
    assert all(line.endswith("| parity |") for line in rows), [r for r in rows if not r.endswith("| parity |")]


@pytest.mark.slow
def test_the_harness_evaluates_any_architecture(tmp_path):
    """``eval/run.py --model PATH --reranker PATH`` with an MPNet embedder and a causal-LM reranker."""
    import subprocess
    import sys
    from pathlib import Path

    model, reranker = tiny_model("mpnet"), tiny_model("qwen3", "causal-lm")
    script = Path(__file__).resolve().parents[2] / "eval" / "run.py"
    command = [sys.executable, str(script), "--model", model, "--reranker", reranker, "--backend", "torch",
               "--json-out", str(tmp_path / "r.json"), "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    runs = json.loads((tmp_path / "r.json").read_text())["runs"]
    # the first-stage run (derived from the reranked one's first stage) and the reranked run
    assert [r["system"] for r in runs] == [
        f"dense@{Path(model).name}",
        f"dense@{Path(model).name}>{Path(reranker).name}",
    ]
    assert (runs[1]["model"], runs[1]["reranker"]) == (model, reranker)
    assert all(0 <= r["metrics"]["ndcg@10"] <= 1 for r in runs)


@pytest.fixture(scope="module")
def static_model(tmp_path_factory):
    """A model2vec-style static model (a vector per token, then Normalize), saved by sentence-transformers."""
    import torch
    from sentence_transformers.models import Normalize, StaticEmbedding
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    static = StaticEmbedding(AutoTokenizer.from_pretrained(tiny_model("bert"))._tokenizer, embedding_dim=32)
    path = tmp_path_factory.mktemp("static") / "model"
    SentenceTransformer(modules=[static, Normalize()], device="cpu").save(str(path))
    return str(path)


def test_a_static_model_matches_sentence_transformers(static_model, fake_service):
    st = SentenceTransformer(static_model, device="cpu")
    enc = Encoder.from_pretrained(static_model)  # no backend named: a lookup runs in torch, no export
    assert (enc.backend, enc.dimension, enc.fallback_reason) == ("torch", 32, None)
    out = enc.encode_with_stats(TEXTS, batch_size=2)
    assert np.abs(out.embeddings - st.encode(TEXTS)).max() < 1e-5
    # no special tokens and no truncation, as sentence-transformers' StaticEmbedding
    assert out.token_counts == [len(st[0].tokenizer.encode(t, add_special_tokens=False).ids) for t in TEXTS]
    assert not any(out.truncated)
    with pytest.raises(Exception, match="static embedding model"):
        Encoder.from_pretrained(static_model, backend="openvino")
    for streams in (2, 0):  # a lookup has no streams to split a batch across: refused, never ignored
        with pytest.raises(InvalidInputError) as refused:
            Encoder.from_pretrained(static_model, streams=streams)
        assert refused.value.param == "streams"
    with fake_service({"static": enc}) as client:
        (card,) = client.get("/v1/models").json()["data"]
        assert (card["dimension"], card["backend"], card["fallback_reason"]) == (32, "torch", None)
        body = client.post("/v1/embeddings", json={"model": "static", "input": TEXTS}).json()
        got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
        assert np.abs(got - out.embeddings).max() < 1e-6 and body["usage"]["prompt_tokens"] == sum(out.token_counts)


@pytest.mark.parametrize("name", ["bert", "qwen3"])  # right and left padding
def test_pooling_without_the_prompt_matches_sentence_transformers(name, tmp_path, fake_service):
    """``include_prompt: false`` (INSTRUCTOR-style models): the model sees the prompt, pooling leaves it out."""
    path = tmp_path / name
    shutil.copytree(tiny_model(name), path)
    pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
    pooling.update(include_prompt=False, pooling_mode_mean_tokens=True, pooling_mode_lasttoken=False,
                   pooling_mode_cls_token=False)  # fmt: skip
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    st = SentenceTransformer(str(path), device="cpu")
    enc = Encoder.from_pretrained(str(path), backend="torch")
    for options in ({"prompt_name": "query"}, {"prompt": "Represent this sentence: "}, {}):
        expected = st.encode(TEXTS, batch_size=2, **options)
        assert np.abs(enc.encode(TEXTS, batch_size=2, **options) - expected).max() < 1e-5, options
    with_prompt = st.encode(TEXTS[:2], prompt_name="query")
    assert np.abs(with_prompt - st.encode(TEXTS[:2])).max() > 1e-3  # the prompt still changes the vectors
    with fake_service({"m": enc}) as client:  # rows of different prompts share the engine's batches
        body = client.post("/v1/embeddings", json={"model": "m", "input": TEXTS[:2], "input_type": "query"}).json()
        assert np.abs(np.array([d["embedding"] for d in body["data"]]) - with_prompt).max() < 1e-5


def test_the_service_reports_a_fallback_and_its_reason(monkeypatch, tmp_path):
    from litestar.testing import TestClient

    from embedrank.runtime import converters
    from service.app import create_app
    from service.settings import Settings

    def broken(*args, **kwargs):
        raise RuntimeError("converter says no")

    monkeypatch.setattr(converters, "to_openvino", broken)
    monkeypatch.setenv("EMBEDRANK_CACHE", str(tmp_path))  # a fresh export cache: the export is tried
    monkeypatch.delenv("EMBEDRANK_BACKEND", raising=False)
    monkeypatch.delenv("EMBEDRANK_PRECISION", raising=False)
    settings = Settings.from_env({"EMBEDRANK_API_KEYS": "k", "EMBEDRANK_MODELS": f"m={tiny_model('bert')}"})
    with TestClient(create_app(settings, wait_for_models=True)) as client:
        (card,) = client.get("/v1/models", headers={"Authorization": "Bearer k"}).json()["data"]
    assert card["backend"] == "torch"
    assert card["fallback_reason"] == "could not export to openvino fp32: RuntimeError: converter says no"


def test_an_architecture_transformers_does_not_ship_is_named(tmp_path):
    path = tmp_path / "model"
    shutil.copytree(tiny_model("bert"), path)
    config = json.loads((path / "config.json").read_text())
    config.update(model_type="not-an-architecture", architectures=["NotAModel"])
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=r"'not-an-architecture', which transformers .* does not ship"):
        Encoder.from_pretrained(str(path))  # refused when resolved: no export is tried, no raw exception


def test_a_cached_hub_model_without_weights_is_a_clear_miss(tmp_path, monkeypatch):
    """Offline, a hub id resolves from the Hugging Face cache only when its snapshot holds weights; a snapshot
    with only metadata (an interrupted download) is reported, not handed to transformers to fail on."""
    import huggingface_hub.constants

    from embedrank.errors import ModelNotFoundError

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "models--someone--half-downloaded"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copy(Path(tiny_model("bert")) / "config.json", snapshot / "config.json")
    with pytest.raises(
        ModelNotFoundError, match=r"Hugging Face cache \S+ \(FileNotFoundError: no safetensors .*HF_HUB_OFFLINE"
    ):
        resolve("someone/half-downloaded")
    shutil.copy(Path(tiny_model("bert")) / "model.safetensors", snapshot / "model.safetensors")
    assert resolve("someone/half-downloaded").path == str(snapshot)
