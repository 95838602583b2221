"""A SPLADE model with LoRA adapters over its masked LM against sentence-transformers' ``SparseEncoder`` over PEFT's
model with the same adapters set one at a time: a tiny seeded BERT masked LM, two adapters with
``init_lora_weights=False`` (one of them on the language-model head's layers too), so that every update is far from
zero. Each adapter's sparse vectors equal PEFT's on torch and on ONNX Runtime (one export per adapter), and a batch
mixing adapters gives each text its adapter's vector."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForMaskedLM

from embedrank.errors import InvalidInputError
from embedrank.models.sparse import SparseEncoder
from embedrank.testing.lora import TARGETS, TEXTS
from embedrank.testing.tiny import tiny_model

NAMES = ("biomedical", "legal")


def adapted_splade(out: Path) -> Path:
    """A copy of the tiny BERT masked LM with :data:`NAMES`' adapters in ``adapters/<name>/``."""
    shutil.copytree(tiny_model("bert", "masked-lm"), out)
    torch.manual_seed(0)
    wanted = {
        "biomedical": LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS["bert"], init_lora_weights=False),
        # the language-model head's transform too: the expansion terms change, not only the encoder's states
        "legal": LoraConfig(r=2, lora_alpha=4, target_modules=["value", "transform.dense"], init_lora_weights=False),
    }
    peft_model = get_peft_model(AutoModelForMaskedLM.from_pretrained(out), wanted["biomedical"], "biomedical")
    peft_model.add_adapter("legal", wanted["legal"])
    saved = out / "peft"
    peft_model.save_pretrained(str(saved))
    (out / "adapters").mkdir()
    for name in NAMES:
        shutil.move(saved / name, out / "adapters" / name)
    shutil.rmtree(saved)
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Path, dict[str | None, np.ndarray]]:
    """The adapted model and sentence-transformers' vectors of :data:`TEXTS` with each adapter set (None: none)."""
    from sentence_transformers.sparse_encoder import SparseEncoder as Reference

    path = adapted_splade(tmp_path_factory.mktemp("adapted-splade") / "model")
    reference = Reference(str(path), device="cpu")
    expected = {None: reference.encode(TEXTS, convert_to_sparse_tensor=False).numpy()}
    # PEFT wraps the reference's own masked LM in place: it then computes the adapter set
    peft = PeftModel.from_pretrained(reference[0].auto_model, str(path / "adapters" / NAMES[0]), adapter_name=NAMES[0])
    peft.load_adapter(str(path / "adapters" / NAMES[1]), adapter_name=NAMES[1])
    for name in NAMES:
        peft.set_adapter(name)
        expected[name] = reference.encode(TEXTS, convert_to_sparse_tensor=False).numpy()
    return path, expected


@pytest.mark.parametrize(("backend", "tolerance"), [("torch", 1e-5), ("onnx", 1e-4)])
def test_each_adapter_gives_peft_s_vectors_and_a_mixed_batch_each_texts_own(model, backend, tolerance, monkeypatch):
    path, expected = model
    monkeypatch.delenv("EMBEDRANK_PRECISION", raising=False)
    splade = SparseEncoder.from_pretrained(str(path), backend=backend)
    assert splade.adapters == NAMES and splade.runtime.backend == backend
    for name, vectors in expected.items():
        np.testing.assert_allclose(
            splade.encode(TEXTS, adapter=name).toarray(), vectors, atol=tolerance, err_msg=str(name)
        )
    assert np.abs(expected["legal"] - expected[None]).max() > 1e-2  # the adapters matter
    chosen = ["legal", None, "biomedical", "legal", None]
    rows = [row for text, name in zip(TEXTS, chosen, strict=True) for row in splade.tokenize_rows([text], adapter=name)]
    mixed = splade.weights_rows(rows).values
    for i, name in enumerate(chosen):
        np.testing.assert_allclose(mixed[i], expected[name][i], atol=tolerance, err_msg=f"{i} {name}")


def test_an_unknown_adapter_is_refused_naming_the_models(model):
    path, _ = model
    splade = SparseEncoder.from_pretrained(str(path), backend="torch")
    with pytest.raises(InvalidInputError, match=r"unknown adapter 'web'; this model has 'biomedical', 'legal'"):
        splade.encode(TEXTS, adapter="web")
    assert SparseEncoder.from_pretrained(str(path), backend="torch", adapters=[]).adapters == ()


def test_a_served_splade_model_embeds_with_the_adapter_each_request_names(model):
    """TEI's ``/embed_sparse`` with ``adapter`` gets the library's vectors of that adapter; an unknown one is a 400
    that lists the model's."""
    from litestar.testing import TestClient

    from service.app import create_app
    from service.settings import Auth, Engine, ModelEntry, Models, Settings

    path, expected = model
    settings = Settings(
        auth=Auth(api_keys=("k",)),
        models=Models(entries=(ModelEntry(id="splade", path=str(path), backend="torch"),)),
        engine=Engine(tune_malloc=False),
    )
    headers = {"Authorization": "Bearer k"}
    with TestClient(create_app(settings, wait_for_models=True)) as client:
        assert client.get("/v1/models", headers=headers).json()["data"][0]["adapters"] == list(NAMES)
        for adapter in ("legal", None, "biomedical"):
            got = client.post("/embed_sparse", headers=headers, json={"inputs": TEXTS, "adapter": adapter})
            assert got.status_code == 200, got.text
            dense = np.zeros_like(expected[adapter])
            for i, pairs in enumerate(got.json()):
                for pair in pairs:
                    dense[i, pair["index"]] = pair["value"]
            np.testing.assert_allclose(dense, expected[adapter], atol=1e-5, err_msg=str(adapter))
        unknown = client.post("/embed_sparse", headers=headers, json={"inputs": TEXTS, "adapter": "web"})
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "adapter", unknown.text
        assert "its adapters: biomedical, legal" in unknown.json()["error"]["message"]
