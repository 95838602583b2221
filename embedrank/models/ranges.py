"""Ranges for int8/uint8 embeddings: the sample of texts whose embeddings set each dimension's range.

sentence-transformers computes int8 ranges from "calibration embeddings" and warns against taking them
from the vectors being quantized (a vector's code would then depend on its batch). In embedrank that
sample is the *range sample* (the word "calibration" is kept for the int8 runtime, whose activations NNCF
calibrates). A model gets its range sample from, in order:

1. :meth:`RangeSample.of`: texts, or a file the user (or the service's model entry, ``ranges``) names:
   one text per line (``.txt``), or a BEIR-style ``.jsonl`` whose records have ``text`` (and optionally
   ``title``). A sample of the user's own corpus is the best choice.
2. The documented default, :func:`embedrank.texts.packaged_sample`: the 800 real English texts shipped with
   the package (passages, questions, definitions and example sentences; ``embedrank/sample/NOTICE.md``).
   They need no data files and are the same on every machine. For another language, or a corpus unlike
   them, name a sample of your own.

The embeddings are computed once per model and kept; ranges for a truncated ``dimensions`` are taken from
the truncated (and, for normalizing models, renormalized) sample embeddings, as the vectors they
quantize are.

They are also kept on disk, in ``<cache>/ranges/`` (``$EMBEDRANK_CACHE``, else ``~/.cache/embedrank``), under
the SHA-256 of everything they depend on: the model's embedding signature with its weights' names, sizes and
modification times, whether the sample was normalized, and the sample's texts. The next process that loads
the same model (the service's next start, a replica sharing the cache, a container whose image baked them)
reads them instead of embedding the sample again. Files are written whole (a temporary file renamed into
place); one that cannot be read, or whose shape, type or values are not what the sample gives, is computed
again and replaced, never used.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

from embedrank.errors import InvalidInputError
from embedrank.math.quantization import quantization_ranges
from embedrank.math.similarity import truncate_dims
from embedrank.paths import default_cache_dir, writing
from embedrank.texts import read_texts

logger = logging.getLogger(__name__)
STORE_FOLDER = "ranges"


class RangeSample:
    """A model's range sample: texts and, once computed, their embeddings ``(N, D)`` (thread-safe)."""

    def __init__(self, texts: Sequence[str]) -> None:
        if len(texts) < 2:
            raise InvalidInputError("a range sample needs at least 2 texts", param="ranges")
        self.texts = list(texts)
        self._embeddings: np.ndarray | None = None
        self._lock = threading.Lock()
        self.read_from: Path | None = None  # the store's file the embeddings were read from, if they were

    @classmethod
    def of(cls, texts: Sequence[str] | str | Path) -> RangeSample:
        """From a list of texts, or the path of a ``.txt``/``.jsonl`` file (:func:`read_texts`)."""
        return cls(read_texts(texts) if isinstance(texts, (str, Path)) else texts)

    def embeddings(
        self, encode: Callable[[list[str]], np.ndarray], *, stored_as: Callable[[], str | None] | None = None
    ) -> np.ndarray:
        """The sample's embeddings ``(N, D)``, computed with ``encode`` on first use. With ``stored_as`` (giving
        what the embeddings depend on besides the texts, asked only then) they are read from, or written to,
        the on-disk store."""
        with self._lock:
            if self._embeddings is None:
                depends_on = stored_as() if stored_as is not None else None
                path = self.stored_path(depends_on) if depends_on is not None else None
                found = read_stored(path, len(self.texts)) if path is not None else None
                self.read_from = path if found is not None else None
                if found is None:
                    found = np.asarray(encode(self.texts), dtype=np.float32)
                    if path is not None:
                        write_stored(path, found)
                self._embeddings = found
            return self._embeddings

    @property
    def computed(self) -> np.ndarray | None:
        """The sample's embeddings ``(N, D)`` if they were computed (or read, or adopted), else None."""
        return self._embeddings

    def adopt(self, embeddings: np.ndarray) -> None:
        """Use ``embeddings`` ``(N, D)``, computed elsewhere for these texts (the engine process's), as the
        sample's: no forward pass here.

        Raises:
            ValueError: not one float32 row per text.
        """
        found = np.asarray(embeddings)
        if found.dtype != np.float32 or found.ndim != 2 or found.shape[0] != len(self.texts):
            raise ValueError(
                f"embeddings {found.dtype} {found.shape} are not this sample's ({len(self.texts)} texts, float32)"
            )
        with self._lock:
            self._embeddings = found

    def stored_path(self, depends_on: str) -> Path:
        """The store's file for this sample embedded as ``depends_on`` says."""
        digest = hashlib.sha256(depends_on.encode())
        for text in self.texts:
            digest.update(b"\0" + text.encode("utf-8", "surrogatepass"))
        return default_cache_dir() / STORE_FOLDER / f"{digest.hexdigest()}.npy"

    def ranges(
        self,
        encode: Callable[[list[str]], np.ndarray],
        *,
        dimensions: int | None = None,
        normalize: bool = True,
        stored_as: Callable[[], str | None] | None = None,
    ) -> np.ndarray:
        """``(2, dimensions or D)`` per-dimension ``[min; max]`` for :func:`~embedrank.math.quantization.quantize`."""
        sample = truncate_dims(self.embeddings(encode, stored_as=stored_as), dimensions, renormalize=normalize)
        return quantization_ranges(sample)


def read_stored(path: Path, rows: int) -> np.ndarray | None:
    """The stored sample embeddings at ``path`` if they are whole: ``(rows, D)`` float32, every value finite
    (None otherwise: missing, unreadable, cut short or of another sample)."""
    try:
        found = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError) as exc:
        logger.warning("int8/uint8 range sample %s cannot be read (%s): computing it again", path, exc)
        return None
    if found.dtype != np.float32 or found.ndim != 2 or found.shape[0] != rows or not np.isfinite(found).all():
        logger.warning(
            "int8/uint8 range sample %s is not this sample's (%s %s): computing it again",
            path,
            found.dtype,
            found.shape,
        )
        return None
    return found


def write_stored(path: Path, embeddings: np.ndarray) -> None:
    """Write ``embeddings`` to ``path`` whole or not at all (a temporary file beside it, renamed into place); a
    store that cannot be written is logged and skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".npy", dir=path.parent)
        with writing(tmp):  # a process stopped at once removes it
            try:
                with os.fdopen(fd, "wb") as out:
                    np.save(out, embeddings, allow_pickle=False)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    except OSError as exc:
        logger.warning("int8/uint8 range sample not stored at %s (%s)", path, exc)


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

    def ranges_depend_on(self, adapter: str | None = None) -> str | None:
        """What the sample's embeddings (by the base model, or by its ``adapter``) depend on besides its texts,
        which keys them in the on-disk store (None: they are not stored)."""
        return None

    def range_sample_of(self, adapter: str | None) -> RangeSample:
        """The range sample as ``adapter`` embeds it (None: :attr:`range_sample`): the same texts, its own vectors."""
        base = self.range_sample
        if adapter is None:
            return base
        samples: dict[str, tuple[RangeSample, RangeSample]] = self.__dict__.setdefault("_adapter_samples", {})
        of, sample = samples.get(adapter, (None, None))
        if of is not base or sample is None:  # first use, or fit_ranges chose other texts since
            sample = RangeSample(base.texts)
            samples[adapter] = (base, sample)
        return sample

    @property
    def range_sample(self) -> RangeSample:
        """The texts whose embeddings set the int8/uint8 ranges; by default :meth:`default_range_texts`
        (an encoder's: the 800 texts of the packaged sample). Set it with :meth:`fit_ranges`."""
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

    def quantization_ranges(
        self, dimensions: int | None = None, *, normalize: bool | None = None, adapter: str | None = None
    ) -> np.ndarray:
        """``(2, dimensions or D)`` per-dimension ``[min; max]`` of the range sample's embeddings (computed once),
        by the base model or by its LoRA ``adapter`` (each adapter embeds the same texts once, for its own ranges)."""
        do_norm = self.normalize if normalize is None else normalize

        def stored_as() -> str | None:  # asked once, when the sample is first embedded: not on every request
            depends_on = self.ranges_depend_on() if adapter is None else self.ranges_depend_on(adapter)
            return None if depends_on is None else f"{depends_on}|normalize={do_norm}"

        embed = partial(self.embed_for_ranges, normalize=do_norm)
        if adapter is not None:
            embed = partial(embed, adapter=adapter)
        return self.range_sample_of(adapter).ranges(
            embed,
            dimensions=dimensions,
            normalize=do_norm,
            stored_as=stored_as,
        )
