"""Ranges for int8/uint8 embeddings: the sample of texts whose embeddings set each dimension's range.

sentence-transformers computes int8 ranges from "calibration embeddings" and warns against taking them
from the vectors being quantized (a vector's code would then depend on its batch). In embedrank that
sample is the *range sample* (the word "calibration" is kept for the int8 runtime, whose activations NNCF
calibrates). A model gets its range sample from, in order:

1. :meth:`RangeSample.of`: texts, or a file the user (or the service's model entry, ``ranges``) names:
   one text per line (``.txt``), or a BEIR-style ``.jsonl`` whose records have ``text`` (and optionally
   ``title``). A sample of the user's own corpus is the best choice.
2. The documented default, :func:`embedrank.texts.vocabulary_texts`: 1,000 pseudo-sentences of 8 to 64 words drawn with a
   fixed seed from the model's own vocabulary (whole alphabetic words of three letters or more). They
   need no data files and give every model the same recipe; on SciFact they lose little against a
   corpus sample (see the README's compact-vector table).

The embeddings are computed once per model and kept; ranges for a truncated ``dimensions`` are taken from
the truncated (and, for normalizing models, renormalized) sample embeddings, as the vectors they
quantize are.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.math.quantization import quantization_ranges
from embedrank.math.similarity import truncate_dims
from embedrank.texts import read_texts


class RangeSample:
    """A model's range sample: texts and, once computed, their embeddings ``(N, D)`` (thread-safe)."""

    def __init__(self, texts: Sequence[str]) -> None:
        if len(texts) < 2:
            raise InvalidInputError("a range sample needs at least 2 texts", param="ranges")
        self.texts = list(texts)
        self._embeddings: np.ndarray | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, texts: Sequence[str] | str | Path) -> RangeSample:
        """From a list of texts, or the path of a ``.txt``/``.jsonl`` file (:func:`read_texts`)."""
        return cls(read_texts(texts) if isinstance(texts, (str, Path)) else texts)

    def embeddings(self, encode: Callable[[list[str]], np.ndarray]) -> np.ndarray:
        """The sample's embeddings, computed with ``encode`` on first use."""
        with self._lock:
            if self._embeddings is None:
                self._embeddings = np.asarray(encode(self.texts), dtype=np.float32)
            return self._embeddings

    def ranges(
        self, encode: Callable[[list[str]], np.ndarray], *, dimensions: int | None = None, normalize: bool = True
    ) -> np.ndarray:
        """``(2, dimensions or D)`` per-dimension ``[min; max]`` for :func:`~embedrank.math.quantization.quantize`."""
        sample = truncate_dims(self.embeddings(encode), dimensions, renormalize=normalize)
        return quantization_ranges(sample)


class FitsRanges:
    """The int8/uint8 range methods an encoder offers (:class:`~embedrank.models.encoder.Encoder` and the
    test fakes share them). A class using it sets ``_range_sample = None`` and ``normalize``, and says what
    its default sample is and how it embeds texts for ranges."""

    _range_sample: RangeSample | None
    normalize: bool

    def default_range_texts(self) -> list[str]:
        """The texts of the default range sample."""
        raise NotImplementedError

    def embed_for_ranges(self, texts: list[str], *, normalize: bool) -> np.ndarray:
        """``(N, D)`` embeddings of the sample's texts, without prompts."""
        raise NotImplementedError

    @property
    def range_sample(self) -> RangeSample:
        """The texts whose embeddings set the int8/uint8 ranges; by default :meth:`default_range_texts`
        (1,000 seeded pseudo-sentences from the model's vocabulary). Set it with :meth:`fit_ranges`."""
        if self._range_sample is None:
            self._range_sample = RangeSample(self.default_range_texts())
        return self._range_sample

    def fit_ranges(self, texts: Sequence[str] | str | Path) -> None:
        """Use ``texts`` (or the texts of a ``.txt``/``.jsonl`` file) to set the int8/uint8 ranges of
        the compact vectors; a sample of the corpus you will search is the best choice."""
        self._range_sample = RangeSample.of(texts)

    @property
    def calibration(self) -> RangeSample:
        """Deprecated name of :attr:`range_sample`."""
        warnings.warn("calibration is deprecated: use range_sample", DeprecationWarning, stacklevel=2)
        return self.range_sample

    def calibrate(self, texts: Sequence[str] | str | Path) -> None:
        """Deprecated name of :meth:`fit_ranges` ("calibration" names the int8 runtime's, in ``from_pretrained``)."""
        warnings.warn("calibrate() is deprecated: use fit_ranges()", DeprecationWarning, stacklevel=2)
        self.fit_ranges(texts)

    def quantization_ranges(self, dimensions: int | None = None, *, normalize: bool | None = None) -> np.ndarray:
        """``(2, dimensions or D)`` per-dimension ``[min; max]`` of the range sample's embeddings (computed once)."""
        do_norm = self.normalize if normalize is None else normalize
        return self.range_sample.ranges(
            partial(self.embed_for_ranges, normalize=do_norm), dimensions=dimensions, normalize=do_norm
        )
