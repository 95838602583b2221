"""A cross-encoder with LoRA adapters (PEFT's ``task_type="SEQ_CLS"``: each adapter trains its own copy of the
classification head, saved beside its updates as ``modules_to_save``) against sentence-transformers' CrossEncoder
over PEFT's model with the same adapters set one at a time. Tiny seeded BERT and XLM-R cross-encoders (BERT's head
one linear layer on the pooler, XLM-R's a two-layer head on ``<s>``), three adapters each with
``init_lora_weights=False`` and heads moved off the base's, so that every update is far from zero. Each adapter's
scores equal PEFT's on torch and on the exported backends (one export per adapter, the head merged in), and a batch
mixing adapters scores each pair as its adapter alone does."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from sentence_transformers import CrossEncoder as ReferenceCrossEncoder
from transformers import AutoModelForSequenceClassification

from embedrank.errors import InvalidInputError, UnsupportedModelError
from embedrank.models.cross_encoder import CrossEncoder
from embedrank.runtime.lora import read_adapter
from embedrank.testing.lora import TARGETS, TEXTS
from embedrank.testing.tiny import tiny_model

NAMES = ("biomedical", "legal", "web")
QUERY = "does green tea lower the risk of cancer"
PAIRS = [(QUERY, text) for text in TEXTS] + [("cats", "a cat sat on the mat")]


def configs(targets: list[str]) -> dict[str, LoraConfig]:
    return {
        "biomedical": LoraConfig(
            task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False
        ),
        "legal": LoraConfig(
            task_type="SEQ_CLS", r=2, lora_alpha=4, use_rslora=True, target_modules=targets[:2], init_lora_weights=False
        ),
        "web": LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=8, target_modules=targets[-1:], init_lora_weights=False),
    }


def adapted_cross_encoder(arch: str, out: Path) -> Path:
    """A copy of the tiny ``arch`` cross-encoder with :data:`NAMES`' adapters in ``adapters/<name>/``, each with its
    own head (as PEFT trains a sequence classifier's)."""
    shutil.copytree(tiny_model(arch, "cross-encoder"), out)
    torch.manual_seed(0)
    wanted = configs(TARGETS[arch])
    first = NAMES[0]
    peft_model = get_peft_model(AutoModelForSequenceClassification.from_pretrained(out), wanted[first], first)
    for name in NAMES[1:]:
        peft_model.add_adapter(name, wanted[name])
    heads = peft_model.base_model.model.classifier.modules_to_save  # each adapter's copy of the head
    with torch.no_grad():
        for name in NAMES:  # trained apart from the base's: moved off it
            for parameter in heads[name].parameters():
                parameter.add_(torch.randn_like(parameter) * 0.3)
    saved = out / "peft"
    peft_model.save_pretrained(str(saved))
    (out / "adapters").mkdir()
    for name in NAMES:
        shutil.move(saved / name, out / "adapters" / name)  # each adapter in a folder of its name
    shutil.rmtree(saved)
    return out


def reference(path: Path) -> dict[str | None, np.ndarray]:
    """sentence-transformers' scores of :data:`PAIRS` with each adapter set on PEFT's model (None: the base)."""
    ce = ReferenceCrossEncoder(str(path), device="cpu")
    out: dict[str | None, np.ndarray] = {None: ce.predict(PAIRS)}
    # PEFT wraps the reference's own model in place: its layers and head then compute the adapter set
    peft = PeftModel.from_pretrained(ce.model, str(path / "adapters" / NAMES[0]), adapter_name=NAMES[0])
    for name in NAMES[1:]:
        peft.load_adapter(str(path / "adapters" / name), adapter_name=name)
    for name in NAMES:
        peft.set_adapter(name)
        out[name] = ce.predict(PAIRS)
    return out


@pytest.fixture(scope="module", params=["bert", "xlm-roberta"])
def model(request, tmp_path_factory) -> tuple[str, Path, dict[str | None, np.ndarray]]:
    arch = request.param
    path = adapted_cross_encoder(arch, tmp_path_factory.mktemp(f"adapted-{arch}") / "model")
    return arch, path, reference(path)


def test_each_adapter_with_its_head_scores_as_peft_and_a_mixed_batch_as_each_adapter(model):
    arch, path, expected = model
    assert read_adapter(path / "adapters" / "web").saved  # its own head, saved whole
    ce = CrossEncoder.from_pretrained(str(path), backend="torch")
    assert ce.adapters == NAMES
    for name, scores in expected.items():
        np.testing.assert_allclose(ce.score_pairs(PAIRS, adapter=name), scores, atol=1e-5, err_msg=f"{arch} {name}")
    assert np.abs(expected["web"] - expected[None]).max() > 1e-2  # the adapters matter
    assert np.abs(expected["web"] - expected["legal"]).max() > 1e-2
    chosen = ["web", None, "biomedical", "legal", "web", "legal"]
    rows = [row for pair, name in zip(PAIRS, chosen, strict=True) for row in ce.tokenize_rows([pair], adapter=name)]
    mixed = ce.score_rows(rows).values
    for i, name in enumerate(chosen):
        assert abs(mixed[i] - expected[name][i]) < 1e-5, (arch, i, name)
    one = ce.score_rows(ce.tokenize_rows(PAIRS, adapter="legal")).values  # every row one adapter: its head alone
    np.testing.assert_allclose(one, expected["legal"], atol=1e-5)
    ranked = ce.rank(QUERY, TEXTS, adapter="biomedical")
    np.testing.assert_allclose(ranked["score"], sorted(expected["biomedical"][: len(TEXTS)], reverse=True), atol=1e-5)


@pytest.mark.parametrize("model", ["xlm-roberta"], indirect=True)
@pytest.mark.parametrize("backend", [None, "onnx"])  # the default backend (OpenVINO), ONNX Runtime
def test_each_adapter_on_the_exported_backends_is_its_own_export_at_parity(model, backend, monkeypatch):
    _, path, expected = model
    monkeypatch.delenv("EMBEDRANK_BACKEND", raising=False)
    monkeypatch.delenv("EMBEDRANK_PRECISION", raising=False)
    ce = CrossEncoder.from_pretrained(str(path), backend=backend)
    assert ce.backend == (backend or "openvino") and ce.adapters == NAMES
    for name, scores in expected.items():
        np.testing.assert_allclose(ce.score_pairs(PAIRS, adapter=name), scores, atol=1e-4, err_msg=str(name))
    chosen = ["web", None, "biomedical", "legal", "web", "legal"]
    rows = [row for pair, name in zip(PAIRS, chosen, strict=True) for row in ce.tokenize_rows([pair], adapter=name)]
    mixed = ce.score_rows(rows).values
    for i, name in enumerate(chosen):
        assert abs(mixed[i] - expected[name][i]) < 1e-4, (i, name)


@pytest.mark.parametrize("model", ["bert"], indirect=True)
def test_unknown_adapters_and_heads_that_do_not_fit_are_refused(model, tmp_path):
    _, path, _ = model
    bare = CrossEncoder.from_pretrained(str(path), backend="torch", adapters=[])
    assert bare.adapters == ()
    with pytest.raises(InvalidInputError, match=r"unknown adapter 'web'; model .* has none") as info:
        bare.score(QUERY, TEXTS, adapter="web")
    assert info.value.param == "adapter"
    two_labels = tiny_model("bert", "cross-encoder", num_labels=2)  # the same layers, a head of another shape
    with pytest.raises(UnsupportedModelError, match=r"its module 'classifier' does not fit the model's"):
        CrossEncoder.from_pretrained(two_labels, backend="torch", adapters={"web": path / "adapters" / "web"})


@pytest.mark.parametrize("model", ["bert"], indirect=True)
def test_a_served_cross_encoder_reranks_with_the_adapter_each_request_names(model):
    """The service over the cross-encoder and its three adapters (torch): Cohere's and TEI's rerank bodies with
    ``adapter`` get the library's scores; an unknown adapter, or one sent to a model that reranks by cosine, is a 400
    that says why."""
    from litestar.testing import TestClient

    from service.app import create_app
    from service.settings import Auth, Engine, ModelEntry, Models, Settings

    _, path, expected = model
    settings = Settings(
        auth=Auth(api_keys=("k",)),
        models=Models(
            entries=(
                ModelEntry(id="reranker", path=str(path), backend="torch"),
                ModelEntry(id="bi", path="fake:encoder"),
            )
        ),
        engine=Engine(tune_malloc=False),
    )
    documents = [text for _, text in PAIRS[: len(TEXTS)]]
    headers = {"Authorization": "Bearer k"}
    with TestClient(create_app(settings, wait_for_models=True)) as client:
        listed = {m["id"]: m.get("adapters") for m in client.get("/v1/models", headers=headers).json()["data"]}
        assert listed["reranker"] == list(NAMES)
        for adapter in (*NAMES, None):
            body = {"model": "reranker", "query": QUERY, "documents": documents, "adapter": adapter}
            got = client.post("/v1/rerank", headers=headers, json=body)
            assert got.status_code == 200, got.text
            scores = {r["index"]: r["relevance_score"] for r in got.json()["results"]}
            want = expected[adapter][: len(TEXTS)]
            np.testing.assert_allclose([scores[i] for i in range(len(TEXTS))], want, atol=1e-5, err_msg=str(adapter))
            tei = client.post("/rerank", headers=headers, json={"query": QUERY, "texts": documents, "adapter": adapter})
            assert tei.status_code == 200, tei.text
            np.testing.assert_allclose(
                [r["score"] for r in sorted(tei.json(), key=lambda r: r["index"])], want, atol=1e-5
            )
        unknown = client.post(
            "/v1/rerank",
            headers=headers,
            json={"model": "reranker", "query": QUERY, "documents": ["a"], "adapter": "x"},
        )
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "adapter", unknown.text
        assert "its adapters: biomedical, legal, web" in unknown.json()["error"]["message"]
        cosine = client.post(
            "/v1/rerank", headers=headers, json={"model": "bi", "query": QUERY, "documents": ["a"], "adapter": "web"}
        )
        assert cosine.status_code == 400 and "takes no adapter" in cosine.json()["error"]["message"], cosine.text
