"""ColBERT (late interaction) in PyLate's layout: one vector per token, scored by MaxSim, as PyLate computes it.

A PyLate model is a transformer, one or more ``Dense`` projections applied to every token state
(``1_Dense/``, typically hidden -> 128) and its settings in ``config_sentence_transformers.json``
(:class:`ColBERTSettings`). From text to vectors:

- **queries**: ``[CLS] [Q] text [SEP]``, cut at ``query_length`` tokens; with query expansion (the default)
  filled up to ``query_length`` with the mask token, which the other tokens do not attend to
  (``attend_to_expansion_tokens`` False) but whose own states are kept: every one of the ``query_length``
  positions gives a vector;
- **documents**: ``[CLS] [D] text [SEP]``, cut at ``document_length`` tokens; tokens in the skiplist
  (punctuation by default) are encoded but give no vector;
- each kept state goes through the projections and is L2-normalized: ``(T_i, D)`` per text.

The score of a query against a document is :func:`~embedrank.math.late.maxsim` with ``reduce="sum"``: the sum
over query vectors of the best dot product with any document vector (PyLate's ``colbert_scores``). The
transformer runs on any backend (:class:`~embedrank.models.encoder.Encoder`); the projections in torch.
"""

from __future__ import annotations

import dataclasses
import json
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedrank.errors import ModelKindError, UnsupportedModelError
from embedrank.math.late import maxsim_scores
from embedrank.models.batching import run_by_length
from embedrank.models.checks import check_texts
from embedrank.models.chunking import Chunking, score_chunked
from embedrank.models.dense import apply_dense, load_dense, load_stanford_projection
from embedrank.models.encoder import Encoder, OverEncoder
from embedrank.models.tokens import TokenRow, pad_features
from embedrank.registry import ModelSpec, resolve


@dataclasses.dataclass(frozen=True)
class ColBERTSettings:
    """PyLate's settings (``config_sentence_transformers.json``), with PyLate's defaults."""

    query_prefix: str = "[Q] "
    document_prefix: str = "[D] "
    query_length: int = 32
    document_length: int = 180
    do_query_expansion: bool = True
    attend_to_expansion_tokens: bool = False
    skiplist_words: tuple[str, ...] = tuple(string.punctuation)

    @classmethod
    def read(cls, root: str | Path) -> ColBERTSettings:
        """The settings saved with the model in ``root`` (absent keys keep PyLate's defaults). A Stanford
        checkpoint's come from ``artifact.metadata``, its markers ``[unused0]``/``[unused1]`` unless it names
        others, as PyLate reads them."""
        path = Path(root) / "config_sentence_transformers.json"
        saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        if is_stanford(root):
            meta_path = Path(root) / "artifact.metadata"
            meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
            saved = {
                "query_prefix": meta.get("query_token_id") or "[unused0]",
                "document_prefix": meta.get("doc_token_id") or "[unused1]",
                "query_length": meta.get("query_maxlen"),
                "document_length": meta.get("doc_maxlen"),
                "attend_to_expansion_tokens": meta.get("attend_to_mask_tokens"),
            }
        values = {f.name: saved[f.name] for f in dataclasses.fields(cls) if saved.get(f.name) is not None}
        settings = cls(**{**values, "skiplist_words": tuple(values.get("skiplist_words", cls.skiplist_words))})
        if not settings.do_query_expansion:  # PyLate: no expansion tokens, so none to attend to
            settings = dataclasses.replace(settings, attend_to_expansion_tokens=False)
        if settings.query_length < 3 or settings.document_length < 3:
            raise UnsupportedModelError(f"{path}: query_length and document_length must be at least 3 tokens")
        return settings


def is_stanford(root: str | Path) -> bool:
    """Whether ``root`` holds a Stanford ColBERT checkpoint: ``config.json`` names ``HF_ColBERT`` and there is
    no sentence-transformers layout (``modules.json``)."""
    config = Path(root) / "config.json"
    if (Path(root) / "modules.json").is_file() or not config.is_file():
        return False
    return "HF_ColBERT" in (json.loads(config.read_text(encoding="utf-8")).get("architectures") or [])


class ColBERTEncoder(OverEncoder):
    """A PyLate ColBERT model (or a Stanford checkpoint, read as PyLate reads it): per-token vectors for queries and documents, and MaxSim scores; use
    :meth:`from_pretrained`."""

    def __init__(
        self,
        encoder: Encoder,
        settings: ColBERTSettings,
        projections: Sequence[Any] = (),
        spec: ModelSpec | None = None,
    ) -> None:
        self.encoder = encoder
        self.spec = spec or encoder.spec  # the model's own (kind multi-vector); the encoder's is its transformer's
        self.settings = settings
        self.projections = list(projections)
        tok = encoder.tokenizer
        self.prefix_ids: dict[bool, int | None] = {}  # query? -> the marker's token id (None: no marker)
        for is_query, prefix in ((True, settings.query_prefix), (False, settings.document_prefix)):
            token_id = tok.convert_tokens_to_ids(prefix) if prefix else None
            if prefix and (token_id is None or token_id == tok.unk_token_id):
                raise UnsupportedModelError(
                    f"model {encoder.model_id!r}: its marker {prefix!r} is not a token of its tokenizer (a PyLate "
                    "model saves its markers with the tokenizer)"
                )
            self.prefix_ids[is_query] = token_id
        # PyLate expands queries with the mask token (an encoder), else EOS (a decoder), else padding
        fill = next((i for i in (tok.mask_token_id, tok.eos_token_id, tok.pad_token_id) if i is not None), None)
        if fill is None:
            raise UnsupportedModelError(f"model {encoder.model_id!r} has no mask, EOS or pad token to expand queries")
        self.fill_id: int = int(fill)
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else fill)
        self.skiplist = np.array([tok.convert_tokens_to_ids(w) for w in settings.skiplist_words], dtype=np.int64)

    @classmethod
    def from_pretrained(cls, model_id: str, *, trust_remote_code: bool = False, **options: Any) -> ColBERTEncoder:
        """Load a PyLate ColBERT model by id or path; ``options`` as :meth:`Encoder.from_spec
        <embedrank.models.encoder.Encoder.from_spec>` (``backend``, ``precision``, ...).

        Raises:
            ModelKindError: the model is not a ColBERT model in PyLate's layout.
        """
        return cls.from_spec(resolve(model_id, trust_remote_code=trust_remote_code), **options)

    @classmethod
    def from_spec(cls, spec: ModelSpec, **options: Any) -> ColBERTEncoder:
        """:meth:`from_pretrained` of an already resolved model."""
        if spec.kind != "multi-vector":
            raise ModelKindError(
                f"model {spec.model_id!r} is a {spec.kind} model, not a ColBERT model in PyLate's layout"
            )
        settings = ColBERTSettings.read(spec.path)
        document_length = options.pop("max_seq_length", None)  # a shorter (or longer) window than the model's
        if document_length:
            settings = dataclasses.replace(settings, document_length=int(document_length))
        window = max(settings.query_length, settings.document_length)
        transformer = dataclasses.replace(spec, kind="embedding", dense=(), max_seq_length=window)
        encoder = Encoder.from_spec(transformer, normalize=False, **options)
        projections = (
            [load_stanford_projection(spec.path)] if is_stanford(spec.path) else load_dense(spec.path, spec.dense)
        )
        return cls(encoder, settings, projections, spec)

    @property
    def dimension(self) -> int:
        """Width of each token vector (the last projection's output)."""
        return int(self.projections[-1].weight.shape[0]) if self.projections else self.encoder.dimension

    @property  # type: ignore[misc]  # read-only: a ColBERT window is fixed at load (from_pretrained(max_seq_length=))
    def max_seq_length(self) -> int:
        """A document's window in tokens (markers and special tokens included)."""
        return self.settings.document_length

    def chunk_window(self) -> int:
        """Text tokens of a document that fit its window (special tokens and the marker left out)."""
        used = self.encoder.text_tokens.special() + (self.prefix_ids[False] is not None)
        return max(1, self.settings.document_length - used)

    def tokenize_rows(self, texts: Sequence[str], *, query: bool) -> list[TokenRow]:
        """Texts tokenized as queries or documents (marker inserted after the first token; queries expanded),
        unpadded: one :class:`~embedrank.models.tokens.TokenRow` each, its ``tokens`` holding the model's
        features and ``keep``, the positions that give a vector."""
        s = self.settings
        length = s.query_length if query else s.document_length
        prefix = self.prefix_ids[query]
        out = []
        for row in self.encoder.text_tokens.rows(texts, max_length=length - (prefix is not None)):
            names = ("input_ids", "attention_mask", "token_type_ids")
            features = {k: list(v) for k, v in row.tokens.items() if k in names}
            if prefix is not None:
                for key, value in (("input_ids", prefix), ("attention_mask", 1), ("token_type_ids", 0)):
                    if key in features:
                        features[key].insert(1, value)
            ids = np.asarray(features["input_ids"], dtype=np.int64)
            if query and s.do_query_expansion:
                fill = length - len(ids)
                features["input_ids"] += [self.fill_id] * fill
                features["attention_mask"] = (
                    [1] * length if s.attend_to_expansion_tokens else features["attention_mask"] + [0] * fill
                )
                if "token_type_ids" in features:
                    features["token_type_ids"] += [0] * fill
                keep = np.ones(length, dtype=bool)
            elif query:
                keep = np.ones(len(ids), dtype=bool)
            else:
                keep = ~np.isin(ids, self.skiplist)
            out.append(TokenRow({**features, "keep": keep}, len(features["input_ids"]), row.truncated))
        return out

    def _collate(self, rows: Sequence[TokenRow]) -> dict[str, torch.Tensor]:
        names = [k for k in rows[0].tokens if k != "keep"]
        pads = {"input_ids": self.pad_id, "attention_mask": 0, "token_type_ids": 0}
        return pad_features([r.tokens for r in rows], names, pads)

    @torch.inference_mode()
    def vectors_rows(self, rows: Sequence[TokenRow]) -> list[np.ndarray]:
        """One forward pass over ``rows`` (queries, documents or both) padded together: each row's kept token
        vectors, projected and normalized, ``(T_i, D)`` float32 (what an engine runs)."""
        features = self._collate(rows)
        # an expanded query's masked positions give vectors: the padded forward computes them
        expanded = any(r.tokens["attention_mask"].count(0) for r in rows)
        states = self.encoder.forward(features, all_positions=expanded).float()  # (B, T, H)
        vectors = torch.nn.functional.normalize(apply_dense(states, self.projections), dim=-1).cpu().numpy()
        return [vectors[j, : r.length][r.tokens["keep"]].astype(np.float32) for j, r in enumerate(rows)]

    def encode(self, texts: Sequence[str], *, query: bool, batch_size: int = 32) -> list[np.ndarray]:
        """Token vectors of ``texts`` as queries or documents: ``(T_i, D)`` float32 each, in input order."""
        rows = self.tokenize_rows(check_texts(texts), query=query)
        return run_by_length(rows, batch_size, self.vectors_rows)

    def encode_queries(self, texts: Sequence[str], *, batch_size: int = 32) -> list[np.ndarray]:
        return self.encode(texts, query=True, batch_size=batch_size)

    def encode_documents(self, texts: Sequence[str], *, batch_size: int = 32) -> list[np.ndarray]:
        return self.encode(texts, query=False, batch_size=batch_size)

    def score(
        self, query: str, documents: Sequence[str], *, batch_size: int = 32, chunking: Chunking | None = None
    ) -> np.ndarray:
        """MaxSim (sum over the query's vectors) of ``query`` against each document, ``(N,)`` float32. Documents
        longer than their window are cut there, or with ``chunking`` scored window by window and aggregated."""
        (q,) = self.encode_queries(check_texts([query], "query"))
        docs = check_texts(documents, "documents")

        def maxsims(texts: list[str]) -> np.ndarray:
            return maxsim_scores(q, self.encode_documents(texts, batch_size=batch_size), reduce="sum")

        if chunking is None:
            return maxsims(docs)
        scores, _ = score_chunked(
            docs, maxsims, offsets=self.encoder.token_offsets, window=self.chunk_window(), chunking=chunking
        )
        return scores

    # -- the late-interaction interface (LateInteractionScorer, MultiVectorRetriever), as M3Encoder's ---------
    maxsim_reduce = "sum"  # ColBERT sums the query's best matches

    def multi_vectors(self, texts: Sequence[str], *, query: bool, batch_size: int = 32) -> list[np.ndarray]:
        """:meth:`encode`: the token vectors of ``texts`` as queries or documents."""
        return self.encode(texts, query=query, batch_size=batch_size)

    def rerank_scores(
        self, query: str, documents: Sequence[str], *, batch_size: int = 32, chunking: Chunking | None = None
    ) -> np.ndarray:
        """:meth:`score`: MaxSim of ``query`` against each document."""
        return self.score(query, documents, batch_size=batch_size, chunking=chunking)
