"""bge-m3: a dense vector, lexical weights and multi-vectors from one forward pass, as FlagEmbedding's
``BGEM3FlagModel`` computes them.

bge-m3 is an XLM-R encoder with two small heads saved beside it: ``sparse_linear.pt`` (hidden -> 1) and
``colbert_linear.pt`` (hidden -> hidden). From the token states ``(B, T, H)`` of one pass:

- **dense**: the CLS state, normalized (the model's sentence-transformers layout says the same);
- **sparse** (lexical weights): ``ReLU(sparse_linear(state))`` per token, the largest per token id, CLS,
  EOS, PAD and UNK left out (:func:`~embedrank.math.late.token_max_weights`), as a ``(N, V)`` CSR matrix;
- **multi-vector** (ColBERT): ``colbert_linear(state)`` of every token after CLS, normalized, one
  ``(T_i - 1, H)`` array per text (padding left out).

The transformer runs on any backend (:class:`~embedrank.models.encoder.Encoder` with CLS pooling); the
heads are two small matrix products in torch. Scores: :func:`~embedrank.math.late.maxsim` (multi-vector),
:func:`~embedrank.math.late.lexical_scores` (sparse), dot products (dense), combined by
:func:`~embedrank.math.late.weighted_sum`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from embedrank.errors import UnsupportedModelError
from embedrank.math.late import lexical_scores, maxsim_scores, token_max_weights, weighted_sum
from embedrank.math.pooling import PoolingMode
from embedrank.math.similarity import l2_normalize
from embedrank.models.batching import run_by_length
from embedrank.models.checks import check_texts
from embedrank.models.chunking import Chunking, score_chunked
from embedrank.models.encoder import Encoder, OverEncoder
from embedrank.models.tokens import TokenRow
from embedrank.registry import ModelSpec, resolve

HEADS = ("sparse_linear.pt", "colbert_linear.pt")
DEFAULT_WEIGHTS = (0.4, 0.2, 0.4)  # dense, sparse, multi-vector: the weights bge-m3's authors use


@dataclasses.dataclass(frozen=True)
class M3Output:
    """bge-m3's outputs for ``N`` texts, in input order."""

    dense: np.ndarray  # (N, H) float32, normalized
    sparse: sp.csr_matrix  # (N, V) float32 lexical weights
    multi: list[np.ndarray]  # N arrays (T_i - 1, H) float32, normalized
    token_counts: list[int]
    truncated: list[bool]


@dataclasses.dataclass(frozen=True)
class M3Row:
    """One text's outputs: its CLS state ``(H,)`` (not normalized), lexical weights ``(1, V)`` CSR and
    multi-vectors ``(T - 1, H)`` (normalized)."""

    cls_state: np.ndarray
    lexical: sp.csr_matrix
    multi: np.ndarray


def gather(
    rows: Sequence[M3Row], token_counts: list[int], truncated: list[bool], vocab_size: int, *, normalize: bool = True
) -> M3Output:
    """:class:`M3Output` of ``rows`` in order; ``normalize=False`` keeps the dense vectors' raw CLS states."""
    dense = np.stack([r.cls_state for r in rows]).astype(np.float32) if rows else np.zeros((0, 0), np.float32)
    if normalize and len(dense):
        dense = l2_normalize(dense)
    sparse = sp.vstack([r.lexical for r in rows], format="csr") if rows else sp.csr_matrix((0, vocab_size))
    return M3Output(dense, sparse, [r.multi for r in rows], token_counts, truncated)


def query_scores(out: M3Output, weights: Sequence[float] = DEFAULT_WEIGHTS) -> dict[str, np.ndarray]:
    """Text 0 of ``out`` (the query, dense vectors normalized) against each other text: ``{"dense", "sparse",
    "multi", "combined"}``, each ``(N - 1,)`` float32; ``combined`` is :func:`~embedrank.math.late.weighted_sum`
    of the three with ``weights`` (dense, sparse, multi-vector)."""
    scores = {
        "dense": (out.dense[1:] @ out.dense[0]).astype(np.float32),
        "sparse": lexical_scores(out.sparse[0], out.sparse[1:]),
        "multi": maxsim_scores(out.multi[0], out.multi[1:]),
    }
    combined = weighted_sum([scores["dense"], scores["sparse"], scores["multi"]], weights)
    return {**scores, "combined": combined.astype(np.float32)}


def _linear(path: Path) -> torch.nn.Linear:
    state = torch.load(path, map_location="cpu", weights_only=True)
    out_features, in_features = state["weight"].shape
    layer = torch.nn.Linear(in_features, out_features)
    layer.load_state_dict(state)
    return layer.eval()


class M3Encoder(OverEncoder):
    """bge-m3's three outputs from one pass; use :meth:`from_pretrained`."""

    def __init__(self, encoder: Encoder, sparse_linear: torch.nn.Linear, colbert_linear: torch.nn.Linear) -> None:
        self.encoder = encoder
        self.sparse_linear = sparse_linear.to(encoder.device)  # beside the token states
        self.colbert_linear = colbert_linear.to(encoder.device)
        tok = encoder.tokenizer
        self.dropped = sorted(
            {i for i in (tok.cls_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) if i is not None}
        )

    @classmethod
    def from_pretrained(cls, model_id: str, *, trust_remote_code: bool = False, **options: Any) -> M3Encoder:
        """Load bge-m3 (or a model in its layout) by id or path; ``options`` as :meth:`Encoder.from_spec
        <embedrank.models.encoder.Encoder.from_spec>` (``backend``, ``precision``, ...).

        Raises:
            UnsupportedModelError: the model has no ``sparse_linear.pt`` and ``colbert_linear.pt``.
        """
        return cls.from_spec(resolve(model_id, trust_remote_code=trust_remote_code), **options)

    @classmethod
    def from_spec(cls, spec: ModelSpec, **options: Any) -> M3Encoder:
        """:meth:`from_pretrained` of an already resolved model."""
        missing = [name for name in HEADS if not (Path(spec.path) / name).is_file()]
        if missing:
            raise UnsupportedModelError(
                f"model {spec.model_id!r} is not in bge-m3's layout: {', '.join(missing)} missing beside its weights"
            )
        encoder = Encoder.from_spec(spec, pooling=PoolingMode.CLS, normalize=True, **options)
        return cls(encoder, *(_linear(Path(spec.path) / name) for name in HEADS))

    @property
    def spec(self) -> ModelSpec:
        return self.encoder.spec

    @property
    def dimension(self) -> int:
        """The dense vector's width."""
        return self.encoder.dimension

    def fit_ranges(self, texts: Sequence[str] | str | Path) -> None:
        """The dense vectors' int8/uint8 ranges fitted on ``texts`` (:meth:`Encoder.fit_ranges`)."""
        self.encoder.fit_ranges(texts)

    def quantization_ranges(self, dimensions: int | None = None) -> np.ndarray:
        """The dense vectors' int8/uint8 ranges (:meth:`Encoder.quantization_ranges`)."""
        return self.encoder.quantization_ranges(dimensions)

    @property
    def vocab_size(self) -> int:
        return len(self.encoder.tokenizer)

    def tokenize_rows(self, texts: Sequence[str]) -> list[TokenRow]:
        """Texts tokenized once, unpadded (cut at ``encoder.max_seq_length``), for :meth:`outputs_rows`."""
        return self.encoder.tokenize_rows(texts)

    @torch.inference_mode()
    def outputs_rows(self, rows: Sequence[TokenRow]) -> list[M3Row]:
        """One forward pass over ``rows`` padded together; each row's three outputs (what an engine runs)."""
        batch = self.encoder.text_tokens.collate(rows)
        states = self.encoder.forward(batch.features).float()  # (B, T, H)
        mask = batch.features["attention_mask"].to(states.device)
        weights = torch.relu(self.sparse_linear(states)).squeeze(-1)  # (B, T)
        ids = batch.features["input_ids"].cpu().numpy()
        lexical = token_max_weights(weights.cpu().numpy(), ids, mask.cpu().numpy(), self.vocab_size, self.dropped)
        vectors = torch.nn.functional.normalize(self.colbert_linear(states[:, 1:]) * mask[:, 1:, None], dim=-1)
        cls_states = states[:, 0].cpu().numpy()
        return [
            M3Row(cls_states[j], lexical[j], vectors[j, : int(mask[j].sum()) - 1].cpu().numpy())
            for j in range(len(rows))
        ]

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> M3Output:
        """All three outputs for ``texts`` (cut at ``encoder.max_seq_length`` tokens), batched by length."""
        rows = self.tokenize_rows(check_texts(texts))
        out = run_by_length(rows, batch_size, self.outputs_rows)
        return gather(out, [r.length for r in rows], [r.truncated for r in rows], self.vocab_size)

    def score(
        self, query: str, documents: Sequence[str], *, weights: Sequence[float] = DEFAULT_WEIGHTS, batch_size: int = 32
    ) -> dict[str, np.ndarray]:
        """``query`` against each document: ``{"dense", "sparse", "multi", "combined"}``, each ``(N,)``;
        ``combined`` is :func:`~embedrank.math.late.weighted_sum` of the three with ``weights`` (dense,
        sparse, multi-vector)."""
        return query_scores(self.encode([query, *documents], batch_size=batch_size), weights)

    # -- the late-interaction interface (LateInteractionScorer, MultiVectorRetriever), as ColBERTEncoder's ----
    maxsim_reduce = "mean"  # bge-m3 averages the query's best matches

    def multi_vectors(self, texts: Sequence[str], *, query: bool, batch_size: int = 32) -> list[np.ndarray]:
        """The multi-vectors of ``texts``, ``(T_i - 1, H)`` each; bge-m3 encodes queries and documents alike."""
        return self.encode(texts, batch_size=batch_size).multi

    def rerank_scores(
        self, query: str, documents: Sequence[str], *, batch_size: int = 32, chunking: Chunking | None = None
    ) -> np.ndarray:
        """The combined score of ``query`` against each document, ``(N,)``; documents over the window are cut
        there, or with ``chunking`` scored window by window and aggregated."""
        docs = check_texts(documents, "documents")

        def combined(texts: list[str]) -> np.ndarray:
            return self.score(query, texts, batch_size=batch_size)["combined"]

        if chunking is None:
            return combined(docs)
        window = self.encoder.chunk_window()
        return score_chunked(docs, combined, offsets=self.encoder.token_offsets, window=window, chunking=chunking)[0]
