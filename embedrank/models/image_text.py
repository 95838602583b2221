"""Image-text encoders (CLIP, SigLIP, SigLIP2): texts through the text tower and images through the vision
tower into one space, as sentence-transformers embeds them, with zero-shot text-image scoring.

Texts are tokenized with the model's tokenizer (SigLIP and SigLIP2 padded to their window, as they were
trained, so a text's vector does not depend on the texts batched with it); images are read safely
(:mod:`embedrank.models.images`) and preprocessed by the model's own processor, so resizing, cropping and
normalization are the model's, pixel for pixel. The projections the towers end with are the model's own
(``get_text_features``, ``get_image_features``); vectors are normalized when the model's sentence-transformers
layout says so (``Normalize``), as the reference does.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedrank.errors import InvalidInputError, ModelKindError
from embedrank.math.similarity import finish_vectors, l2_normalize
from embedrank.models.batching import run_by_length
from embedrank.models.checks import check_max_seq_length, check_texts
from embedrank.models.images import DEFAULT_IMAGE_LIMITS, ImageLimits, read_image
from embedrank.models.tokens import TextTokens, Tokenized, TokenizesText, TokenRow, TokenSpan
from embedrank.registry import ModelSpec, quiet_loading, resolve
from embedrank.runtime.backends import BACKEND_ENV, ElsewhereRuntime, RuntimeFacts
from embedrank.runtime.exports import ExportError, is_weightless
from embedrank.runtime.towers import ExportedTowers, TorchTowers, choose_precision, exported_towers
from embedrank.texts import vocabulary_texts
from embedrank.types import ModelOutput

# model types whose text tower was trained on texts padded to its window (and pools the last position)
_PADDED_TO_WINDOW = ("siglip", "siglip2")
log = logging.getLogger("embedrank.exports")
TEXT_FEATURES = ("input_ids", "attention_mask")  # what the text tower is given
BACKENDS = ("torch", "openvino", "onnx")
PRECISIONS = ("fp32", "bf16")
# the logits of a text against an image: CLIP's softmax over the texts, SigLIP's sigmoid of each pair
SOFTMAX, SIGMOID = "softmax", "sigmoid"


@dataclasses.dataclass(frozen=True, slots=True)
class ImageRow:
    """One image preprocessed by the model's processor, unbatched: ``pixels`` holds each processor output
    without its batch dimension (``pixel_values`` ``(C, H, W)``, or SigLIP2's ``(P, C·p·p)`` patches with
    their mask and grid); ``length`` is the vision tokens it costs (what the serving engine budgets)."""

    pixels: dict[str, torch.Tensor]
    length: int
    truncated: bool = False


Row = TokenRow | ImageRow


class ImageTextEncoder(TokenizesText, RuntimeFacts):
    """CLIP, SigLIP and SigLIP2: :meth:`encode` embeds texts, :meth:`encode_images` images, into one space;
    :meth:`zero_shot` scores images against texts as the model was trained to. Use :meth:`from_pretrained`.

    >>> from embedrank.testing.tiny_images import tiny_image_text, drawn_image
    >>> model = ImageTextEncoder.from_pretrained(tiny_image_text("clip"))
    >>> model.encode(["a red square"]).shape, model.encode_images([drawn_image("square", (220, 30, 30))]).shape
    ((1, 48), (1, 48))
    """

    def __init__(
        self,
        spec: ModelSpec,
        model: torch.nn.Module,
        processor: Any,
        *,
        device: str | torch.device = "cpu",
        normalize: bool | None = None,
        max_seq_length: int | None = None,
    ) -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.module: Any = model.to(self.device).eval()  # a transformers CLIPModel, SiglipModel, Siglip2Model
        self.runtime: TorchTowers | ExportedTowers = TorchTowers(self.module)  # type: ignore[assignment]  # towers, not one graph
        self.processor = processor
        self.text_tokens = TextTokens(processor.tokenizer, max_length=max_seq_length or spec.max_seq_length)
        self.normalize = spec.normalize if normalize is None else normalize
        self.padded_to_window = spec.model_type in _PADDED_TO_WINDOW
        self.logits_kind = SIGMOID if spec.model_type in _PADDED_TO_WINDOW else SOFTMAX
        self.image_limits = DEFAULT_IMAGE_LIMITS

    @classmethod
    def from_pretrained(cls, model_id: str, *, trust_remote_code: bool = False, **options: Any) -> ImageTextEncoder:
        """Load a CLIP, SigLIP or SigLIP2 model by id, local path or hub id (a plain ``transformers`` folder
        or sentence-transformers' layout); ``options`` are those of :meth:`from_spec`.

        Raises:
            ModelNotFoundError, NotAModelError: the id does not lead to a model.
            ModelKindError: the model is not an image-text model.
        """
        return cls.from_spec(resolve(model_id, trust_remote_code=trust_remote_code), **options)

    @classmethod
    def from_spec(
        cls,
        spec: ModelSpec,
        *,
        backend: str | None = None,
        precision: str | None = None,
        device: str = "cpu",
        normalize: bool | None = None,
        max_seq_length: int | None = None,
        cache_dir: str | Path | None = None,
        calibration: Any = None,
    ) -> ImageTextEncoder:
        """Load an already resolved image-text model, its towers run by ``backend``: ``openvino`` (the default,
        or ``$EMBEDRANK_BACKEND``) or ``onnx`` (each tower exported once into the cache, checked against torch;
        :mod:`embedrank.runtime.towers`), or ``torch``; a model whose towers do not export to the default backend
        runs on torch (:attr:`fallback_reason` says why; a backend named is run or fails). ``precision``:
        ``fp32`` (the default), ``bf16`` (torch's autocast, OpenVINO's bf16 compute where the CPU has it), or
        ``auto``: OpenVINO's bf16 where the CPU computes it natively and the check vectors stay within cosine
        0.999 of fp32's, else fp32 (:attr:`auto_choice` says which and why). ``normalize`` overrides the
        model's own setting.

        Raises:
            ModelKindError: not an image-text model.
            InvalidInputError: another backend or precision.
            ExportError: a tower that does not export to the backend named (SigLIP2's NaFlex vision tower).
        """
        if spec.kind != "image-text":
            raise ModelKindError(
                f"model {spec.model_id!r} is a {spec.kind} model, not an image-text model (CLIP, SigLIP); load it "
                f"with Encoder.from_pretrained or its kind's class"
            )
        if calibration is not None:
            raise InvalidInputError("image-text models have no int8 runtime to calibrate", param="calibration")
        auto = precision == "auto"
        from_env = (os.environ.get(BACKEND_ENV) or "").strip().lower()
        from_env = "" if from_env == "auto" else from_env  # auto's measured choice is for text encoders
        named = backend not in (None, "auto") or bool(from_env)
        backend = (backend if backend not in (None, "auto") else from_env or "openvino").lower()
        precision = "fp32" if precision in (None, "auto", "float32") else precision  # auto: decided below
        if backend not in BACKENDS or precision not in PRECISIONS or (precision, backend) == ("bf16", "onnx"):
            raise InvalidInputError(
                f"image-text models run in fp32 on {', '.join(BACKENDS)}, or bf16 on torch and openvino; got "
                f"backend={backend!r}, precision={precision!r}",
                param="backend" if backend not in BACKENDS else "precision",
            )
        check_max_seq_length(max_seq_length)
        import transformers

        if is_weightless():  # a front process: the processor and the configuration; the towers run elsewhere
            with quiet_loading():
                processor = transformers.AutoProcessor.from_pretrained(spec.path)
                config = transformers.AutoConfig.from_pretrained(spec.path)
            with torch.device("meta"):  # the modules' shapes, no storage: nothing is computed here
                model = transformers.AutoModel.from_config(config)
            encoder = cls(spec, model, processor, device="meta", normalize=normalize, max_seq_length=max_seq_length)
            encoder.runtime = ElsewhereRuntime()  # type: ignore[assignment]  # the loader says what runs it there
            return encoder
        with quiet_loading():
            processor = transformers.AutoProcessor.from_pretrained(spec.path)
            model = transformers.AutoModel.from_pretrained(spec.path, dtype=torch.float32)
        encoder = cls(spec, model, processor, device=device, normalize=normalize, max_seq_length=max_seq_length)
        if backend == "torch":
            encoder.runtime = TorchTowers(encoder.module, precision)
            return encoder
        try:
            examples = encoder.check_batches()
            towers = exported_towers(spec, encoder.module, backend, examples, precision=precision, cache_dir=cache_dir)
            encoder.runtime = choose_precision(towers.path, backend, towers, examples) if auto else towers
        except ExportError as exc:
            if named:
                raise  # the caller named the backend: run that one or fail
            log.warning(
                "embedrank: %s runs on torch: its towers could not be exported to the default backend %s (%s); "
                "backend='torch' selects torch without this warning",
                spec.model_id,
                backend,
                exc.reason,
            )
            encoder.runtime = TorchTowers(encoder.module, precision)
            encoder.runtime.fallback_reason = f"could not export to {backend} {precision}: {exc.reason}"
        return encoder

    def check_batches(self) -> dict[str, Sequence[dict[str, torch.Tensor]]]:
        """Two batches per tower, of different sizes (and text lengths), that an export is traced on and
        checked against."""
        from PIL import Image

        texts = vocabulary_texts(self.tokenizer.get_vocab(), n=6)
        batches = [texts[:2], [*texts[2:5], " ".join(texts)]]
        text = [
            {k: v for k, v in self._text_batch(self.tokenize_rows(b)).features.items() if k in TEXT_FEATURES}
            for b in batches
        ]
        rng = np.random.default_rng(0)
        sizes = [(40, 30), (64, 64), (30, 50), (90, 20), (50, 50)]
        pictures = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB") for w, h in sizes]
        image = []
        for group in (pictures[:2], pictures[2:5]):
            rows = self.preprocess(group)
            image.append({k: torch.stack([r.pixels[k] for r in rows]) for k in rows[0].pixels})
        return {"text": text, "image": image}

    # -- facts -----------------------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        return self.spec.model_id

    @property
    def dimension(self) -> int:
        return int(self.spec.dimension or self.encode(["dimension"]).shape[1])

    def __repr__(self) -> str:
        return (
            f"ImageTextEncoder({self.model_id!r}, type={self.spec.model_type}, dim={self.dimension}, "
            f"normalize={self.normalize}, max_seq_length={self.max_seq_length})"
        )

    # -- texts -----------------------------------------------------------------------------------
    def tokenize_rows(self, texts: Sequence[str], *, prompt: str = "") -> list[TokenRow]:
        """One unpadded row per text (``prompt`` before each), cut at the window."""
        return self.text_tokens.rows([prompt + t for t in texts] if prompt else list(texts))

    def prompt_skip(self, prompt: str) -> int:
        return 0  # the towers pool their own way; a prompt is part of the text

    def count_tokens(self, texts: Sequence[str], *, prompt: str | None = None, **_: Any) -> list[int]:
        """Untruncated token count of each text (``prompt`` before it, special tokens included)."""
        return self.text_tokens.lengths([(prompt or "") + t for t in texts])

    def tokens(
        self, texts: Sequence[str], *, prompt: str | None = None, truncate: bool = True, **_: Any
    ) -> list[list[str]]:
        """The tokens the text tower sees for each text, cut at the window unless ``truncate=False``."""
        return self.text_tokens.seen([(prompt or "") + t for t in check_texts(texts)], truncate=truncate)

    def token_spans(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[TokenSpan]]:
        """Each token of each text with its id and character span, untruncated."""
        return self.text_tokens.spans(texts, add_special_tokens=add_special_tokens)

    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Character span of each token of each text, special tokens excluded (for splitting long texts)."""
        return self.text_tokens.offsets(texts)

    def chunk_window(self, prompt: str | None = None) -> int:
        """Text tokens that fit the text tower's window: the max length minus special tokens and ``prompt``."""
        used = len(self.token_offsets([prompt])[0]) if prompt else 0
        return max(1, self.max_seq_length - self.text_tokens.special() - used)

    def _text_batch(self, rows: Sequence[TokenRow]) -> Tokenized:
        if not self.padded_to_window:
            return self.text_tokens.collate(rows)
        width = self.max_seq_length  # SigLIP's text tower reads the last of its window's positions
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.int64)
        mask = torch.zeros((len(rows), width), dtype=torch.int64)
        left = self.tokenizer.padding_side == "left"  # on the side the model's tokenizer pads
        for i, r in enumerate(rows):
            span = slice(width - r.length, width) if left else slice(0, r.length)
            ids[i, span] = torch.as_tensor(r.tokens["input_ids"])
            mask[i, span] = 1
        counts, cut = [r.length for r in rows], [r.truncated for r in rows]
        return Tokenized({"input_ids": ids, "attention_mask": mask}, counts, cut)

    def _text_vectors(self, rows: Sequence[TokenRow]) -> np.ndarray:
        batch = self._text_batch(rows)
        features = {k: v.to(self.device) for k, v in batch.features.items() if k in TEXT_FEATURES}
        return self.runtime.text(features).cpu().numpy()

    # -- images ----------------------------------------------------------------------------------
    def image_rows(
        self, images: Sequence[Any], *, limits: ImageLimits | None = None, param: str | None = None, start: int = 0
    ) -> list[ImageRow]:
        """Each image read (:func:`~embedrank.models.images.read_image`, within ``limits``) and preprocessed by
        the model's processor: one :class:`ImageRow` each. ``param`` names the field in errors (``images[2]``;
        ``start``: the first image's position in it)."""
        limits = limits or self.image_limits
        read = [
            read_image(image, limits, param=f"{param}[{start + i}]" if param else None)
            for i, image in enumerate(images)
        ]
        return self.preprocess(read)

    def preprocess(self, images: Sequence[Any]) -> list[ImageRow]:
        """RGB PIL images through the model's own processor: one :class:`ImageRow` each."""
        if not images:
            return []
        out = self.processor(images=list(images), return_tensors="pt")
        pixels = {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
        rows = []
        for i in range(len(images)):
            own = {k: v[i] for k, v in pixels.items()}
            mask = own.get("pixel_attention_mask")
            length = int(mask.sum()) if mask is not None else self._vision_tokens
            rows.append(ImageRow(own, length))
        return rows

    @property
    def _vision_tokens(self) -> int:
        vision = self.module.config.vision_config
        patches = (vision.image_size // vision.patch_size) ** 2
        return patches + (1 if self.spec.model_type == "clip" else 0)  # CLIP's class token

    def _image_vectors(self, rows: Sequence[ImageRow]) -> np.ndarray:
        pixels = {k: torch.stack([r.pixels[k] for r in rows]).to(self.device) for k in rows[0].pixels}
        return self.runtime.image(pixels).cpu().numpy()

    # -- both ------------------------------------------------------------------------------------
    def embed_rows(self, rows: Sequence[Row]) -> ModelOutput:
        """Text rows and image rows (mixed) through their towers: the projected vectors ``(B, D)`` float32 in
        order, before :meth:`finish_vectors`; what the serving engine runs per pass."""
        texts = [i for i, r in enumerate(rows) if isinstance(r, TokenRow)]
        images = [i for i, r in enumerate(rows) if isinstance(r, ImageRow)]
        parts = []
        if texts:
            parts.append((texts, self._text_vectors([rows[i] for i in texts])))  # type: ignore[misc]
        if images:
            parts.append((images, self._image_vectors([rows[i] for i in images])))  # type: ignore[misc]
        width = parts[0][1].shape[1] if parts else 0
        values = np.zeros((len(rows), width), dtype=np.float32)
        for positions, vectors in parts:
            values[positions] = vectors
        return ModelOutput(values, [r.length for r in rows], [r.truncated for r in rows])

    def finish_vectors(
        self, pooled: np.ndarray, *, normalize: bool | None = None, dimensions: int | None = None
    ) -> np.ndarray:
        """Normalize (the model's setting unless ``normalize`` says), cut to ``dimensions``; float32 ``(B, D)``."""
        return finish_vectors(
            pooled, normalize=self.normalize if normalize is None else normalize, dimensions=dimensions
        )

    def _encode(self, rows: Sequence[Row], batch_size: int, normalize: bool | None) -> np.ndarray:
        if batch_size < 1:
            raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}", param="batch_size")
        values = run_by_length(rows, batch_size, lambda batch: list(self.embed_rows(batch).values))
        if not values:
            return np.zeros((0, int(self.spec.dimension or 0)), dtype=np.float32)
        return self.finish_vectors(np.stack(values), normalize=normalize)

    def encode(self, texts: Iterable[str] | str, *, batch_size: int = 32, normalize: bool | None = None) -> np.ndarray:
        """Texts through the text tower: ``(N, D)`` float32 (one text: ``(D,)``), normalized as the model says
        unless ``normalize`` does."""
        single = isinstance(texts, str)
        items = check_texts([texts] if single else list(texts))
        out = self._encode(self.tokenize_rows(items), batch_size, normalize)
        return out[0] if single else out

    def encode_images(
        self,
        images: Iterable[Any],
        *,
        batch_size: int = 32,
        normalize: bool | None = None,
        limits: ImageLimits | None = None,
    ) -> np.ndarray:
        """Images (PIL images, encoded bytes, data URLs or paths; each read within ``limits``) through the
        vision tower: ``(N, D)`` float32, normalized as the model says unless ``normalize`` does.

        Raises:
            InvalidInputError, UnsupportedMediaError, RequestTooLargeError: an image that cannot be read
                (:func:`~embedrank.models.images.read_image`), named by its position.
        """
        items = list(images)
        if not items:
            raise InvalidInputError("images is empty; pass at least one image", param="images")
        if batch_size < 1:
            raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}", param="batch_size")
        starts = range(0, len(items), batch_size)
        read = partial(self.image_rows, limits=limits, param="images")
        vectors = []
        # the next batch is read and preprocessed in a thread while this one runs through the vision tower
        # (decoding, resizing and the forward pass all release the GIL)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedrank-images") as reader:
            ahead = reader.submit(read, items[:batch_size], start=0)
            for start in starts:
                rows = ahead.result()
                if start + batch_size < len(items):
                    ahead = reader.submit(
                        read, items[start + batch_size : start + 2 * batch_size], start=start + batch_size
                    )
                vectors.append(self.embed_rows(rows).values)
        return self.finish_vectors(np.concatenate(vectors), normalize=normalize)

    def zero_shot(self, images: Iterable[Any], labels: Sequence[str]) -> np.ndarray:
        """Each image scored against each label as the model was trained: the cosine of their vectors times
        the model's learned logit scale (plus SigLIP's bias), then CLIP's softmax over the labels or SigLIP's
        sigmoid of each pair. ``(N_images, N_labels)`` probabilities."""
        logits = self.logits(images, labels)
        if self.logits_kind == SIGMOID:
            return 1.0 / (1.0 + np.exp(-logits))
        shifted = logits - logits.max(axis=1, keepdims=True)
        return np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)

    def logits(self, images: Iterable[Any], labels: Sequence[str]) -> np.ndarray:
        """The model's image-text logits ``(N_images, N_labels)``: cosine × ``exp(logit_scale)`` (+ ``logit_bias``
        for SigLIP), as its own forward pass computes them."""
        image_vectors = l2_normalize(self.encode_images(images, normalize=False))
        text_vectors = l2_normalize(self.encode(list(labels), normalize=False))
        scale = float(self.module.logit_scale.detach().exp())
        bias = float(self.module.logit_bias.detach()) if hasattr(self.module, "logit_bias") else 0.0
        return (image_vectors @ text_vectors.T * scale + bias).astype(np.float32)
