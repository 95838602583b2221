"""backend/precision "auto": the candidates, the rule, the measurement's bookkeeping and its cache, on tiny
seeded models and on fake runtimes (no assertion depends on this machine's speed: timings are either
replaced by fixed ratios or only checked for consistency with the rule)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from embedrank.errors import InvalidInputError, UnsupportedModelError
from embedrank.models.cross_encoder import CrossEncoder
from embedrank.models.encoder import Encoder
from embedrank.runtime import auto
from embedrank.runtime.backends import check_backend
from embedrank.testing.tiny import tiny_model


def test_auto_is_a_setting_of_either_name_and_nothing_else_is_new():
    assert check_backend("auto", "auto") == ("auto", "auto")
    assert check_backend("onnx", "auto") == ("onnx", "auto")
    with pytest.raises(InvalidInputError, match="choose fp32, bf16, fp16, int8 or auto"):
        check_backend("auto", "int4")
    with pytest.raises(InvalidInputError, match="'auto'"):
        check_backend("fastest")


def test_candidates_follow_the_cpu_and_what_is_installed():
    avx2 = auto.candidates("auto", "auto", cpu_flags=["avx", "avx2"], installed=lambda m: True)
    assert ("openvino", "bf16") not in avx2  # without bf16 hardware bf16 computes in f32: the fp32 candidate
    assert avx2[0] == auto.REFERENCE
    with_bf16 = auto.candidates("auto", "auto", cpu_flags=["avx512_bf16"], installed=lambda m: True)
    assert ("openvino", "bf16") in with_bf16
    bare = auto.candidates("auto", "auto", cpu_flags=[], installed=lambda m: False)
    assert bare == [("openvino", "fp32"), ("torch", "fp32")]
    assert auto.candidates("auto", "fp32", cpu_flags=[], installed=lambda m: True) == [
        ("openvino", "fp32"),
        ("torch", "fp32"),
        ("onnx", "fp32"),
    ]
    assert auto.candidates("torch", "auto", cpu_flags=["avx512_bf16"], installed=lambda m: True) == [("torch", "fp32")]


def test_agreement_figures_match_a_direct_computation():
    rng = np.random.default_rng(0)

    def unit(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    ref, ref_q = unit(rng.normal(size=(40, 8))), unit(rng.normal(size=(12, 8)))
    cand, cand_q = (
        unit(ref + rng.normal(scale=0.2, size=ref.shape)),
        unit(ref_q + rng.normal(scale=0.2, size=ref_q.shape)),
    )
    got = auto.embedding_agreement(ref, cand, ref_q, cand_q, k=5)
    cosines = [float(a @ b) for a, b in zip(ref, cand, strict=True)]
    overlaps = []
    for q_ref, q_cand in zip(ref_q, cand_q, strict=True):
        want = sorted(range(40), key=lambda i: -float(q_ref @ ref[i]))[:5]
        have = sorted(range(40), key=lambda i: -float(q_cand @ cand[i]))[:5]
        overlaps.append(len(set(want) & set(have)) / 5)
    assert got["cosine"] == pytest.approx(min(cosines), abs=1e-6)
    assert got["overlap"] == pytest.approx(sum(overlaps) / len(overlaps), abs=1e-6)
    assert 0 < got["overlap"] < 1  # the noise was large enough to change some rankings: the figure is tested

    from scipy.stats import spearmanr

    a, b = rng.normal(size=30), rng.normal(size=30)
    assert auto.score_agreement(a, b)["rho"] == pytest.approx(spearmanr(a, b).statistic, abs=1e-6)


class FakeRuntime:
    """Embeddings of the reference plus noise of ``scale``; ``calls`` counts forward passes."""

    def __init__(self, backend, precision, scale=0.0):
        self.backend, self.precision, self.inference_precision = backend, precision, "f32"
        self.scale, self.calls = scale, 0

    def __call__(self, features):
        self.calls += 1
        ids = features["input_ids"].float()
        base = torch.stack([torch.sin(ids * (j + 1) / 7.0) for j in range(16)], dim=-1)  # (B, T, 16)
        noise = torch.sin(ids[..., None] * 13.0 + torch.arange(16)) * self.scale
        return base + noise


def _work():
    features = {"input_ids": torch.arange(1, 41).reshape(4, 10), "attention_mask": torch.ones(4, 10, dtype=torch.long)}
    return auto.Workload(checks=[features], queries=[features], batch=features, single=features, pooling="mean")


def test_choose_keeps_the_rule_leaves_out_what_fails_and_caches_the_decision(monkeypatch, tmp_path, machine):
    ratios = {"torch": (0.9, 1.5), "onnx": (2.0, 1.8), "openvino-int8": (3.0, 2.5), "openvino-bf16": (1.5, 1.2)}
    runtimes = {
        ("openvino", "fp32"): FakeRuntime("openvino", "fp32"),
        ("torch", "fp32"): FakeRuntime("torch", "fp32"),  # slower on batches: not eligible
        ("openvino", "int8"): FakeRuntime("openvino", "int8", scale=5.0),  # fastest, but wrong: out of bound
        ("openvino", "bf16"): FakeRuntime("openvino", "bf16", scale=1e-4),
    }

    def load(backend, precision):
        if (backend, precision) == ("onnx", "fp32"):
            raise UnsupportedModelError("could not export 'm' to onnx fp32 (RuntimeError: no)")
        if (backend, precision) == ("onnx", "int8"):  # a graph the CPU plugin cannot compile: left out too
            raise RuntimeError("Exception from core.cpp:\nSupported primitive descriptors list is empty")
        return runtimes[backend, precision]

    def fixed_ratios(reference, runtime, work):
        batch, single = ratios[
            runtime.backend if runtime.precision == "fp32" else f"{runtime.backend}-{runtime.precision}"
        ]
        return batch, single, [(batch * single) ** 0.5] * auto.ROUNDS

    monkeypatch.setattr(auto, "_ratios", fixed_ratios)
    options = [("openvino", "fp32"), ("torch", "fp32"), ("onnx", "fp32"), ("openvino", "bf16"), ("openvino", "int8")]
    options.append(("onnx", "int8"))
    cache = tmp_path / "m-auto.json"
    runtime, choice = auto.choose("m", options, load, _work(), cache)
    assert (choice.backend, choice.precision) == ("openvino", "bf16") and runtime is runtimes["openvino", "bf16"]
    trials = {t.name: t for t in choice.trials}
    assert trials["onnx fp32"].excluded.startswith("not loaded (UnsupportedModelError: could not export")
    assert trials["onnx int8"].excluded.endswith("core.cpp: Supported primitive descriptors list is empty)")
    assert trials["openvino int8"].excluded.startswith("outside the quality bound (cosine")
    assert trials["torch fp32"].excluded is None and not trials["torch fp32"].batch_ratio >= 1  # measured, slower
    assert "openvino bf16: 1.50x batch, 1.20x single text vs openvino fp32" in choice.summary
    assert json.loads(cache.read_text())["backend"] == "openvino"
    older = json.loads(cache.read_text())
    del older["sample"]  # a decision cached before the sample was recorded still reads
    assert auto.Choice.from_json(older).summary.endswith("with unnamed texts")

    for r in runtimes.values():
        r.calls = 0
    again, cached = auto.choose("m", options, load, _work(), cache)
    assert cached.cached and again is runtimes["openvino", "bf16"]
    assert sum(r.calls for r in runtimes.values()) == 0  # read from the cache: nothing measured

    monkeypatch.setattr(auto, "BOUNDS", {"cosine": 1.01, "overlap": 0.9})  # nothing is that close: the reference
    _, strict = auto.choose("m", options, load, _work(), tmp_path / "strict.json")
    assert (strict.backend, strict.precision) == ("openvino", "fp32")


def test_a_reference_that_fails_gives_its_place_to_the_next_fp32_runtime(tmp_path, monkeypatch, machine):
    monkeypatch.setattr(auto, "_ratios", lambda reference, runtime, work: (1.0, 1.0, [1.0] * auto.ROUNDS))

    def load(backend, precision):
        if backend == "openvino":
            raise UnsupportedModelError("no")
        return FakeRuntime(backend, precision)

    _, choice = auto.choose("m", [("openvino", "fp32"), ("torch", "fp32")], load, _work(), tmp_path / "c.json")
    assert choice.reference == "torch fp32" and choice.backend == "torch"
    with pytest.raises(UnsupportedModelError, match="found no runtime that loads 'm'"):
        auto.choose("m", [("openvino", "fp32")], load, _work(), tmp_path / "none.json")


def _consistent(choice):
    chosen = next(t for t in choice.trials if (t.backend, t.precision) == (choice.backend, choice.precision))
    assert auto.pick(choice.trials) is chosen
    assert chosen.within_bound and chosen.batch_ratio >= 1.0 and chosen.single_ratio >= 1.0
    return chosen


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One export cache for the tiny BERT's candidates, so the service reads the Python API's decision."""
    return tmp_path_factory.mktemp("auto-cache")


def test_an_encoder_with_auto_runs_what_was_chosen_within_the_bound(shared_cache, monkeypatch):
    monkeypatch.setattr(auto, "doubt_of", lambda *args: None)  # however busy the suite's machine: confident
    path = tiny_model("bert")
    encoder = Encoder.from_pretrained(path, backend="auto", precision="fp32", cache_dir=shared_cache)
    choice = encoder.auto_choice
    chosen = _consistent(choice)
    assert (encoder.backend, encoder.precision) == (choice.backend, choice.precision)
    assert {t.name for t in choice.trials} == {"openvino fp32", "torch fp32", "onnx fp32"}
    assert choice.sample == "embedrank's packaged sample (300 of 800 texts)"  # whatever the data directory holds
    assert choice.summary.endswith(f"with {choice.sample}")
    texts = ["a first text about retrieval", "another one, longer than the first, about reranking"]
    reference = Encoder.from_pretrained(path, backend="torch").encode(texts)
    cosines = np.sum(reference * encoder.encode(texts), axis=1) / np.linalg.norm(reference, axis=1) ** 2
    assert cosines.min() >= auto.BOUNDS["cosine"] or chosen.precision == "fp32"

    def measured(*args):
        raise AssertionError("a cached decision measured again")

    monkeypatch.setattr(auto, "_ratios", measured)
    again = Encoder.from_pretrained(path, backend="auto", precision="fp32", cache_dir=shared_cache)
    assert again.auto_choice.cached and again.backend == encoder.backend and again.precision == encoder.precision
    explicit = Encoder.from_pretrained(path, backend="openvino", precision="fp32", cache_dir=shared_cache)
    assert explicit.auto_choice is None  # an explicit setting always wins, and measures nothing


def test_a_cross_encoder_with_auto_precision_stays_on_its_backend(tmp_path):
    model = CrossEncoder.from_pretrained(
        tiny_model("bert", "cross-encoder"), backend="openvino", precision="auto", cache_dir=tmp_path
    )
    choice = model.auto_choice
    _consistent(choice)
    assert {t.backend for t in choice.trials} == {"openvino"} and model.backend == "openvino"
    assert set(choice.trials[1].quality) == {"rho"}


def test_the_service_reports_what_auto_chose(shared_cache, monkeypatch):
    monkeypatch.setattr(auto, "doubt_of", lambda *args: None)
    from litestar.testing import TestClient

    from service.app import create_app
    from service.settings import Settings

    monkeypatch.setenv("EMBEDRANK_CACHE", str(shared_cache))
    models = f"m={tiny_model('bert')}@auto:fp32"
    settings = Settings.from_env({"EMBEDRANK_API_KEYS": "k", "EMBEDRANK_MODELS": models})
    with TestClient(create_app(settings, wait_for_models=True)) as client:
        (card,) = client.get("/v1/models", headers={"Authorization": "Bearer k"}).json()["data"]
        got = client.post("/v1/embeddings", json={"model": "m", "input": "hi"}, headers={"Authorization": "Bearer k"})
    assert card["backend"] in ("openvino", "torch", "onnx") and card["precision"] == "fp32"
    assert card["auto_choice"].startswith(f"{card['backend']} fp32: ")
    assert got.status_code == 200


@pytest.fixture
def machine(monkeypatch):
    """``/proc/stat`` as the test says: ``machine.others`` is the share of the CPU other processes use while the
    candidates are measured (each measurement reads the clock twice)."""

    class Machine:
        others, readings = 0.0, 0

    def clock():
        Machine.readings += 1
        if Machine.readings % 2:  # a measurement starts; it ends a second later, others busy for their share
            return 0.0, 0.0, 0.0
        return Machine.others * (auto.os.cpu_count() or 1), 0.0, 1.0

    monkeypatch.setattr(auto, "cpu_clock", clock)
    return Machine


def test_a_decision_measured_on_a_busy_machine_is_provisional_and_replaced_once_measured_quietly(
    monkeypatch, tmp_path, machine
):
    ratios = {"torch": (1.2, 1.3), "onnx": (2.0, 1.8)}
    runtimes = {(b, "fp32"): FakeRuntime(b, "fp32") for b in ("openvino", "torch", "onnx")}
    busy = {"now": True}

    def measured(reference, runtime, work):
        batch, single = ratios[runtime.backend]
        if busy["now"] and runtime.backend == "torch":  # the busy loops favoured torch this time
            batch, single = 3.0, 3.0
        return batch, single, [(batch * single) ** 0.5] * auto.ROUNDS

    monkeypatch.setattr(auto, "_ratios", measured)
    options = [("openvino", "fp32"), ("torch", "fp32"), ("onnx", "fp32")]
    cache = tmp_path / "m-auto.json"
    machine.others = 0.85
    runtime, choice = auto.choose("m", options, lambda b, p: runtimes[b, p], _work(), cache)
    assert (choice.backend, choice.others_busy) == ("torch", 0.85) and runtime is runtimes["torch", "fp32"]
    assert not choice.confident and choice.doubt == "other processes used 85% of the CPU while it was measured"
    assert "; provisional: other processes used 85%" in choice.summary
    assert json.loads(cache.read_text())["doubt"] == choice.doubt  # the cache says so too
    assert choice.remeasure is not None

    busy["now"], machine.others = False, 0.02  # quiet now: measured again (a server does it when idle)
    again = choice.remeasure()
    assert (again.backend, again.confident, again.remeasure) == ("onnx", True, None)
    assert again.remeasured == f"torch fp32 (provisional, {choice.measured})" and "replaces torch fp32" in again.summary
    for r in runtimes.values():
        r.calls = 0
    loaded, cached = auto.choose("m", options, lambda b, p: runtimes[b, p], _work(), cache)
    assert cached.cached and loaded is runtimes["onnx", "fp32"] and sum(r.calls for r in runtimes.values()) == 0


def test_a_provisional_cached_decision_is_measured_again_at_the_next_load(monkeypatch, tmp_path, machine):
    monkeypatch.setattr(auto, "_ratios", lambda reference, runtime, work: (1.5, 1.5, [1.5] * auto.ROUNDS))
    options = [("openvino", "fp32"), ("torch", "fp32")]
    load = lambda b, p: FakeRuntime(b, p)  # noqa: E731
    machine.others = 0.5
    _, first = auto.choose("m", options, load, _work(), tmp_path / "c.json")
    assert not first.confident
    machine.others = 0.0
    _, second = auto.choose("m", options, load, _work(), tmp_path / "c.json")
    assert not second.cached and second.confident and second.remeasured.endswith(f"(provisional, {first.measured})")


def test_figures_that_cannot_decide_make_a_quiet_decision_provisional(monkeypatch, tmp_path, machine):
    spread = {"torch": [1.0, 3.0, 1.2, 2.9, 1.1], "onnx": [1.5, 1.6, 1.4, 1.5, 1.6]}

    def measured(reference, runtime, work):
        rounds = spread[runtime.backend]
        return sorted(rounds)[2], sorted(rounds)[2], rounds

    monkeypatch.setattr(auto, "_ratios", measured)
    options = [("openvino", "fp32"), ("torch", "fp32"), ("onnx", "fp32")]
    _, choice = auto.choose("m", options, lambda b, p: FakeRuntime(b, p), _work(), tmp_path / "c.json")
    assert choice.others_busy == 0.0 and choice.backend == "onnx"  # torch's median, 1.2, is lower than 1.5
    assert choice.doubt == "the rounds overlap: onnx fp32 scored 1.40 to 1.60, torch fp32 1.00 to 3.00"
    spread["torch"] = [1.0, 1.1, 1.2, 1.1, 1.0]  # apart in every round: decided
    _, decided = auto.choose("m", options, lambda b, p: FakeRuntime(b, p), _work(), tmp_path / "d.json")
    assert decided.confident
