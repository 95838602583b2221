"""Tiny image-text models (CLIP, SigLIP, SigLIP2) built offline with seeded random weights, and drawn test
images with known captions.

Each model is its family's ``transformers`` config (text and vision towers of 2 layers, hidden 64, 32-pixel
images in 8-pixel patches) with weights drawn from a seeded generator, the family's own image processor
built from its defaults (no files to download) and a tokenizer of the family's kind trained on the packaged
model's vocabulary sentences: CLIP's byte-level BPE with end-of-word markers, SigLIP's T5-style Unigram,
SigLIP2's Gemma BPE. Saved as plain ``transformers`` folders, or in sentence-transformers' layout
(``st_layout``), they load like downloaded models; their outputs mean nothing, their shapes, special tokens,
preprocessing and pooling are the real models'. SigLIP2 is its NaFlex form (16-pixel patches, up to 256 a
image, each image at its own aspect ratio).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from embedrank.registry import DEFAULT_EMBEDDING_MODEL, quiet_loading, resolve_path
from embedrank.testing.architectures import ARCHITECTURES, HEADS, HIDDEN, INTERMEDIATE, LAYERS
from embedrank.testing.tiny import _trained_tokenizer, built_once, spread_weights
from embedrank.texts import vocabulary_texts

RECIPE = 1  # bumped when what is built changes, so cached tiny models are rebuilt
IMAGE_SIZE = 32
PATCH = 8


@dataclasses.dataclass(frozen=True)
class ImageTextArchitecture:
    """One family of public image-text models: its config, model, processor and image processor classes."""

    name: str
    config: str
    model: str
    processor: str
    image_processor: str
    examples: tuple[str, ...]  # public models of this family


IMAGE_TEXT_ARCHITECTURES: dict[str, ImageTextArchitecture] = {
    a.name: a
    for a in (
        ImageTextArchitecture(
            "clip",
            "CLIPConfig",
            "CLIPModel",
            "CLIPProcessor",
            "CLIPImageProcessorPil",
            (
                "openai/clip-vit-base-patch32",
                "sentence-transformers/clip-ViT-B-32",
                "laion/CLIP-ViT-B-32-laion2B-s34B-b79K",
            ),
        ),
        ImageTextArchitecture(
            "siglip",
            "SiglipConfig",
            "SiglipModel",
            "SiglipProcessor",
            "SiglipImageProcessorPil",
            ("google/siglip-base-patch16-224", "google/siglip-so400m-patch14-384"),
        ),
        ImageTextArchitecture(
            "siglip2",
            "Siglip2Config",
            "Siglip2Model",
            "Siglip2Processor",
            "Siglip2ImageProcessorPil",
            ("google/siglip2-base-patch16-naflex",),
        ),
    )
}


def _texts() -> list[str]:
    packaged, _ = resolve_path(DEFAULT_EMBEDDING_MODEL)
    lines = (Path(packaged) / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return vocabulary_texts({tok: i for i, tok in enumerate(lines)}, n=600)


def _clip_tokenizer() -> Any:
    """CLIP's tokenizer class over a byte-level BPE trained with CLIP's end-of-word marker."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<|startoftext|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        end_of_word_suffix="</w>",
    )
    tok.train_from_iterator([t.lower() for t in _texts()], trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return transformers.CLIPTokenizer(vocab=model["vocab"], merges=merges)  # type: ignore[arg-type]


def _tokenizer(arch: ImageTextArchitecture) -> Any:
    if arch.name == "clip":
        return _clip_tokenizer()
    # SigLIP's tokenizer is T5's sentencepiece kind (EOS appended, pad = EOS); SigLIP2's is Gemma's BPE
    tokenizer = _trained_tokenizer(ARCHITECTURES["t5" if arch.name == "siglip" else "gemma3"])
    if arch.name == "siglip":
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _config(arch: ImageTextArchitecture, tokenizer: Any) -> Any:
    import transformers

    towers = dict(
        hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS, num_attention_heads=HEADS
    )
    text: dict[str, Any] = dict(
        towers, vocab_size=len(tokenizer), max_position_embeddings=77 if arch.name == "clip" else 64
    )
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        text[name] = getattr(tokenizer, name, None)
    vision = dict(towers, patch_size=PATCH)
    if arch.name == "clip":
        return transformers.CLIPConfig(
            text_config=text, vision_config=dict(vision, image_size=IMAGE_SIZE), projection_dim=48
        )
    if arch.name == "siglip":
        return transformers.SiglipConfig(text_config=text, vision_config=dict(vision, image_size=IMAGE_SIZE))
    # Siglip2Processor passes its own patch size and patch count (16, 256) to the image processor
    return transformers.Siglip2Config(text_config=text, vision_config=dict(vision, patch_size=16, num_patches=256))


def _image_processor(arch: ImageTextArchitecture) -> Any:
    import transformers

    cls = getattr(transformers, arch.image_processor)
    if arch.name == "clip":
        return cls(size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    if arch.name == "siglip":
        return cls(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return cls(patch_size=16, max_num_patches=256)


def _build(arch: ImageTextArchitecture, out: Path, seed: int, st_layout: bool) -> None:
    import torch
    import transformers

    tokenizer = _tokenizer(arch)
    config = _config(arch, tokenizer)
    tokenizer.model_max_length = config.text_config.max_position_embeddings
    torch.manual_seed(seed)
    with quiet_loading():
        model = getattr(transformers, arch.model)(config).eval()
        spread_weights(model, seed)
        processor = getattr(transformers, arch.processor)(image_processor=_image_processor(arch), tokenizer=tokenizer)
        if not st_layout:
            model.save_pretrained(out)
            processor.save_pretrained(out)
            return
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.base.modules import Transformer

        model.save_pretrained(out / "transformer")
        processor.save_pretrained(out / "transformer")
        SentenceTransformer(modules=[Transformer(str(out / "transformer"))]).save(str(out))
        # ST's Transformer module saves the transformers folder at the root: the copy is not needed
        import shutil

        shutil.rmtree(out / "transformer")


def tiny_image_text(architecture: str, out: str | Path | None = None, *, seed: int = 0, st_layout: bool = False) -> str:
    """A tiny seeded image-text model of ``architecture`` (a key of :data:`IMAGE_TEXT_ARCHITECTURES`) saved to
    ``out`` (as sentence-transformers saves it with ``st_layout``); returns its path. Without ``out`` it is
    built once into the cache."""
    if architecture not in IMAGE_TEXT_ARCHITECTURES:
        raise KeyError(f"unknown architecture {architecture!r}; choose one of {sorted(IMAGE_TEXT_ARCHITECTURES)}")
    arch = IMAGE_TEXT_ARCHITECTURES[architecture]
    facts = f"{RECIPE}:{seed}:{st_layout}"
    return built_once(out, f"tiny-{architecture}", facts, lambda tmp: _build(arch, tmp, seed, st_layout))


# drawn images with the captions that describe them: (caption, shape, colour)
DRAWN = (
    ("a red square", "square", (220, 30, 30)),
    ("a blue circle", "circle", (30, 60, 220)),
    ("a green triangle", "triangle", (30, 180, 60)),
    ("a yellow square", "square", (230, 210, 40)),
    ("a black circle", "circle", (10, 10, 10)),
    ("a purple triangle", "triangle", (140, 40, 170)),
)


def drawn_image(shape: str, colour: tuple[int, int, int], *, size: tuple[int, int] = (96, 64), seed: int = 0) -> Any:
    """A PIL image of one ``shape`` (square, circle, triangle) in ``colour`` on a lightly noisy white ground."""
    import numpy as np
    from PIL import Image, ImageDraw

    width, height = size
    noise = np.random.default_rng(seed).integers(225, 256, size=(height, width, 3), dtype=np.uint8)
    image = Image.fromarray(noise, "RGB")
    draw = ImageDraw.Draw(image)
    box = (width * 0.2, height * 0.2, width * 0.8, height * 0.8)
    if shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "circle":
        draw.ellipse(box, fill=colour)
    else:
        draw.polygon(
            [(width * 0.5, height * 0.15), (width * 0.85, height * 0.85), (width * 0.15, height * 0.85)], fill=colour
        )
    return image
