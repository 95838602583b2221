"""Image-text models (CLIP, SigLIP, SigLIP2) against sentence-transformers, and images read safely."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from embedrank import Encoder, ImageTextEncoder
from embedrank.errors import InvalidInputError, ModelKindError, RequestTooLargeError, UnsupportedMediaError
from embedrank.models.images import ImageLimits, data_url_bytes, read_image
from embedrank.registry import resolve
from embedrank.testing.hostile_files import png_claiming
from embedrank.testing.tiny_images import DRAWN, IMAGE_TEXT_ARCHITECTURES, drawn_image, tiny_image_text

TEXTS = [caption for caption, _, _ in DRAWN] + ["a much longer caption about one shape drawn on a noisy white ground"]


def images() -> list[Image.Image]:
    """The drawn images, each of another size and aspect ratio (so resizing and cropping matter)."""
    return [
        drawn_image(shape, colour, seed=i, size=(96 - 10 * i, 64 + 7 * i)) for i, (_, shape, colour) in enumerate(DRAWN)
    ]


def png_bytes(image: Image.Image, **save: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=str(save.pop("format", "PNG")), **save)
    return out.getvalue()


def reference(path: str, model: ImageTextEncoder):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(path, device="cpu")
    if model.padded_to_window:  # SigLIP's texts padded to the window, as the model card and HF's pipeline do
        st[0].processing_kwargs = {"text": {"padding": "max_length", "max_length": model.max_seq_length}}
    return st


@pytest.mark.parametrize("st_layout", [False, True], ids=["transformers", "sentence-transformers"])
@pytest.mark.parametrize("architecture", sorted(IMAGE_TEXT_ARCHITECTURES))
def test_parity_with_sentence_transformers(architecture: str, st_layout: bool, tmp_path) -> None:
    path = tiny_image_text(architecture, tmp_path / "model", st_layout=st_layout)
    model = ImageTextEncoder.from_pretrained(path)
    st = reference(path, model)
    assert resolve(path).kind == "image-text" and model.dimension == st.get_sentence_embedding_dimension()
    texts, ours_texts = st.encode(TEXTS), model.encode(TEXTS, batch_size=3)
    pictures, ours_pictures = st.encode(images()), model.encode_images(images(), batch_size=4)
    assert np.abs(ours_texts - texts).max() <= 1e-5
    assert np.abs(ours_pictures - pictures).max() <= 1e-5
    # the two towers give different vectors: nothing above compared zeros
    assert np.abs(ours_texts).max() > 0.1 and np.abs(ours_pictures[0] - ours_pictures[1]).max() > 0.01


@pytest.mark.parametrize("architecture", sorted(IMAGE_TEXT_ARCHITECTURES))
def test_preprocessing_is_the_model_processor_and_zero_shot_its_logits(architecture: str) -> None:
    import transformers

    path = tiny_image_text(architecture)
    model = ImageTextEncoder.from_pretrained(path)
    processor = transformers.AutoProcessor.from_pretrained(path)
    want = processor(images=images(), return_tensors="pt")
    rows = model.image_rows(images())
    for name, batch in want.items():
        assert torch.equal(torch.stack([r.pixels[name] for r in rows]), batch), name
    labels = TEXTS[:3]
    inputs = processor(
        text=labels,
        images=images()[:2],
        return_tensors="pt",
        padding="max_length" if model.padded_to_window else True,
        max_length=model.max_seq_length,
        truncation=True,
    )
    with torch.inference_mode():
        own = model.module(**inputs).logits_per_image.numpy()
    assert np.abs(model.logits(images()[:2], labels) - own).max() <= 1e-4
    probabilities = model.zero_shot(images()[:2], labels)
    if architecture == "clip":  # a softmax over the labels; SigLIP's sigmoid scores each pair on its own
        assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    else:
        assert np.allclose(probabilities, 1 / (1 + np.exp(-own)), atol=1e-5)


@pytest.mark.parametrize("architecture", ["clip", "siglip"])
def test_a_vector_does_not_depend_on_its_batch(architecture: str) -> None:
    model = ImageTextEncoder.from_pretrained(tiny_image_text(architecture))
    together = model.encode(TEXTS)
    alone = np.stack([model.encode(text) for text in TEXTS])
    assert np.abs(together - alone).max() <= 1e-5
    mixed = model.embed_rows([*model.image_rows(images()[:1]), *model.tokenize_rows(TEXTS[:1])]).values
    assert np.abs(mixed[0] - model.encode_images(images()[:1])[0]).max() <= 1e-5
    assert np.abs(mixed[1] - model.encode(TEXTS[:1])[0]).max() <= 1e-5


def test_every_image_source_gives_one_vector(tmp_path) -> None:
    model = ImageTextEncoder.from_pretrained(tiny_image_text("clip"))
    picture = images()[0]
    data = png_bytes(picture)
    (tmp_path / "a.png").write_bytes(data)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    vectors = model.encode_images([picture, data, url, tmp_path / "a.png", str(tmp_path / "a.png")])
    assert np.abs(vectors - vectors[0]).max() <= 1e-6


def test_other_kinds_and_runtimes_are_refused() -> None:
    path = tiny_image_text("clip")
    with pytest.raises(ModelKindError, match="ImageTextEncoder"):
        Encoder.from_pretrained(path)
    with pytest.raises(ModelKindError, match="not an image-text model"):
        ImageTextEncoder.from_pretrained("all-MiniLM-L6-v2")
    with pytest.raises(InvalidInputError, match="run in fp32 on torch, openvino, onnx, or bf16"):
        ImageTextEncoder.from_pretrained(path, precision="int8")
    with pytest.raises(InvalidInputError, match="bf16 on torch and openvino"):
        ImageTextEncoder.from_pretrained(path, backend="onnx", precision="bf16")


def test_the_default_backend_exports_or_falls_back_to_torch_saying_why() -> None:
    from embedrank.runtime.exports import ExportError

    clip = ImageTextEncoder.from_pretrained(tiny_image_text("clip"))
    assert (clip.backend, clip.precision, clip.fallback_reason) == ("openvino", "fp32", None)
    siglip2 = ImageTextEncoder.from_pretrained(tiny_image_text("siglip2"))
    assert siglip2.backend == "torch" and "the image tower differs from torch" in siglip2.fallback_reason
    with pytest.raises(ExportError, match="could not export"):
        ImageTextEncoder.from_pretrained(tiny_image_text("siglip2"), backend="openvino")


@pytest.mark.parametrize("backend", ["torch", "openvino"])
def test_bf16_stays_close_to_fp32(backend: str) -> None:
    path = tiny_image_text("siglip")
    exact = ImageTextEncoder.from_pretrained(path, backend="torch")
    half = ImageTextEncoder.from_pretrained(path, backend=backend, precision="bf16")
    assert half.precision == "bf16" and half.runtime.inference_precision in ("bf16", "f32")  # f32: no bf16 on this CPU
    for ours, theirs in (
        (half.encode(TEXTS), exact.encode(TEXTS)),
        (half.encode_images(images()), exact.encode_images(images())),
    ):
        cosines = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
        assert cosines.min() >= 0.99, cosines


# -- hostile images --------------------------------------------------------------------------------
def test_a_decompression_bomb_is_refused_before_any_pixel_is_decoded(pillow_decoders) -> None:
    bomb = png_claiming(100_000, 100_000)
    assert 40_000 < len(bomb) < 60_000
    opened = pillow_decoders
    with pytest.raises(RequestTooLargeError, match="10,000,000,000 pixels") as refused:
        read_image(bomb, param="images[0]")
    assert opened == []  # refused from the header: not one row decompressed
    read_image(png_claiming(20, 10, payload=10))
    assert opened == ["zip"]  # the spy sees a real decode
    assert refused.value.limit == "max_image_pixels" and refused.value.param == "images[0]"
    with pytest.raises(RequestTooLargeError, match="10,000 x 10,000 pixels"):  # under Pillow's own ceiling
        read_image(png_claiming(10_000, 10_000))


def test_limits_formats_and_broken_files() -> None:
    picture = images()[0]
    with pytest.raises(RequestTooLargeError, match="over the limit of 100 bytes"):
        read_image(png_bytes(picture), ImageLimits(max_bytes=100))
    big = "data:image/png;base64," + "A" * 1000
    with pytest.raises(RequestTooLargeError):  # judged by its length, before any decoding
        data_url_bytes(big, ImageLimits(max_bytes=100))
    with pytest.raises(UnsupportedMediaError, match="accepted format"):
        read_image(png_bytes(picture, format="BMP"))
    with pytest.raises(InvalidInputError, match="truncated or corrupt GIF"):  # the magic bytes, then nothing
        read_image(b"GIF89a not really a gif at all")
    with pytest.raises(UnsupportedMediaError, match="accepted format"):
        read_image(b"%PDF-1.7 a document")
    with pytest.raises(UnsupportedMediaError, match="accepted format"):
        read_image(png_bytes(picture), ImageLimits(formats=("JPEG",)))
    with pytest.raises(UnsupportedMediaError, match="'text/plain'"):
        read_image("data:text/plain;base64,aGVsbG8=")
    with pytest.raises(InvalidInputError, match="could not be"):
        read_image(png_bytes(picture)[:200])  # truncated
    with pytest.raises(InvalidInputError, match="not valid base64"):
        read_image("data:image/png;base64,@@@@")
    with pytest.raises(InvalidInputError, match="remote URL"):
        read_image("http://127.0.0.1/cat.png")
    with pytest.raises(InvalidInputError, match="no image file"):
        read_image("/nonexistent/cat.png")
    with pytest.raises(InvalidInputError, match="not decoded"):
        ImageLimits(formats=("TIFF",))


def test_first_frame_and_exif_orientation() -> None:
    red, blue = Image.new("RGB", (8, 4), (255, 0, 0)), Image.new("RGB", (8, 4), (0, 0, 255))
    gif = io.BytesIO()
    red.save(gif, format="GIF", save_all=True, append_images=[blue], duration=100, loop=0)
    first = read_image(gif.getvalue())
    assert first.getpixel((0, 0))[0] > 200 and first.mode == "RGB"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: a viewer shows it 4 x 8
    rotated = read_image(png_bytes(Image.new("RGB", (8, 4), (0, 255, 0)), format="JPEG", exif=exif))
    assert rotated.size == (4, 8)


def test_broken_images_of_every_format_are_refused_never_crash() -> None:
    """The decoder path fuzzed: each accepted format (a palette PNG and an animated GIF among them) cut at
    random points, bytes flipped, headers rewritten; every outcome is an image or one of the refusals the
    service maps to 4xx."""
    rng = np.random.default_rng(7)
    picture = drawn_image("triangle", (140, 40, 170), size=(40, 30))
    palette = picture.convert("P", palette=Image.Palette.ADAPTIVE, colors=256)
    animated = io.BytesIO()
    picture.save(animated, format="GIF", save_all=True, append_images=[palette], duration=50)
    originals = [
        png_bytes(picture),
        png_bytes(palette),
        png_bytes(picture, format="JPEG", quality=80),
        png_bytes(picture, format="WEBP"),
        animated.getvalue(),
    ]
    outcomes: dict[str, int] = {}
    for data in originals:
        for case in range(120):
            broken = bytearray(data)
            if case % 3 == 0:
                broken = broken[: int(rng.integers(1, len(broken)))]
            else:
                for at in rng.integers(0, len(broken), size=int(rng.integers(1, 12))):
                    broken[at] = int(rng.integers(0, 256))
            try:
                read_image(bytes(broken), ImageLimits(max_pixels=1_000_000))
                name = "read"
            except (InvalidInputError, UnsupportedMediaError, RequestTooLargeError) as refused:
                name = type(refused).__name__
            outcomes[name] = outcomes.get(name, 0) + 1
    assert sum(outcomes.values()) == 600 and outcomes.get("InvalidInputError", 0) > 50, outcomes


def test_the_recorded_parity_table_holds_now(capsys) -> None:
    """``eval/quality/image_parity.py`` (the table on the supported-models page) runs, every cell holds, and each
    cell's verdict is the recorded one: the page says what is true of this checkout."""
    import json
    import logging
    import re
    from pathlib import Path

    from eval.quality import image_parity

    root = Path(__file__).resolve().parents[2]

    levels = {name: logging.getLogger(name).level for name in ("embedrank", "transformers")}
    try:
        assert image_parity.run([]) == 0
    finally:  # the script quiets these loggers for its table; the other tests of this worker need them
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    measured = capsys.readouterr().out
    recorded = json.loads((root / "eval" / "results" / "image-parity.json").read_text())["output"]

    def verdicts(output: str) -> list[list[str]]:
        rows = [line.split("|")[1:-1] for line in output.splitlines() if line.startswith("| ") and "---" not in line]
        return [[re.sub(r" \(.*", "", cell.strip()) for cell in row] for row in rows]

    assert verdicts(measured) == verdicts(recorded)
    assert (root / "docs" / "models.md").read_text().count("| clip |") == 2


def drawn_collection(root, *, image_queries: bool):
    """A BEIR-layout collection of the drawn shapes: images as documents and captions as queries, or captions
    as documents and images as queries; each caption relevant to its own drawing."""
    import json

    (root / "images").mkdir(parents=True)
    (root / "qrels").mkdir()
    documents, queries = [], []
    for i, (caption, shape, colour) in enumerate(DRAWN):
        drawn_image(shape, colour, seed=i).save(root / "images" / f"{i}.png")
        picture, words = {"image": f"images/{i}.png"}, {"text": caption}
        documents.append({"_id": f"d{i}", **(words if image_queries else picture)})
        queries.append({"_id": f"q{i}", **(picture if image_queries else words)})
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in documents))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(DRAWN)))
    )
    return root


@pytest.mark.parametrize("image_queries", [False, True], ids=["text-to-image", "image-to-text"])
def test_the_harness_retrieves_across_modalities(tmp_path, image_queries: bool) -> None:
    from embedrank import BenchmarkConfig, load_beir, run_benchmark

    path = tiny_image_text("clip")
    root = drawn_collection(tmp_path / "shapes", image_queries=image_queries)
    ds = load_beir(root)
    assert len(ds.query_images if image_queries else ds.images) == len(DRAWN)
    result = run_benchmark(ds, BenchmarkConfig(model=path, retriever="dense", k_retrieve=3))
    model = ImageTextEncoder.from_pretrained(path)
    pictures = [Image.open(root / "images" / f"{i}.png") for i in range(len(DRAWN))]
    captions = [caption for caption, _, _ in DRAWN]
    queries, documents = (pictures, captions) if image_queries else (captions, pictures)
    embed = [model.encode_images, model.encode]
    q = embed[0 if image_queries else 1](queries, normalize=True)
    d = embed[1 if image_queries else 0](documents, normalize=True)
    for i, ranked in enumerate(np.argsort(-(q @ d.T), axis=1, kind="stable")[:, :3]):
        assert list(result.run[f"q{i}"]) == [f"d{j}" for j in ranked]  # the brute-force cosine ranking
    assert 0 < result.metrics["ndcg@10"] <= 1 and any("image-text" in n for n in result.notes)
    with pytest.raises(InvalidInputError, match="has images"):
        run_benchmark(ds, BenchmarkConfig(model=path, retriever="bm25"))


def test_auto_precision_takes_bf16_only_where_the_cpu_computes_it_and_it_stays_close() -> None:
    path = tiny_image_text("clip")
    auto = ImageTextEncoder.from_pretrained(path, backend="openvino", precision="auto")
    choice = auto.auto_choice
    assert (
        choice is not None
        and choice.precision == auto.precision
        and choice.summary.startswith(f"openvino {auto.precision}")
    )
    if auto.precision == "bf16":
        assert auto.runtime.inference_precision == "bf16" and "lowest cosine to fp32" in choice.summary
    else:
        assert "no native bf16" in choice.summary or "under 0.999" in choice.summary
    assert ImageTextEncoder.from_pretrained(path, backend="torch", precision="auto").precision == "fp32"
