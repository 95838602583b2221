"""An embedding model with task adapters (:mod:`embedrank.models.adapters`) against sentence-transformers with the
same PEFT adapters loaded: tiny seeded BERT, XLM-R, transformers' own jina-embeddings-v3 (``JinaEmbeddingsV3``) and
Qwen3 (jina-embeddings-v5's base) models, each with three LoRA adapters in ``adapters/<name>/`` (``init_lora_weights=False``, so every update is far
from zero). Each adapter's vectors equal sentence-transformers' ``set_adapter`` on torch and on the default
backend (one export per adapter), a batch mixing adapters equals each adapter's own, the query and document roles
pick the retrieval adapters with their prompts, and int8 vectors take each adapter's own ranges."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from sentence_transformers import SentenceTransformer
from transformers import AutoModel

from embedrank.errors import InvalidInputError, UnsupportedModelError
from embedrank.models.encoder import Encoder
from embedrank.testing.lora import TARGETS as LORA_TARGETS
from embedrank.testing.lora import TEXTS
from embedrank.testing.tiny import tiny_model

TARGETS = {
    **LORA_TARGETS,
    "jina-embeddings-v3": ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"],  # transformers' JinaEmbeddingsV3
}
NAMES = ("retrieval.query", "retrieval.passage", "text-matching")
PROMPTS = {"retrieval.query": "Represent the query for retrieving evidence documents: ", "retrieval.passage": ""}


def configs(targets: list[str]) -> dict[str, LoraConfig]:
    return {
        "retrieval.query": LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False),
        "retrieval.passage": LoraConfig(
            r=2, lora_alpha=4, use_rslora=True, target_modules=targets[:2], init_lora_weights=False
        ),
        "text-matching": LoraConfig(r=8, lora_alpha=8, target_modules=targets[-1:], init_lora_weights=False),
    }


def peft_name(name: str) -> str:
    """The name PEFT knows an adapter by (a module name: no dots); on disk it is the folder's own."""
    return name.replace(".", "_")


def tiny_jina_v3(out: Path) -> None:
    """A tiny seeded ``JinaEmbeddingsV3Model`` (transformers' own jina-embeddings-v3: XLM-R with rotary positions) in
    sentence-transformers' layout: the tiny XLM-R's tokenizer and modules, its config and weights replaced."""
    from transformers import JinaEmbeddingsV3Config, JinaEmbeddingsV3Model

    from embedrank.testing.tiny import spread_weights

    shutil.copytree(tiny_model("xlm-roberta"), out)
    xlmr = json.loads((out / "config.json").read_text())
    same = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    config = JinaEmbeddingsV3Config(
        **{k: xlmr[k] for k in same},
        max_position_embeddings=xlmr["max_position_embeddings"],
        pad_token_id=xlmr["pad_token_id"],
        bos_token_id=xlmr["bos_token_id"],
        eos_token_id=xlmr["eos_token_id"],
    )
    torch.manual_seed(0)
    model = JinaEmbeddingsV3Model(config).eval()
    spread_weights(model, 0)
    (out / "model.safetensors").unlink()
    model.save_pretrained(str(out))


def adapted_model(arch: str, out: Path) -> Path:
    """A copy of the tiny ``arch`` embedding model with :data:`NAMES`' adapters in ``adapters/<name>/`` and jina's
    task prompts, as jina-embeddings-v5 lays them out."""
    if arch == "jina-embeddings-v3":
        tiny_jina_v3(out)
    else:
        shutil.copytree(tiny_model(arch), out)
    torch.manual_seed(0)
    wanted = {peft_name(k): v for k, v in configs(TARGETS[arch]).items()}
    first = next(iter(wanted))
    peft_model = get_peft_model(AutoModel.from_pretrained(out), wanted.pop(first), adapter_name=first)
    for name, config in wanted.items():
        peft_model.add_adapter(name, config)
    saved = out / "peft"
    peft_model.save_pretrained(str(saved))  # each adapter in a folder of its name
    (out / "adapters").mkdir()
    for name in NAMES:
        shutil.move(saved / peft_name(name), out / "adapters" / name)
    shutil.rmtree(saved)
    st_config = out / "config_sentence_transformers.json"
    config = json.loads(st_config.read_text())
    config["prompts"] = {**config.get("prompts", {}), **PROMPTS}
    st_config.write_text(json.dumps(config))
    return out


def reference(model: Path, adapter: str | None, texts: list[str], prompt: str = "") -> np.ndarray:
    """sentence-transformers' vectors with ``adapter`` loaded and set (None: the base model)."""
    st = SentenceTransformer(str(model), device="cpu")
    if adapter is not None:
        st.load_adapter(str(model / "adapters" / adapter), adapter_name=peft_name(adapter))
        st.set_adapter(peft_name(adapter))
    return st.encode(texts, prompt=prompt)


@pytest.fixture(scope="module", params=list(TARGETS))
def model(request, tmp_path_factory) -> tuple[str, Path, dict[str | None, np.ndarray]]:
    arch = request.param
    path = adapted_model(arch, tmp_path_factory.mktemp(f"adapted-{arch}") / "model")
    expected = {name: reference(path, name, TEXTS) for name in (None, *NAMES)}
    return arch, path, expected


def test_each_adapter_on_torch_equals_sentence_transformers_and_a_mixed_batch_each_adapters_own(model):
    arch, path, expected = model
    enc = Encoder.from_pretrained(str(path), backend="torch")
    assert enc.adapters == tuple(sorted(NAMES))
    for name, vectors in expected.items():
        got = enc.encode(TEXTS, adapter=name, prompt="")
        assert np.abs(got - vectors).max() < 1e-5, (arch, name)
    assert np.abs(expected["text-matching"] - expected[None]).max() > 1e-2  # the updates matter
    chosen = ["text-matching", None, "retrieval.query", "retrieval.passage", "text-matching"]
    batch = enc.tokenize(TEXTS)
    pooled = enc.pooled_batch(batch, adapter=[enc.adapter_index(n) for n in chosen]).numpy()
    mixed = enc.finish_vectors(pooled)
    for row, name in enumerate(chosen):
        assert np.abs(mixed[row] - expected[name][row]).max() < 1e-5, (arch, row, name)


def test_tasks_and_roles_pick_the_adapter_and_its_prompt(model):
    _, path, expected = model
    enc = Encoder.from_pretrained(str(path), backend="torch")
    query = reference(path, "retrieval.query", TEXTS[:2], prompt=PROMPTS["retrieval.query"])
    for got in (
        enc.encode_query(TEXTS[:2]),
        enc.encode(TEXTS[:2], task="retrieval.query"),  # jina-embeddings-v3's task: the adapter and its prompt
        enc.encode(TEXTS[:2], task="query"),
    ):
        assert np.abs(got - query).max() < 1e-5
    assert enc.query_prompt == PROMPTS["retrieval.query"]
    assert np.abs(enc.encode_document(TEXTS) - expected["retrieval.passage"]).max() < 1e-5
    assert np.abs(enc.encode(TEXTS, task="clustering") - expected[None]).max() < 1e-5  # no adapter of that task
    assert np.abs(enc.encode(TEXTS, task="text-matching") - expected["text-matching"]).max() < 1e-5


@pytest.mark.slow  # one export per adapter: one architecture (torch's parity covers the others)
@pytest.mark.parametrize("model", ["jina-embeddings-v3"], indirect=True)
@pytest.mark.parametrize("backend", [None, "onnx"])  # the default backend (OpenVINO), ONNX Runtime
def test_each_adapter_on_the_exported_backends_is_its_own_export_at_parity(model, backend, monkeypatch):
    _, path, expected = model
    monkeypatch.delenv("EMBEDRANK_BACKEND", raising=False)
    monkeypatch.delenv("EMBEDRANK_PRECISION", raising=False)
    enc = Encoder.from_pretrained(str(path), backend=backend)
    assert enc.backend == (backend or "openvino") and enc.adapters == tuple(sorted(NAMES))
    for name, vectors in expected.items():
        assert np.abs(enc.encode(TEXTS, adapter=name, prompt="") - vectors).max() < 1e-4, name
    chosen = ["text-matching", None, "retrieval.query", "retrieval.passage", "text-matching"]
    pooled = enc.pooled_batch(enc.tokenize(TEXTS), adapter=[enc.adapter_index(n) for n in chosen]).numpy()
    mixed = enc.finish_vectors(pooled)
    for row, name in enumerate(chosen):
        assert np.abs(mixed[row] - expected[name][row]).max() < 1e-4, (row, name)


def test_int8_vectors_take_each_adapters_own_ranges(model):
    _, path, _ = model
    enc = Encoder.from_pretrained(str(path), backend="torch")
    enc.fit_ranges(TEXTS * 2)
    base = enc.quantization_ranges()
    matching = enc.quantization_ranges(adapter="text-matching")
    assert np.abs(matching - base).max() > 1e-3
    np.testing.assert_allclose(
        matching[0], enc.encode(TEXTS, adapter="text-matching", prompt="").min(axis=0), rtol=1e-5, atol=1e-6
    )
    got = enc.encode(TEXTS, adapter="text-matching", embedding_type="int8", prompt="")
    assert got.dtype == np.int8 and (got == enc.encode(TEXTS, embedding_type="int8", prompt="")).mean() < 0.9


def test_adapters_are_named_chosen_or_left_out_and_bad_ones_refused(model, tmp_path):
    arch, path, expected = model
    chosen = Encoder.from_pretrained(str(path), backend="torch", adapters={"tm": path / "adapters" / "text-matching"})
    assert chosen.adapters == ("tm",)
    assert np.abs(chosen.encode(TEXTS, adapter="tm", prompt="") - expected["text-matching"]).max() < 1e-5
    listed = Encoder.from_pretrained(str(path), backend="torch", adapters=[path / "adapters" / "retrieval.passage"])
    assert listed.adapters == ("retrieval.passage",)
    bare = Encoder.from_pretrained(str(path), backend="torch", adapters=[])
    assert bare.adapters == ()
    with pytest.raises(InvalidInputError, match=r"unknown adapter 'nope'; model .* has none"):
        bare.encode(TEXTS, adapter="nope")
    with pytest.raises(InvalidInputError, match=r"unknown adapter 'nope'; this model has 'tm'") as info:
        chosen.encode(TEXTS, adapter="nope")
    assert info.value.param == "adapter"
    with pytest.raises(InvalidInputError, match="holds no PEFT adapter"):
        Encoder.from_pretrained(str(path), backend="torch", adapters={"x": tmp_path})
    with pytest.raises(InvalidInputError, match="not one folder"):
        Encoder.from_pretrained(str(path), backend="torch", adapters=str(path / "adapters" / "text-matching"))
    other = "bert" if arch in ("qwen3", "jina-embeddings-v3") else "qwen3"  # (XLM-R's layers are named as BERT's)
    with pytest.raises(UnsupportedModelError, match=r"trained on another base model|maps"):
        Encoder.from_pretrained(
            tiny_model(other), backend="torch", adapters={"tm": path / "adapters" / "text-matching"}
        )


@pytest.mark.parametrize("model", ["xlm-roberta"], indirect=True)
def test_a_served_base_gives_each_adapters_vectors_to_the_openai_sdk(model):
    """The service over the model and its three adapters (torch): the openai SDK's ``extra_body`` with ``adapter``
    or Jina's ``task`` gets the library's vectors; an unknown adapter is a 400 that names the model's."""
    import openai
    from litestar.testing import TestClient

    from service.app import create_app
    from service.settings import Auth, Engine, ModelEntry, Models, Settings

    _, path, _ = model
    enc = Encoder.from_pretrained(str(path), backend="torch")
    settings = Settings(
        auth=Auth(api_keys=("k",)),
        models=Models(entries=(ModelEntry(id="jina-like", path=str(path), backend="torch"),)),
        engine=Engine(tune_malloc=False),
    )
    with TestClient(create_app(settings, wait_for_models=True)) as client:
        api = openai.OpenAI(api_key="k", base_url=f"{client.base_url}/v1", http_client=client, max_retries=0)
        assert client.get("/v1/models", headers={"Authorization": "Bearer k"}).json()["data"][0]["adapters"] == sorted(
            NAMES
        )
        for extra, library in (
            ({"adapter": "text-matching"}, enc.encode(TEXTS, adapter="text-matching")),
            ({"task": "retrieval.query"}, enc.encode(TEXTS, task="retrieval.query")),
            ({"input_type": "document"}, enc.encode_document(TEXTS)),
            ({}, enc.encode(TEXTS)),
        ):
            got = api.embeddings.create(model="jina-like", input=TEXTS, extra_body=extra)
            vectors = np.array([d.embedding for d in got.data], dtype=np.float32)
            assert np.abs(vectors - library).max() < 1e-5, extra
        with pytest.raises(
            openai.BadRequestError, match=r"retrieval\.passage, retrieval\.query, text-matching"
        ) as info:
            api.embeddings.create(model="jina-like", input=TEXTS, extra_body={"adapter": "separation"})
        assert info.value.body["param"] == "adapter"  # type: ignore[index]
