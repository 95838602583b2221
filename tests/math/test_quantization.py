"""Compact vectors (int8/uint8/binary/ubinary with
sentence-transformers' semantics) and chunked embeddings, in the core and through the service."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from litestar.testing import TestClient
from sentence_transformers.util import quantize_embeddings

from embedrank import Encoder, InvalidInputError
from embedrank.math.chunks import mean_window_vectors
from embedrank.math.quantization import dequantize, quantization_ranges, quantize, unpack_signs
from embedrank.math.similarity import truncate_dims
from embedrank.models.chunking import Chunking
from embedrank.testing.fake import FakeEncoder
from service.app import create_app
from service.settings import Auth, Engine, Models, Settings

KEY = "k"
FAKE = FakeEncoder("fake", dimension=20, max_seq_length=8)  # 20 dims: binary codes pad to 3 bytes


# -- math: against sentence-transformers ------------------------------------------------------------------
@pytest.mark.parametrize("embedding_type", ["float32", "int8", "uint8", "binary", "ubinary"])
@pytest.mark.parametrize("dim", [384, 20])
def test_quantize_equals_sentence_transformers(embedding_type, dim):
    rng = np.random.default_rng(dim)
    calibration = rng.normal(size=(500, dim)).astype(np.float32)
    x = rng.normal(scale=1.3, size=(64, dim)).astype(np.float32)  # some values outside the calibration range
    ranges = quantization_ranges(calibration)
    ours = quantize(x, embedding_type, ranges)
    theirs = quantize_embeddings(x, precision=embedding_type, calibration_embeddings=calibration)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)


def test_dequantize_is_within_one_bucket_and_signs_rank_like_sentence_transformers():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 16)).astype(np.float32)
    ranges = quantization_ranges(x)
    step = (ranges[1] - ranges[0]) / 255
    back = dequantize(quantize(x, "int8", ranges), "int8", ranges)
    assert ((x - back) >= -1e-6).all() and ((x - back) <= step + 1e-6).all()
    codes = quantize(x, "ubinary")
    query = rng.normal(size=16).astype(np.float32)
    zero_one = np.unpackbits(codes, axis=-1)[:, :16].astype(np.float32)  # sentence-transformers' rescoring
    assert np.argsort(-(unpack_signs(codes, 16) @ query)).tolist() == np.argsort(-(zero_one @ query)).tolist()


def test_quantize_refuses_unknown_embedding_types_and_missing_ranges():
    with pytest.raises(ValueError, match="embedding type must be one of"):
        quantize(np.zeros((1, 4)), "int4")
    with pytest.raises(ValueError, match="calibration ranges"):
        quantize(np.zeros((1, 4)), "int8")


def test_mean_window_vectors_matches_a_loop():
    rng = np.random.default_rng(1)
    vectors, owners, weights = rng.normal(size=(7, 5)), np.array([0, 0, 1, 2, 2, 2, 3]), rng.integers(1, 9, size=7)
    expected = [np.average(vectors[owners == d], axis=0, weights=weights[owners == d]) for d in range(4)]
    np.testing.assert_allclose(mean_window_vectors(vectors, owners, 4, weights), expected, rtol=1e-6)


# -- the core, on the fake encoder (fast) and the packaged model (slow) ------------------------------------
def test_fake_calibration_ranges_are_fixed_and_cover_its_vectors():
    first = FAKE.quantization_ranges()
    np.testing.assert_array_equal(first, FakeEncoder("other", dimension=20, max_seq_length=8).quantization_ranges())
    assert first.shape == (2, 20) and (first[0] < first[1]).all()
    assert FAKE.quantization_ranges(8).shape == (2, 8)


def test_range_samples_are_stored_and_read_back_and_a_bad_or_stale_file_is_computed_again(tmp_path, monkeypatch):
    import os
    import shutil
    from pathlib import Path

    from embedrank.testing.tiny import tiny_model

    monkeypatch.setenv("EMBEDRANK_CACHE", str(tmp_path / "cache"))
    model = shutil.copytree(tiny_model("bert"), tmp_path / "model")
    calls = []

    def encoder() -> Encoder:
        enc = Encoder.from_pretrained(str(model), backend="torch")
        embed = enc.embed_for_ranges
        monkeypatch.setattr(enc, "embed_for_ranges", lambda texts, **kw: calls.append(len(texts)) or embed(texts, **kw))
        return enc

    first = encoder()
    ranges = first.quantization_ranges()  # from the packaged sample's 800 texts
    stored = first.range_sample.stored_path(f"{first.ranges_depend_on()}|normalize=True")
    assert calls == [800] and first.range_sample.read_from is None and stored.is_file()
    monkeypatch.setattr(first, "ranges_depend_on", lambda: pytest.fail("keyed again after the first embedding"))
    np.testing.assert_array_equal(first.quantization_ranges(), ranges)  # a request's ranges: no key, no file
    assert list(stored.parent.iterdir()) == [stored]  # no temporary file left beside it

    again = encoder()  # a new process would do the same: the file, not the computation
    np.testing.assert_array_equal(again.quantization_ranges(), ranges)
    np.testing.assert_array_equal(again.quantization_ranges(8), first.quantization_ranges(8))
    assert calls == [800] and again.range_sample.read_from == stored

    stored.write_bytes(stored.read_bytes()[:1000])  # cut short (a disk that filled up)
    cut = encoder()
    np.testing.assert_array_equal(cut.quantization_ranges(), ranges)
    assert calls == [800, 800] and cut.range_sample.read_from is None
    np.save(stored, np.zeros((799, 32), dtype=np.float32))  # another sample's shape
    np.testing.assert_array_equal(encoder().quantization_ranges(), ranges)
    assert calls == [800, 800, 800]
    np.save(stored, np.full((800, 32), np.nan, dtype=np.float32))  # not finite
    np.testing.assert_array_equal(encoder().quantization_ranges(), ranges)
    assert len(calls) == 4

    unnormalized = encoder()
    unnormalized.quantization_ranges(normalize=False)  # another key: computed, stored beside the first
    assert len(calls) == 5 and len(list(stored.parent.iterdir())) == 2
    sample = encoder()
    sample.fit_ranges(["a text of the user's corpus", "another one of them"])
    sample.quantization_ranges()  # the user's sample: its own key
    assert calls[-1] == 2
    weights = next(Path(model).glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # saved again
    retrained = encoder()
    retrained.quantization_ranges()
    assert calls[-1] == 800 and retrained.range_sample.read_from is None

    monkeypatch.setenv("EMBEDRANK_CACHE", "/proc/no-such-cache")  # a store that cannot be written: still served
    np.testing.assert_array_equal(encoder().quantization_ranges(), ranges)


@pytest.mark.slow
def test_encoder_embedding_types_equal_sentence_transformers_with_the_same_calibration(st_model):
    encoder = Encoder.from_pretrained()  # its own copy: fit_ranges() changes it
    texts = ["the tilt of the earth causes seasons", "bananas are rich in potassium", "a third, shorter text"]
    calibration = encoder.encode(encoder.range_sample.texts[:200])  # sentence-transformers' calibration_embeddings
    encoder.fit_ranges(encoder.range_sample.texts[:200])
    for embedding_type in ("int8", "uint8", "binary", "ubinary"):
        ours = encoder.encode(texts, embedding_type=embedding_type)
        floats = st_model.encode(texts, normalize_embeddings=True)
        theirs = quantize_embeddings(floats, precision=embedding_type, calibration_embeddings=calibration)
        # float noise may move a value across a bucket edge: allow one bucket, on few components
        diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
        assert diff.max() <= (1 if embedding_type in ("int8", "uint8") else 0), embedding_type
    # the former keyword still works for one release, with a deprecation warning
    with pytest.warns(DeprecationWarning, match="embedding_type"):
        old = encoder.encode(texts, precision="ubinary")
    assert np.array_equal(old, encoder.encode(texts, embedding_type="ubinary"))
    with pytest.raises(InvalidInputError, match="embedding type must be one of") as info:
        encoder.encode(texts, embedding_type="int4")
    assert info.value.param == "embedding_type"
    with pytest.warns(DeprecationWarning, match="fit_ranges"):
        encoder.calibrate(encoder.range_sample.texts[:100])
    assert len(encoder.range_sample.texts) == 100


@pytest.mark.slow
def test_chunked_encode_is_the_token_weighted_mean_of_the_windows(encoder):
    sentence = "The relevant fact is that tilted axes cause seasons on planets. "
    long_text = sentence * 40  # ~ 500 tokens, two or three windows at 256
    chunking = Chunking(overlap=16)
    out = encoder.encode_with_stats([long_text, "short text"], chunking=chunking)
    assert out.chunked == 1 and out.truncated == [False, False]
    window = encoder.chunk_window("")
    from embedrank.models.chunking import split_windows

    windows = split_windows([long_text], encoder.token_offsets, window=window, chunking=chunking)
    parts = encoder.encode_with_stats(windows.texts)
    expected = np.average(parts.embeddings, axis=0, weights=parts.token_counts)
    expected /= np.linalg.norm(expected)
    np.testing.assert_allclose(out.embeddings[0], expected, atol=1e-5)
    np.testing.assert_allclose(out.embeddings[1], encoder.encode(["short text"])[0], atol=1e-6)
    assert out.token_counts[0] == sum(parts.token_counts)
    assert len(windows.texts) > 1


# -- the service -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(fake_service):
    with fake_service({"fake": FAKE}, key=KEY) as c:
        yield c


TEXTS = ["red apples and green pears", "the tilt of the earth", "bananas"]


def test_embedding_types_return_each_type_with_the_models_calibration(client):
    resp = client.post(
        "/v1/embeddings", json={"model": "fake", "input": TEXTS, "embedding_types": ["int8", "ubinary", "float"]}
    )
    assert resp.status_code == 200, resp.text
    floats = FAKE.encode(TEXTS)
    ranges = FAKE.quantization_ranges()
    for i, item in enumerate(resp.json()["data"]):
        np.testing.assert_allclose(item["embedding"], floats[i], atol=1e-6)  # SPEC: embedding stays float
        assert set(item["embeddings"]) == {"int8", "ubinary", "float"}
        assert item["embeddings"]["int8"] == quantize(floats[i : i + 1], "int8", ranges)[0].tolist()
        assert item["embeddings"]["ubinary"] == quantize(floats[i : i + 1], "ubinary")[0].tolist()
        assert len(item["embeddings"]["ubinary"]) == 3  # 20 bits -> 3 bytes


def test_embedding_types_with_base64_and_dimensions(client):
    body = {
        "model": "fake",
        "input": TEXTS,
        "embedding_types": ["int8", "binary", "uint8"],
        "encoding_format": "base64",
        "dimensions": 8,
    }
    resp = client.post("/v1/embeddings", json=body)
    assert resp.status_code == 200, resp.text
    floats = truncate_dims(FAKE.encode(TEXTS), 8)
    ranges = FAKE.quantization_ranges(8)
    item = resp.json()["data"][1]
    raw = np.frombuffer(base64.b64decode(item["embeddings"]["int8"]), dtype=np.int8)
    np.testing.assert_array_equal(raw, quantize(floats[1:2], "int8", ranges)[0])
    assert np.frombuffer(base64.b64decode(item["embeddings"]["binary"]), dtype=np.int8).shape == (1,)
    assert np.frombuffer(base64.b64decode(item["embeddings"]["uint8"]), dtype=np.uint8).shape == (8,)
    np.testing.assert_allclose(np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4"), floats[1], atol=1e-6)


def test_without_embedding_types_the_response_is_unchanged(client):
    item = client.post("/v1/embeddings", json={"model": "fake", "input": "x"}).json()["data"][0]
    assert set(item) == {"object", "index", "embedding"}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"embedding_types": ["int4"]}, "embedding_types"),
        ({"embedding_types": []}, "embedding_types"),
        ({"embedding_types": "int8"}, "embedding_types"),
        ({"chunking": "yes"}, "chunking"),
        ({"chunk_overlap": -1}, "chunk_overlap"),
    ],
)
def test_bad_compact_and_chunking_fields_are_400_naming_the_field(client, fields, param):
    resp = client.post("/v1/embeddings", json={"model": "fake", "input": "x", **fields})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_chunking_embeds_long_inputs_as_the_mean_of_their_windows(client):
    long_text = " ".join(f"word{i}" for i in range(20))  # 20 tokens; the fake's window is 6
    body = {"model": "fake", "input": [long_text, "short one"], "chunking": True, "chunk_overlap": 2}
    resp = client.post("/v1/embeddings", json=body)
    assert resp.status_code == 200, resp.text
    out = FAKE_core_chunked([long_text, "short one"], overlap=2)
    got = np.array([d["embedding"] for d in resp.json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, out.values, atol=1e-6)
    assert resp.json()["usage"]["chunked_inputs"] == 1
    assert resp.json()["usage"]["total_tokens"] == sum(out.token_counts)
    assert resp.headers.get("X-Truncated-Inputs") in (None, "0")
    plain = client.post("/v1/embeddings", json={"model": "fake", "input": long_text})
    assert plain.headers["X-Truncated-Inputs"] == "1" and "chunked_inputs" not in plain.json()["usage"]


def FAKE_core_chunked(texts, *, overlap):
    from embedrank.models.chunking import pool_windows, split_windows

    windows = split_windows(texts, FAKE.token_offsets, window=FAKE.chunk_window(""), chunking=Chunking(overlap=overlap))
    return pool_windows(FAKE.encode_batch(windows.texts), windows, normalize=True)


def test_a_model_entry_names_its_ranges_file_and_calibration_only_calibrates_int8(tmp_path, monkeypatch):
    import embedrank.serving.pool
    from service.settings import ModelEntry, SettingsError

    texts = tmp_path / "ranges.txt"
    texts.write_text("apples and pears\nthe tilt of the earth\nbananas are yellow\nseasons change\n")
    reference = FakeEncoder("ranged")
    reference.fit_ranges(str(texts))
    expected = quantize(reference.encode(TEXTS), "uint8", reference.quantization_ranges())
    assert (
        expected.tolist() != quantize(reference.encode(TEXTS), "uint8", FakeEncoder("d").quantization_ranges()).tolist()
    )
    # ``ranges`` sets them; the former use of ``calibration`` on a model that is not int8 still does, with a warning
    for entry in (
        ModelEntry(id="ranged", path="fake:encoder", ranges=str(texts)),
        ModelEntry(id="ranged", path="fake:encoder", calibration=str(texts)),
    ):
        warned: list[str] = []
        monkeypatch.setattr(
            embedrank.serving.pool.logger, "warning", lambda msg, *args, out=warned: out.append(msg % args)
        )
        settings = Settings(
            auth=Auth(api_keys=(KEY,)), models=Models(entries=(entry,)), engine=Engine(tune_malloc=False)
        )
        with TestClient(create_app(settings, wait_for_models=True)) as c:
            body = {"model": "ranged", "input": TEXTS, "embedding_types": ["uint8"]}
            resp = c.post("/v1/embeddings", json=body, headers={"Authorization": f"Bearer {KEY}"})
        assert resp.status_code == 200, resp.text
        assert [d["embeddings"]["uint8"] for d in resp.json()["data"]] == expected.tolist()
        assert any("name that file 'ranges'" in w for w in warned) == (entry.calibration is not None)
    for bad, field in (
        (ModelEntry(id="x", path="fake:encoder", ranges=str(tmp_path / "missing.txt")), "ranges"),
        (ModelEntry(id="y", path="fake:cross-encoder", ranges=str(texts)), "ranges"),
        (ModelEntry(id="z", path="fake:cross-encoder", calibration=str(texts)), "calibration"),
    ):
        with pytest.raises(SettingsError, match=f"{field} .* must be an existing"):
            create_app(
                Settings(auth=Auth(api_keys=(KEY,)), models=Models(entries=(bad,)), engine=Engine(tune_malloc=False))
            )
