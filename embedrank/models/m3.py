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
from embedrank.models.encoder import Encoder
from embedrank.models.tokens import check_texts, collate_rows
from embedrank.registry import resolve

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


def _linear(path: Path) -> torch.nn.Linear:
    state = torch.load(path, map_location="cpu", weights_only=True)
    out_features, in_features = state["weight"].shape
    layer = torch.nn.Linear(in_features, out_features)
    layer.load_state_dict(state)
    return layer.eval()


class M3Encoder:
    """bge-m3's three outputs from one pass; use :meth:`from_pretrained`."""

    def __init__(self, encoder: Encoder, sparse_linear: torch.nn.Linear, colbert_linear: torch.nn.Linear) -> None:
        self.encoder = encoder
        self.sparse_linear = sparse_linear
        self.colbert_linear = colbert_linear
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
        spec = resolve(model_id, trust_remote_code=trust_remote_code)
        missing = [name for name in HEADS if not (Path(spec.path) / name).is_file()]
        if missing:
            raise UnsupportedModelError(
                f"model {model_id!r} is not in bge-m3's layout: {', '.join(missing)} missing beside its weights"
            )
        encoder = Encoder.from_spec(spec, pooling=PoolingMode.CLS, normalize=True, **options)
        return cls(encoder, *(_linear(Path(spec.path) / name) for name in HEADS))

    @property
    def vocab_size(self) -> int:
        return len(self.encoder.tokenizer)

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> M3Output:
        """All three outputs for ``texts`` (cut at ``encoder.max_seq_length`` tokens), batched by length."""
        texts = check_texts(texts)
        rows = self.encoder.tokenize_rows(texts)
        dense = np.zeros((len(texts), 0), np.float32)
        sparse_rows: list[sp.csr_matrix] = [sp.csr_matrix((1, self.vocab_size), dtype=np.float32)] * len(texts)
        multi: list[np.ndarray] = [np.zeros((0, 0), np.float32)] * len(texts)
        order = np.argsort([-r.length for r in rows], kind="stable")  # longest first: little padding
        for positions in (order[start : start + batch_size] for start in range(0, len(rows), batch_size)):
            batch = collate_rows(self.encoder.tokenizer, [rows[i] for i in positions])
            states = self.encoder.forward(batch.features).float()  # (B, T, H)
            mask = batch.features["attention_mask"].to(states.device)
            cls_vectors = torch.nn.functional.normalize(states[:, 0], dim=-1).cpu().numpy()
            if dense.shape[1] == 0:
                dense = np.zeros((len(texts), cls_vectors.shape[1]), np.float32)
            dense[positions] = cls_vectors
            weights = torch.relu(self.sparse_linear(states)).squeeze(-1)  # (B, T)
            ids = batch.features["input_ids"]
            lexical = token_max_weights(
                weights.cpu().numpy(), ids.cpu().numpy(), mask.cpu().numpy(), self.vocab_size, self.dropped
            )
            vectors = torch.nn.functional.normalize(self.colbert_linear(states[:, 1:]) * mask[:, 1:, None], dim=-1)
            for j, i in enumerate(positions):
                sparse_rows[i] = lexical[j]
                multi[i] = vectors[j, : int(mask[j].sum()) - 1].cpu().numpy()
        return M3Output(
            dense, sp.vstack(sparse_rows, format="csr"), multi, [r.length for r in rows], [r.truncated for r in rows]
        )

    def score(
        self, query: str, documents: Sequence[str], *, weights: Sequence[float] = DEFAULT_WEIGHTS, batch_size: int = 32
    ) -> dict[str, np.ndarray]:
        """``query`` against each document: ``{"dense", "sparse", "multi", "combined"}``, each ``(N,)``;
        ``combined`` is :func:`~embedrank.math.late.weighted_sum` of the three with ``weights`` (dense,
        sparse, multi-vector)."""
        out = self.encode([query, *documents], batch_size=batch_size)
        scores = {
            "dense": (out.dense[1:] @ out.dense[0]).astype(np.float32),
            "sparse": lexical_scores(out.sparse[0], out.sparse[1:]),
            "multi": maxsim_scores(out.multi[0], out.multi[1:]),
        }
        scores["combined"] = weighted_sum([scores["dense"], scores["sparse"], scores["multi"]], weights).astype(
            np.float32
        )
        return scores
