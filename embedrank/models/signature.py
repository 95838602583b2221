"""What makes two sets of document vectors comparable: one type, written into every embedding cache key,
embedding-job manifest and saved index, and checked in one place.

Vectors are interchangeable when the same model (id and, for the cache on one machine, the same weights
at the same path) embedded the documents with the same pooling, normalization, window, document prompt
and dimension, on a runtime whose precision gives the same numbers: every fp32 backend agrees with torch
to 1e-4 and shares vectors; bf16 and int8 vectors are kept apart.

>>> a = EmbeddingSignature(model_id="m", dimension=4, pooling="mean", normalize=True, max_seq_length=8)
>>> a.check(a.to_dict(), "cache")
>>> a.check({**a.to_dict(), "pooling": "cls"}, "embeddings in out/")
Traceback (most recent call last):
...
embedrank.errors.IndexMismatchError: embeddings in out/ were made otherwise (pooling: 'cls' there, 'mean' here)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from embedrank.errors import IndexMismatchError
from embedrank.registry import weights_fingerprint


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbeddingSignature:
    """The settings document vectors depend on. ``path`` and ``weights`` locate the model's files on this
    machine: they key the local embedding cache but are not compared across machines (``model_id`` is)."""

    model_id: str
    dimension: int
    pooling: str
    normalize: bool
    max_seq_length: int
    prompt: str = ""  # the document prompt ("" when the model has none)
    precision: str = "fp32"  # "fp32", or "<backend>:bf16" / "<backend>:int8"
    path: str = dataclasses.field(default="", compare=False)
    weights: str | None = dataclasses.field(default=None, compare=False)

    @classmethod
    def of(cls, encoder: Any) -> EmbeddingSignature:
        """The signature of ``encoder``'s document vectors (an :class:`~embedrank.models.encoder.Encoder`,
        or anything with the same attributes, such as the test fakes)."""
        spec = encoder.spec
        precision = getattr(encoder, "precision", "fp32")
        return cls(
            model_id=encoder.model_id,
            dimension=encoder.dimension,
            pooling=encoder.pooling.value,
            normalize=encoder.normalize,
            max_seq_length=encoder.max_seq_length,
            prompt=encoder.document_prompt or "",
            precision="fp32" if precision == "fp32" else f"{encoder.backend}:{precision}",
            path=spec.path,
            # weights that can change in place (a model trained again) get a fingerprint
            weights=weights_fingerprint(spec.path) if spec.source in ("local", "hub") else None,
        )

    @classmethod
    def of_sparse(cls, encoder: Any) -> EmbeddingSignature:
        """The signature of a SPLADE ``encoder``'s sparse vectors (a
        :class:`~embedrank.models.sparse.SparseEncoder` or a fake): its vocabulary is the dimension, ``splade``
        the pooling, the weights unnormalized; fp32 only."""
        spec = encoder.spec
        return cls(
            model_id=encoder.model_id,
            dimension=encoder.vocab_size,
            pooling="splade",
            normalize=False,
            max_seq_length=encoder.max_seq_length,
            path=spec.path,
            weights=weights_fingerprint(spec.path) if spec.source in ("local", "hub") else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The compared fields, for a manifest or an index's metadata."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.compare}

    def cache_key(self) -> str:
        """The local embedding cache's key: every field, the machine-local ones included."""
        key = f"{self.model_id}|{self.path}|{self.pooling}|{self.normalize}|{self.max_seq_length}"
        if self.weights is not None:
            key += f"|weights={self.weights}"
        if self.precision != "fp32":
            key += f"|{self.precision}"
        return key + (f"|prompt={self.prompt!r}" if self.prompt else "")

    def check(self, stored: Mapping[str, Any] | None, what: str) -> None:
        """Refuse vectors whose recorded signature ``stored`` differs from this one in any compared field
        (a field they did not record counts as a difference: nothing is assumed)."""
        if stored is None:
            raise IndexMismatchError(f"{what} record no embedding settings; rebuild them with this version")
        differ = [
            f"{name}: {stored[name]!r} there, {value!r} here" if name in stored else f"{name}: not recorded there"
            for name, value in self.to_dict().items()
            if name not in stored or stored[name] != value
        ]
        if differ:
            raise IndexMismatchError(f"{what} were made otherwise ({'; '.join(differ)})")
