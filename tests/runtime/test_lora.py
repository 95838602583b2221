"""LoRA adapters applied row by row (:mod:`embedrank.runtime.lora`) against PEFT itself, on tiny seeded BERT, XLM-R
and Qwen3 models with three adapters of different ranks, alphas and target layers (``init_lora_weights=False``, so
that every update is far from zero): each adapter's token states equal PEFT's ``set_adapter`` and
``merge_and_unload``; a batch mixing adapters (and rows of the base model) equals each adapter's own batch, in the
padded and the packed forward; adapters that change more than linear layers, or fit another model, are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModel, AutoTokenizer

from embedrank.errors import InvalidInputError, UnsupportedModelError
from embedrank.runtime import packed
from embedrank.runtime.backends import TorchRuntime
from embedrank.runtime.lora import BASE, RowAdapters, find_adapters, read_adapter
from embedrank.testing.lora import TARGETS, TEXTS
from embedrank.testing.tiny import tiny_model

TOLERANCE = 1e-5


def configs(targets: list[str]) -> dict[str, LoraConfig]:
    return {
        "retrieval": LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False),
        "matching": LoraConfig(
            r=2,
            lora_alpha=4,
            use_rslora=True,
            target_modules=targets[:2],
            alpha_pattern={targets[0]: 16},
            init_lora_weights=False,
        ),
        "classification": LoraConfig(r=8, lora_alpha=8, target_modules=targets[-1:], init_lora_weights=False),
    }


@pytest.fixture(scope="module", params=list(TARGETS))
def adapted(request, tmp_path_factory):
    """(architecture, base model folder, adapters' folder, PEFT's token states by adapter name (None: base),
    the tokenized texts)."""
    arch = request.param
    base = tiny_model(arch)
    folder = tmp_path_factory.mktemp(f"lora-{arch}")
    torch.manual_seed(0)
    wanted = configs(TARGETS[arch])
    peft_model = get_peft_model(AutoModel.from_pretrained(base), wanted.pop("retrieval"), adapter_name="retrieval")
    for name, config in wanted.items():
        peft_model.add_adapter(name, config)
    peft_model.save_pretrained(folder)  # each adapter in a folder of its name
    peft_model.eval()
    features = AutoTokenizer.from_pretrained(base)(TEXTS, padding=True, return_tensors="pt")
    states: dict[str | None, torch.Tensor] = {}
    with torch.inference_mode():
        for name in ("retrieval", "matching", "classification"):
            peft_model.set_adapter(name)
            states[name] = peft_model(**features).last_hidden_state
        with peft_model.disable_adapter():
            states[None] = peft_model(**features).last_hidden_state
    return arch, base, folder, states, features


def runtime_with_adapters(base: str, folder: Path, *, padding_free: bool | None = None) -> TorchRuntime:
    runtime = TorchRuntime(
        AutoModel.from_pretrained(base), AutoTokenizer.from_pretrained(base), "encoder", padding_free=padding_free
    )
    runtime.adapters = RowAdapters(runtime.module, [read_adapter(p, n) for n, p in find_adapters(folder).items()])
    return runtime


def real(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The real tokens' states: padding positions differ between a packed and a padded forward."""
    return states[mask.bool()]


def test_every_adapter_equals_peft_and_a_mixed_batch_equals_each_adapters_own(adapted):
    arch, base, folder, states, features = adapted
    mask = features["attention_mask"]
    for padding_free in (False, True) if arch == "bert" else (False,):  # the packed forward: BERT and RoBERTa
        runtime = runtime_with_adapters(base, folder, padding_free=padding_free)
        assert runtime.padding_free == padding_free and packed.real_positions(mask) is not None  # texts of many lengths
        assert sorted(runtime.adapters.names) == ["classification", "matching", "retrieval"]  # type: ignore[union-attr]
        for name, expected in states.items():
            rows = torch.full((len(TEXTS),), runtime.adapters.index(name))  # type: ignore[union-attr]
            got = runtime({**features, "adapter_ids": rows})
            diff = (real(got, mask) - real(expected, mask)).abs().max().item()
            assert diff <= TOLERANCE, (arch, padding_free, name, diff)
        assert (real(states["retrieval"], mask) - real(states[None], mask)).abs().max() > 1e-2  # the updates matter
        chosen = ["matching", None, "retrieval", "classification", "matching"]
        rows = torch.tensor([runtime.adapters.index(n) for n in chosen])  # type: ignore[union-attr]
        mixed = runtime({**features, "adapter_ids": rows})
        for row, name in enumerate(chosen):
            m = mask[row].bool()
            diff = (mixed[row][m] - states[name][row][m]).abs().max().item()
            assert diff <= TOLERANCE, (arch, padding_free, row, name, diff)
        plain = runtime(dict(features))  # no adapter ids: the base model, its hooks idle
        assert (real(plain, mask) - real(states[None], mask)).abs().max().item() <= TOLERANCE


def test_an_adapter_equals_peft_merged_into_the_base(adapted):
    _, base, folder, _, features = adapted
    merged = PeftModel.from_pretrained(AutoModel.from_pretrained(base), folder / "matching").merge_and_unload().eval()
    runtime = runtime_with_adapters(base, folder)
    rows = torch.full((len(TEXTS),), runtime.adapters.index("matching"))  # type: ignore[union-attr]
    mask = features["attention_mask"]
    with torch.inference_mode():
        expected = merged(**features).last_hidden_state
    got = runtime({**features, "adapter_ids": rows})
    assert (real(got, mask) - real(expected, mask)).abs().max().item() <= TOLERANCE


def test_the_scale_follows_alpha_rank_rslora_and_alpha_pattern(adapted):
    arch, _, folder, _, _ = adapted
    targets = TARGETS[arch]
    matching = read_adapter(folder / "matching")
    first = next(layer for path, layer in matching.layers.items() if path.endswith("." + targets[0]))
    second = next(layer for path, layer in matching.layers.items() if path.endswith("." + targets[1]))
    assert first.scale == pytest.approx(16 / 2**0.5) and second.scale == pytest.approx(4 / 2**0.5)  # rsLoRA
    retrieval = read_adapter(folder / "retrieval")
    assert retrieval.rank == 4 and {layer.scale for layer in retrieval.layers.values()} == {2.0}


def test_unknown_names_other_models_and_more_than_lora_are_refused(adapted, tmp_path):
    arch, base, folder, _, _ = adapted
    runtime = runtime_with_adapters(base, folder)
    with pytest.raises(InvalidInputError, match="unknown adapter 'summary'; this model has 'classification'"):
        runtime.adapters.index("summary")  # type: ignore[union-attr]
    other = "qwen3" if arch != "qwen3" else "bert"
    with pytest.raises(UnsupportedModelError, match="no linear layer of this model: was it trained on another"):
        RowAdapters(AutoModel.from_pretrained(tiny_model(other)), [read_adapter(folder / "retrieval")])
    dora = tmp_path / "dora"
    dora.mkdir()
    config = json.loads((folder / "retrieval" / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    (dora / "adapter_model.safetensors").write_bytes((folder / "retrieval" / "adapter_model.safetensors").read_bytes())
    with pytest.raises(UnsupportedModelError, match="DoRA"):
        read_adapter(dora)
    with pytest.raises(InvalidInputError, match="is not a PEFT adapter"):
        read_adapter(tmp_path)
    plain = TorchRuntime(AutoModel.from_pretrained(base), AutoTokenizer.from_pretrained(base), "encoder")
    features = AutoTokenizer.from_pretrained(base)(TEXTS[:1], return_tensors="pt")
    with pytest.raises(InvalidInputError, match="no adapters"):
        plain({**features, "adapter_ids": torch.tensor([BASE])})
    runtime.adapters.detach()  # type: ignore[union-attr]
    rows = torch.tensor([runtime.adapters.index("retrieval")])  # type: ignore[union-attr]
    assert torch.equal(runtime({**features, "adapter_ids": rows}), plain(dict(features)))  # hooks gone: the base


def test_a_mixed_batch_gives_the_same_states_masked_or_gathered(adapted, monkeypatch):
    """Up to MASKED_UP_TO adapters a batch's updates are computed for every position and masked; past it, each on
    its own positions: the same states either way."""
    from embedrank.runtime import lora

    _, base, folder, states, features = adapted
    runtime = runtime_with_adapters(base, folder)
    chosen = ["matching", None, "retrieval", "classification", "matching"]
    rows = torch.tensor([runtime.adapters.index(n) for n in chosen])  # type: ignore[union-attr]
    masked = runtime({**features, "adapter_ids": rows})
    monkeypatch.setattr(lora, "MASKED_UP_TO", 0)
    gathered = runtime({**features, "adapter_ids": rows})
    mask = features["attention_mask"]
    assert (real(masked, mask) - real(gathered, mask)).abs().max().item() <= TOLERANCE
    for row, name in enumerate(chosen):
        m = mask[row].bool()
        assert (gathered[row][m] - states[name][row][m]).abs().max().item() <= TOLERANCE
