"""The inference backends against the torch model: OpenVINO fp32 equals torch, bf16 and int8 keep quality,
exports are cached and keyed by the weights, and the model reports what precision really runs."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import kendalltau

from embedrank import CrossEncoder, Encoder, InvalidInputError
from embedrank.errors import UnsupportedModelError
from embedrank.registry import DEFAULT_EMBEDDING_MODEL, resolve
from embedrank.runtime import converters
from embedrank.runtime.backends import check_backend
from embedrank.runtime.exports import export_key

TEXTS = [
    "What causes the seasons?",
    "The tilt of Earth's axis causes the seasons.",
    "Bananas are yellow.",
    "Ünïcödé: les saisons sont causées par l'inclinaison de la Terre. 季節",
    "Dense retrieval " * 200,  # cut at max_seq_length
    "x",
]


def test_check_backend_names_and_errors(monkeypatch):
    monkeypatch.delenv("EMBEDRANK_BACKEND", raising=False)
    monkeypatch.delenv("EMBEDRANK_PRECISION", raising=False)
    assert check_backend() == ("openvino", "fp32")
    assert check_backend("OpenVINO", "bfloat16") == ("openvino", "bf16")
    monkeypatch.setenv("EMBEDRANK_BACKEND", "torch")
    assert check_backend() == ("torch", "fp32")
    with pytest.raises(InvalidInputError, match="unknown backend 'tensorrt'"):
        check_backend("tensorrt")
    with pytest.raises(InvalidInputError, match="runs precision fp32, int8; got 'bf16'"):
        check_backend("onnx", "bf16")


@pytest.fixture(scope="module")
def torch_encoder():
    return Encoder.from_pretrained(backend="torch")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["openvino", "onnx"])
def test_fp32_backends_equal_torch(torch_encoder, backend, st_model):
    enc = Encoder.from_pretrained(backend=backend, precision="fp32")
    assert (enc.backend, enc.precision, enc.runtime.inference_precision) == (backend, "fp32", "f32")
    assert enc.model is None and enc.dimension == 384
    ours = enc.encode_with_stats(TEXTS, batch_size=4)
    ref = torch_encoder.encode_with_stats(TEXTS, batch_size=4)
    assert np.abs(ours.embeddings - ref.embeddings).max() < 1e-4
    assert ours.token_counts == ref.token_counts and ours.truncated == ref.truncated
    st = st_model.encode(TEXTS, normalize_embeddings=True)
    assert np.abs(ours.embeddings - st).max() < 1e-4


@pytest.mark.slow
def test_bf16_says_it_is_bf16_and_stays_close(torch_encoder):
    enc = Encoder.from_pretrained(backend="openvino", precision="bf16")
    assert enc.precision == "bf16"
    # the CPU plugin reports what it runs: bf16 where the CPU has it, else f32
    assert enc.runtime.inference_precision in ("bf16", "f32")
    cos = (enc.encode(TEXTS) * torch_encoder.encode(TEXTS)).sum(axis=1)
    assert cos.min() > 0.999


def _quantized_quality(enc, sample_dense, n_queries: int = 100, n_docs: int = 500) -> dict[str, float]:
    """What users of a quantized backend care about, against the default fp32 encoder's cached vectors on a
    judged subset of SciFact's sample (its first ``n_queries`` queries, their judged documents and seeded
    others): nDCG@10 of both, the mean top-10 overlap per query, and the mean cosine of the document vectors."""
    from embedrank import evaluate
    from embedrank.retrieval.data import doc_text, judged_sample

    sample, sample_docs, sample_queries = sample_dense
    subset = judged_sample(sample, n_docs, n_queries=n_queries)
    rows = {d: i for i, d in enumerate(sample.corpus)}
    docs = list(subset.corpus)
    reference = (sample_docs[[rows[d] for d in docs]], sample_queries[:n_queries])
    quantized = (enc.encode([doc_text(subset.corpus[d]) for d in docs], batch_size=32),
                 enc.encode(list(subset.queries.values()), batch_size=32))  # fmt: skip
    out: dict[str, float] = {}
    tops = {}
    for name, (d, q) in (("ref", reference), ("quant", quantized)):
        scores = q @ d.T  # (Q, D)
        top = np.argsort(-scores, axis=1)[:, :10]
        tops[name] = top
        run = {qid: {docs[j]: float(scores[i, j]) for j in top[i]} for i, qid in enumerate(subset.queries)}
        out[f"ndcg_{name}"] = evaluate(subset.qrels, run, ["ndcg@10"])["ndcg@10"]
    out["overlap@10"] = float(
        np.mean([len(set(a) & set(b)) / 10 for a, b in zip(tops["ref"], tops["quant"], strict=True)])
    )
    out["cosine"] = float((reference[0] * quantized[0]).sum(axis=1).mean())
    return out


# Quantized backends are judged by retrieval quality and ranking agreement on a judged subset of SciFact,
# with bounds that hold across the int8 kernels of the supported library versions (the cosines of dynamic
# int8 differ by ~0.01 between ONNX Runtime releases; nDCG@10 and the top-10 barely move).
QUANTIZED_BOUNDS = {"ndcg_drop": 0.03, "overlap@10": 0.8, "cosine": 0.97}


def _assert_quantized_quality(quality: dict[str, float]) -> None:
    assert quality["ndcg_ref"] - quality["ndcg_quant"] <= QUANTIZED_BOUNDS["ndcg_drop"], quality
    assert quality["overlap@10"] >= QUANTIZED_BOUNDS["overlap@10"], quality
    assert quality["cosine"] >= QUANTIZED_BOUNDS["cosine"], quality


@pytest.mark.slow
@pytest.mark.data
def test_openvino_int8_keeps_retrieval_quality(scifact_sample_dense):
    enc = Encoder.from_pretrained(backend="openvino", precision="int8")
    assert enc.runtime.inference_precision.startswith("int8+")
    _assert_quantized_quality(_quantized_quality(enc, scifact_sample_dense))


@pytest.mark.slow
def test_cross_encoder_backends_keep_scores_and_order(cross_encoder_dir):
    # the suite's cache: its exports are made by the first run, like the others
    query = "what causes the seasons on earth"
    docs = [t for t in TEXTS if t != query] + [
        "Seasons are caused by the distance from the sun, a common misconception.",
        "Photosynthesis happens in chloroplasts.",
        "Axial tilt makes summer and winter.",
    ]
    ref = CrossEncoder.from_pretrained(cross_encoder_dir, backend="torch").score(query, docs)
    fp32 = CrossEncoder.from_pretrained(cross_encoder_dir, backend="openvino")
    assert fp32.backend == "openvino" and fp32.num_labels == 1 and fp32.activation == "Sigmoid"
    assert np.abs(fp32.score(query, docs) - ref).max() < 1e-4
    calibration = [f"{d} {q}" for d in docs for q in ("seasons", "sun and earth")]
    int8 = CrossEncoder.from_pretrained(
        cross_encoder_dir, backend="openvino", precision="int8", calibration=calibration
    )
    scores = int8.score(query, docs)
    tau = kendalltau(scores, ref).statistic
    assert tau >= 0.8, (tau, scores, ref)
    assert int(np.argmax(scores)) == int(np.argmax(ref))


@pytest.mark.slow
def test_exports_are_cached_and_keyed_by_the_weights(model_path, tmp_path, monkeypatch):
    local = tmp_path / "model"
    shutil.copytree(model_path, local)
    cache = tmp_path / "cache"
    with warnings.catch_warnings(record=True) as caught:  # a first export prints no dependency's warnings
        warnings.simplefilter("always")
        first = Encoder.from_pretrained(str(local), backend="openvino", cache_dir=cache)
    assert not [str(w.message) for w in caught if "torch" in w.filename or "openvino" in w.filename], caught
    (made,) = list((cache / "exports").iterdir())
    info = (made / "export.json").read_text()
    assert '"precision": "fp32"' in info and '"export_seconds"' in info

    def no_export(*args, **kwargs):
        raise AssertionError("exported again although the cache holds this export")

    monkeypatch.setattr(converters, "to_openvino", no_export)
    again = Encoder.from_pretrained(str(local), backend="openvino", cache_dir=cache)
    assert np.array_equal(first.encode(TEXTS), again.encode(TEXTS))
    # bf16 is a compile setting: it runs the same fp32 export
    Encoder.from_pretrained(str(local), backend="openvino", precision="bf16", cache_dir=cache)
    assert len(list((cache / "exports").iterdir())) == 1
    # weights saved again at the same place: a new export
    weights = next(Path(local).glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1_000_000_000))
    with pytest.raises(UnsupportedModelError, match="exported again"):  # the patched converter ran
        Encoder.from_pretrained(str(local), backend="openvino", cache_dir=cache)


@pytest.mark.slow
def test_exported_backends_refuse_torch_only_options():
    with pytest.raises(InvalidInputError, match="CPU"):
        Encoder.from_pretrained(backend="openvino", device="cuda")


@pytest.mark.slow
@pytest.mark.data
@pytest.mark.parametrize("vnni", [True, False], ids=["vnni", "avx2"])
def test_onnx_int8_is_dynamic_and_keeps_retrieval_quality(scifact_sample_dense, vnni, monkeypatch, tmp_path):
    # without VNNI the weights keep 7 bits (AVX2's kernels would saturate 8-bit ones): another graph and key
    monkeypatch.setattr(converters, "onnx_int8_reduce_range", lambda: not vnni)
    enc = Encoder.from_pretrained(backend="onnx", precision="int8", cache_dir=None if vnni else tmp_path)
    assert enc.runtime.inference_precision == "int8+f32"
    info = json.loads((enc.runtime.path.parent / "export.json").read_text())
    assert info["calibration"] is None and info["reduce_range"] is (not vnni)  # dynamic: no calibration texts
    key = enc.runtime.path.parent.name.rsplit("-", 1)[1]
    monkeypatch.setattr(converters, "onnx_int8_reduce_range", lambda: vnni)
    assert export_key(resolve(DEFAULT_EMBEDDING_MODEL), "encoder", "onnx", "int8", []) != key
    _assert_quantized_quality(_quantized_quality(enc, scifact_sample_dense))


@pytest.mark.slow
def test_a_failed_export_says_so_and_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("converter says no\nsecond line")

    monkeypatch.setattr(converters, "to_openvino", broken)
    with pytest.raises(
        UnsupportedModelError, match=r"openvino fp32 \(RuntimeError: converter says no\); load it with backend='torch'"
    ):
        Encoder.from_pretrained(backend="openvino", cache_dir=tmp_path)
    assert not any(p.name.endswith(".xml") for p in tmp_path.rglob("*"))
    # the temporary folder is gone; what remains is the failure, so the next load does not try again
    (failed,) = (tmp_path / "exports").iterdir()
    assert failed.name.endswith(".failed.json") and "converter says no" in failed.read_text()
    monkeypatch.setattr(converters, "to_openvino", lambda *a, **k: pytest.fail("a failed export was tried again"))
    with pytest.raises(UnsupportedModelError, match="converter says no"):
        Encoder.from_pretrained(backend="openvino", cache_dir=tmp_path)


@pytest.mark.slow
def test_the_default_backend_falls_back_to_torch_with_one_warning(tmp_path, monkeypatch, caplog):
    """A model that torch runs but the default backend cannot export still loads, on torch, and says why;
    a backend the caller names is run or refused, never swapped."""
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("converter says no")

    monkeypatch.setattr(converters, "to_openvino", broken)
    monkeypatch.delenv("EMBEDRANK_BACKEND", raising=False)
    monkeypatch.delenv("EMBEDRANK_PRECISION", raising=False)
    for _ in range(2):
        caplog.clear()
        enc = Encoder.from_pretrained(cache_dir=tmp_path)
        assert (enc.backend, enc.precision) == ("torch", "fp32")
        assert enc.fallback_reason == "could not export to openvino fp32: RuntimeError: converter says no"
        (record,) = [r for r in caplog.records if r.levelname == "WARNING" and "runs on torch" in r.getMessage()]
        assert "converter says no" in record.getMessage() and "backend='torch'" in record.getMessage()
    assert len(calls) == 1  # the failure is remembered next to the exports
    caplog.clear()
    assert Encoder.from_pretrained(cache_dir=tmp_path, streams=2).backend == "torch"  # streams is not dropped unsaid
    (record,) = [r for r in caplog.records if r.levelname == "WARNING" and "runs on torch" in r.getMessage()]
    assert "in one stream (streams=2 applies to OpenVINO only)" in record.getMessage()
    for named in ({"backend": "openvino"}, {"precision": "fp32"}):
        with pytest.raises(UnsupportedModelError, match="converter says no"):
            Encoder.from_pretrained(cache_dir=tmp_path, **named)
    monkeypatch.setenv("EMBEDRANK_BACKEND", "openvino")
    with pytest.raises(UnsupportedModelError, match="converter says no"):
        Encoder.from_pretrained(cache_dir=tmp_path)


@pytest.mark.slow
def test_openvino_streams_split_each_batch_and_give_the_same_vectors():
    """streams=2 compiles for throughput and runs a batch as two parts at once (each thread its own requests):
    the vectors and token states are those of one stream, for any batch size, from threads at once."""
    import threading

    one = Encoder.from_pretrained(backend="openvino", precision="fp32")
    two = Encoder.from_pretrained(backend="openvino", precision="fp32", streams=2)
    threads = int(two.runtime.compiled.get_property("INFERENCE_NUM_THREADS"))
    assert two.runtime.streams == min(2, threads) and one.runtime.streams == 1
    for batch_size in (1, 2, 3, 5):
        assert np.abs(two.encode(TEXTS, batch_size=batch_size) - one.encode(TEXTS, batch_size=batch_size)).max() < 1e-6
    features = one.tokenize(TEXTS).features
    states = two.forward(features, all_positions=True)
    assert states.shape == one.forward(features, all_positions=True).shape
    assert (states - one.forward(features, all_positions=True)).abs().max() < 1e-5

    want = one.encode(TEXTS, batch_size=4)
    got: list[np.ndarray] = []
    workers = [threading.Thread(target=lambda: got.append(two.encode(TEXTS, batch_size=4))) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(got) == 3 and all(np.abs(g - want).max() < 1e-6 for g in got)

    for options in ({"backend": "onnx"}, {"backend": "torch"}, {"backend": "openvino", "precision": "auto"}):
        with pytest.raises(InvalidInputError, match="applies to backend 'openvino' only") as refused:
            Encoder.from_pretrained(**options, streams=2)
        assert refused.value.param == "streams"
    for wrong in (0, 1.5, True):
        with pytest.raises(InvalidInputError, match="streams must be a whole number"):
            Encoder.from_pretrained(backend="openvino", streams=wrong)
