"""An image-text model (CLIP, SigLIP) served: a request's texts and images batched in one engine.

Texts go the way every embedding model's do (:class:`~embedrank.serving.runners.AsyncEncoder`: tokenized
once, truncation, the vector cache, chunking). Images are read and preprocessed off the event loop, within
the request's :class:`~embedrank.models.images.ImageLimits`, one after another (so a request holds one
decoded image at a time), and their rows join the same engine as texts, with the same priority and fairness:
a batch may hold both, and the model runs each tower on its part.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from embedrank.errors import InvalidInputError, RequestTooLargeError
from embedrank.math.similarity import check_dimensions
from embedrank.models.image_text import ImageRow, ImageTextEncoder
from embedrank.models.images import (
    DEFAULT_IMAGE_LIMITS,
    ImageLimits,
    is_data_url,
    is_remote_url,
    read_image,
    too_many_bytes,
)
from embedrank.serving import tracing
from embedrank.serving.options import EMBED_DEFAULTS, EmbedOptions
from embedrank.serving.runners import AsyncEncoder
from embedrank.types import ModelOutput

__all__ = [  # what the service reads images with, besides the runner
    "AsyncImageTextEncoder",
    "ImageInput",
    "ImageLimits",
    "image_positions",
    "is_data_url",
    "is_remote_url",
    "preprocess_images",
]


@dataclasses.dataclass(frozen=True, slots=True)
class ImageInput:
    """An image a request sent (a data URL or encoded bytes), the request field that holds it (``input``,
    ``images``, ``inputs``: an error's ``param``) and where in that field (``[2]``, ``[1].content[0]``)."""

    source: str | bytes
    field: str
    at: str = ""

    @property
    def name(self) -> str:
        """The image as messages name it: ``input[2]``, ``inputs[1].content[0]``."""
        return f"{self.field}{self.at}"

    def too_large(self, size: int, max_bytes: int, *, at_least: bool = False) -> RequestTooLargeError:
        """The error of this image at ``size`` bytes (``at_least``: as far as it was read) over ``max_bytes``."""
        return too_many_bytes(size, max_bytes, name=self.name, param=self.field, at_least=at_least)


def image_positions(inputs: Sequence[Any]) -> list[int]:
    """Where the images stand among a request's inputs.

    >>> image_positions(["a cat", ImageInput(b"...", "input", "[1]")])
    [1]
    """
    return [i for i, item in enumerate(inputs) if isinstance(item, ImageInput)]


def preprocess_images(model: ImageTextEncoder, images: Sequence[ImageInput], limits: ImageLimits) -> list[ImageRow]:
    """Each image read within ``limits`` and preprocessed by the model's processor, one at a time (blocking)."""
    rows: list[ImageRow] = []
    for image in images:
        picture = read_image(image.source, limits, param=image.field, name=image.name)
        rows.extend(model.preprocess([picture]))
    return rows


class AsyncImageTextEncoder(AsyncEncoder):
    """Embeddings of texts and images (:class:`ImageInput`) through one :class:`BatchEngine`."""

    encoder: ImageTextEncoder

    async def embed(  # type: ignore[override]
        self, texts: Sequence[str | ImageInput], options: EmbedOptions = EMBED_DEFAULTS, *, prompt: str = ""
    ) -> ModelOutput:
        """Vectors ``(N, D)`` in input order of ``texts``, which may hold images: texts as :meth:`AsyncEncoder.embed` embeds them (``prompt``
        before each), images through the vision tower; the model's normalization and ``dimensions`` for both.
        ``options.budget`` bounds the tokens of both together (an image costs its vision tokens).

        Raises:
            InvalidInputError: chunking asked with images (it splits texts); an unreadable image.
            UnsupportedMediaError, RequestTooLargeError: an image refused by ``options.image_limits``.
        """
        inputs = texts
        at = image_positions(inputs)
        if not at:
            return await super().embed(inputs, options, prompt=prompt)  # type: ignore[arg-type]
        if options.chunking is not None:
            raise InvalidInputError(
                "chunking splits long texts; it does not apply to images", param=options.fields.chunking
            )
        check_dimensions(options.dimensions, self.dimension, options.fields.dimensions)
        images: list[ImageInput] = [inputs[i] for i in at]  # type: ignore[misc]
        limits = options.image_limits or DEFAULT_IMAGE_LIMITS
        with tracing.tokenizing(len(images)):
            rows = await asyncio.to_thread(preprocess_images, self.encoder, images, limits)
        image_tokens = sum(r.length for r in rows)
        if options.budget is not None and image_tokens > options.budget:
            raise RequestTooLargeError(
                f"the request's images hold {image_tokens} vision tokens; the limit is {options.budget} per request"
            )
        pictured = set(at)
        texts_at = [i for i in range(len(inputs)) if i not in pictured]
        words: list[str] = [inputs[i] for i in texts_at]  # type: ignore[misc]
        text_options = dataclasses.replace(
            options, budget=None if options.budget is None else options.budget - image_tokens
        )
        # the engine takes any row with a length; its model (embed_rows) runs each tower on its rows
        pictures = asyncio.ensure_future(self.engine.submit(rows, priority=options.priority))  # type: ignore[arg-type]
        worded = None
        try:
            if words:  # the texts queue beside the images; a text refused withdraws the images
                worded = await super().embed(words, text_options, prompt=prompt)
            seen = await pictures
        finally:
            pictures.cancel()
        values = np.zeros(
            (len(inputs), seen.values.shape[1] if options.dimensions is None else options.dimensions), np.float32
        )
        values[at] = self.encoder.finish_vectors(
            seen.values, normalize=options.normalize, dimensions=options.dimensions
        )
        counts, cut = [0] * len(inputs), [False] * len(inputs)
        for i, n in zip(at, seen.token_counts, strict=True):
            counts[i] = n
        if worded is not None:
            values[texts_at] = worded.values
            for i, n, flag in zip(texts_at, worded.token_counts, worded.truncated, strict=True):
                counts[i], cut[i] = n, flag
        return ModelOutput(values, counts, cut)
