"""Cross-encoder: scores (query, document) pairs jointly with a sequence-classification head."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from embedrank.errors import InvalidInputError, ModelKindError, UnsupportedModelError
from embedrank.math.ranking import RankedResult, rank_scores
from embedrank.models.adapters import Adapters, adapter_folders, attach_adapters
from embedrank.models.batching import PROGRESS_THRESHOLD
from embedrank.models.checks import check_max_seq_length, check_texts
from embedrank.models.chunking import Chunking, score_chunked
from embedrank.models.llm_reranker import YesNoTokenizer
from embedrank.models.tokens import TextTokens, Tokenized, TokenizesText, TokenRow, with_adapter
from embedrank.registry import ModelSpec, resolve
from embedrank.runtime.backends import Head, Runtime, RuntimeFacts, TorchRuntime, with_adapters
from embedrank.runtime.exports import load_transformer, runs_on
from embedrank.types import ModelOutput

_ACTIVATIONS = {
    "Sigmoid": torch.sigmoid,
    "Identity": lambda x: x,
    "Tanh": torch.tanh,
}


def default_activation(config: Any) -> str:
    """The activation sentence-transformers' CrossEncoder applies for this config.

    It reads ``config.sentence_transformers["activation_fn"]`` (or the older
    ``sbert_ce_default_activation_function``); without either, sigmoid for one label, identity otherwise.
    """
    path = None
    st_cfg = getattr(config, "sentence_transformers", None)
    if isinstance(st_cfg, dict):
        path = st_cfg.get("activation_fn")
    path = path or getattr(config, "sbert_ce_default_activation_function", None)
    if path:
        name = str(path).rsplit(".", 1)[-1]
        if name in _ACTIVATIONS:
            return name
    return "Sigmoid" if getattr(config, "num_labels", 1) == 1 else "Identity"


# label names that mean "relevant" in classifiers with several labels (monoBERT-style, NLI models)
RELEVANCE_NAMES = ("relevant", "relevance", "yes", "true", "positive", "entailment")


def relevance_label(config: Any) -> int | None:
    """Which label of a classifier is relevance: the only one for one label; else the label whose name
    (``id2label``) is one of :data:`RELEVANCE_NAMES`; else label 1 of two (``[not relevant, relevant]``, as
    monoBERT); else None (the labels say nothing about relevance).

    >>> from types import SimpleNamespace as C
    >>> relevance_label(C(num_labels=3, id2label={0: "contradiction", 1: "entailment", 2: "neutral"}))
    1
    >>> relevance_label(C(num_labels=2, id2label={0: "LABEL_0", 1: "LABEL_1"})), relevance_label(C(num_labels=3))
    (1, None)
    """
    count = int(getattr(config, "num_labels", 1))
    if count == 1:
        return 0
    names = {int(i): str(n).lower() for i, n in (getattr(config, "id2label", None) or {}).items()}
    named = [i for i, name in names.items() if name in RELEVANCE_NAMES]
    if len(named) == 1:
        return named[0]
    return 1 if count == 2 else None


class CrossEncoder(TokenizesText, RuntimeFacts):
    """A reranker: any Hugging Face sequence-classification model, or a causal LM scored by the probability
    of "yes" after its prompt template (:mod:`embedrank.models.llm_reranker`, Qwen3-Reranker's form)."""

    def __init__(
        self,
        spec: ModelSpec,
        model: torch.nn.Module | Runtime,
        tokenizer: Any,
        *,
        device: str | torch.device = "cpu",
        max_seq_length: int | None = None,
        padding_free: bool | None = None,
        config: Any = None,
    ) -> None:
        self.spec = spec
        self.device = torch.device(device)
        if isinstance(model, torch.nn.Module):
            self.runtime: Runtime = TorchRuntime(model.to(device), tokenizer, "classifier", padding_free=padding_free)
            self.config = config if config is not None else model.config
        else:
            if config is None:
                raise ValueError("a CrossEncoder on an exported runtime needs the model's transformers config")
            self.runtime, self.config = model, config
        self.text_tokens = TextTokens(tokenizer, max_length=max_seq_length or spec.max_seq_length)
        self.activation = default_activation(self.config)

    @classmethod
    def from_pretrained(cls, model_id: str, *, trust_remote_code: bool = False, **options: Any) -> CrossEncoder:
        """Load a cross-encoder by local path or hub id; ``options`` are those of :meth:`from_spec`.

        Raises:
            ModelNotFoundError, NotAModelError: the id does not lead to a model.
            UnsupportedModelError: the model needs its own Python code and ``trust_remote_code`` is False
                (the default: a model's code runs only when you opt in), or uses a module embedrank does not run.
            ModelKindError: the model has no sequence-classification head (an embedding model).
        """
        return cls.from_spec(resolve(model_id, trust_remote_code=trust_remote_code), **options)

    @classmethod
    def from_spec(
        cls,
        spec: ModelSpec,
        *,
        backend: str | None = None,
        precision: str | None = None,
        calibration: Sequence[str] | str | Path | None = None,
        cache_dir: str | Path | None = None,
        device: str = "cpu",
        max_seq_length: int | None = None,
        streams: int = 1,
        adapters: Adapters = None,
    ) -> CrossEncoder:
        """Load an already resolved model (:func:`~embedrank.registry.resolve`); ``backend``,
        ``precision``, ``calibration``, ``cache_dir``, ``streams`` and ``adapters`` (LoRA adapters over the
        model, each with the classification head it saved, PEFT's ``modules_to_save``) as in
        :meth:`Encoder.from_spec <embedrank.models.encoder.Encoder.from_spec>` (int8 calibrates on (query,
        passage) pairs cut from the calibration texts). :meth:`score`'s ``adapter`` picks one per call.

        Raises:
            ModelKindError: the model has no sequence-classification head.
            InvalidInputError: an unknown backend, or a precision the backend does not run; an adapter folder
                that holds no adapter.
            UnsupportedModelError: an adapter that is no LoRA one, or fits another model; adapters on an LLM
                reranker.
        """
        check_max_seq_length(max_seq_length)
        from transformers import AutoConfig

        if spec.kind != "cross-encoder":
            loader = "SparseEncoder" if spec.kind == "sparse" else "Encoder"
            raise ModelKindError(
                f"model {spec.model_id!r} is a {spec.kind} model, not a cross-encoder (its config.json names no "
                f"*ForSequenceClassification architecture); load it with {loader}.from_pretrained"
                + ("" if spec.kind == "sparse" else ", or rerank with it through BiEncoderScorer")
            )
        max_len = max_seq_length or spec.max_seq_length
        device, backend, precision = runs_on(device, backend, precision, spec=spec)
        folders = adapter_folders(spec.path, adapters)
        if folders and spec.scoring == "yes-no":
            raise UnsupportedModelError(
                f"model {spec.model_id!r} is an LLM reranker (scored by its answer's first token): adapters apply to "
                "sequence-classification cross-encoders"
            )
        runs: dict[str, Any] = dict(
            device=device,
            max_seq_length=max_len,
            calibration=calibration,
            cache_dir=cache_dir,
            # an LLM reranker reads pairs through its prompt template: int8 calibrates on templated pairs too
            wrap_tokenizer=YesNoTokenizer if spec.scoring == "yes-no" else None,
            streams=streams,
        )
        head: Head = "yes-no" if spec.scoring == "yes-no" else "classifier"
        tokenizer, model = load_transformer(spec, head, backend=backend, precision=precision, **runs)
        config = getattr(model, "config", None) or AutoConfig.from_pretrained(
            spec.path, trust_remote_code=spec.trust_remote_code
        )
        if spec.scoring == "yes-no":  # an LLM reranker: one score, P(yes) by the sigmoid
            config = copy.copy(config)
            config.num_labels = 1
        encoder = cls(spec, model, tokenizer, device=device, max_seq_length=max_len, config=config)

        def load_adapted(adapted: ModelSpec, backend: str, precision: str) -> Runtime:
            return load_transformer(adapted, head, backend=backend, precision=precision, **runs)[1]  # type: ignore[return-value]

        encoder.runtime = attach_adapters(encoder.runtime, spec, folders, load_adapted)
        return encoder

    @property
    def model_id(self) -> str:
        return self.spec.model_id

    @property
    def num_labels(self) -> int:
        return int(self.config.num_labels)  # type: ignore[union-attr, arg-type]

    def __repr__(self) -> str:
        return (
            f"CrossEncoder({self.model_id!r}, num_labels={self.num_labels}, activation={self.activation}, "
            f"backend={self.backend}, precision={self.precision})"
        )

    def tokenize(self, queries: Sequence[str], documents: Sequence[str], *, truncate: bool = True) -> Tokenized:
        """Pairs -> padded features ``(B, T)``; truncation is ``longest_first`` at ``max_seq_length``."""
        return self.text_tokens.batch(queries, documents, truncate=truncate)

    def count_tokens(self, queries: Sequence[str], documents: Sequence[str]) -> list[int]:
        """Untruncated token count of each (query, document) pair, to refuse over-long input before compute."""
        return self.text_tokens.lengths(queries, documents)

    def score_batch(self, pairs: Sequence[tuple[str, str]], *, adapter: str | None = None) -> ModelOutput:
        """Tokenize and score one batch of pairs in input order (``adapter``: the LoRA adapter they run with)."""
        return self.score_rows(self.tokenize_rows(pairs, adapter=adapter))

    def tokenize_rows(self, pairs: Sequence[tuple[str, str]], *, adapter: str | None = None) -> list[TokenRow]:
        """(query, document) pairs tokenized once, unpadded (``longest_first`` at ``max_seq_length``), each carrying
        the index of the LoRA adapter ``adapter`` it runs with (:meth:`adapter_index`).

        Raises:
            InvalidInputError: the model has no adapter named ``adapter``.
        """
        index = self.adapter_index(adapter)
        queries, documents = [q for q, _ in pairs], [d for _, d in pairs]
        rows = self.text_tokens.rows(queries, documents)
        return with_adapter(rows, index)

    def score_rows(self, rows: Sequence[TokenRow], *, apply_activation: bool = True) -> ModelOutput:
        """Relevance scores ``(B,)`` of rows from :meth:`tokenize_rows`, padded together (:meth:`relevance`), each
        with its row's adapter (rows of different adapters: one pass on torch, one per adapter on an exported
        backend); what the serving engine runs per pass. ``apply_activation=False``: a one-label model's raw
        scores, which :meth:`activate` turns into the scores (the engine batches requests that differ in it)."""
        batch = self.text_tokens.collate(rows)
        features = with_adapters(batch.features, [r.adapter for r in rows])
        scores = self.forward(features, apply_activation=apply_activation)
        return ModelOutput(self.relevance(scores), batch.token_counts, batch.truncated)

    def activate(self, scores: np.ndarray) -> np.ndarray:
        """The model's activation (:func:`default_activation`) on raw one-label scores ``(N,)``, float32."""
        return _ACTIVATIONS[self.activation](torch.from_numpy(np.asarray(scores, dtype=np.float32))).numpy()

    def relevance(self, scores: np.ndarray) -> np.ndarray:
        """One relevance score per pair: ``(N,)`` scores as they are; ``(N, L)`` logits of several labels ->
        the softmax probability of the relevance label (:func:`relevance_label`, e.g. monoBERT's label 1).

        Raises:
            ModelKindError: several labels and none of them is relevance (the message lists them).
        """
        if scores.ndim == 1:
            return scores
        label = relevance_label(self.config)
        if label is None:
            raise ModelKindError(
                f"model {self.model_id!r} has {self.num_labels} labels "
                f"({sorted(getattr(self.config, 'id2label', {}).values())}) and none names relevance "
                f"({', '.join(RELEVANCE_NAMES)}); score_pairs returns all of them"
            )
        probabilities = np.exp(scores - scores.max(axis=1, keepdims=True))
        return (probabilities / probabilities.sum(axis=1, keepdims=True))[:, label].astype(np.float32)

    @torch.inference_mode()
    def forward(self, features: dict[str, torch.Tensor], *, apply_activation: bool = True) -> np.ndarray:
        """Features -> scores: ``(B,)`` for one label, ``(B, L)`` otherwise."""
        logits = self.runtime(features)  # (B, L)
        if apply_activation:
            logits = _ACTIVATIONS[self.activation](logits)
        if logits.shape[-1] == 1:
            logits = logits[:, 0]
        return logits.float().cpu().numpy()

    def score_pairs_with_stats(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        batch_size: int = 32,
        apply_activation: bool = True,
        show_progress: bool | None = None,
        truncate: bool = True,
        adapter: str | None = None,
    ) -> ModelOutput:
        """Scores ``(N,)`` (``(N, L)`` for several labels) in input order, with per-pair token counts and
        truncation flags; ``adapter`` names the LoRA adapter the pairs run with (:attr:`adapters`; None: the base
        model).

        Raises:
            InvalidInputError: no pairs, a pair that is not two strings, or an adapter the model lacks.
        """
        index = self.adapter_index(adapter)
        items = list(pairs)
        if not items:
            raise InvalidInputError("pairs is empty; pass at least one (query, document) pair")
        for i, p in enumerate(items):
            if not (isinstance(p, tuple | list) and len(p) == 2 and all(isinstance(x, str) for x in p)):
                raise InvalidInputError(f"pairs[{i}] must be a (query, document) pair of strings")
        if batch_size < 1:
            raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}", param="batch_size")
        scores: np.ndarray | None = None
        counts = [0] * len(items)
        truncated = [False] * len(items)
        show = len(items) >= PROGRESS_THRESHOLD if show_progress is None else show_progress
        batches = self.text_tokens.batches(
            [q for q, _ in items],
            [d for _, d in items],
            batch_size=batch_size,
            truncate=truncate,
            param="pairs",
            ahead=self.on_gpu,
        )
        with tqdm(total=len(items), desc="Scoring", unit="pair", disable=not show) as bar:
            for positions, batch in batches:
                out = self.forward(with_adapters(batch.features, index), apply_activation=apply_activation)
                if scores is None:
                    scores = np.empty((len(items), *out.shape[1:]), dtype=np.float32)
                scores[positions] = out
                for j, pos in enumerate(positions):
                    counts[pos] = batch.token_counts[j]
                    truncated[pos] = batch.truncated[j]
                bar.update(len(positions))
        assert scores is not None
        return ModelOutput(scores, counts, truncated)

    def score_pairs(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        batch_size: int = 32,
        apply_activation: bool = True,
        adapter: str | None = None,
    ) -> np.ndarray:
        """Score (query, document) pairs; sigmoid for one label unless ``apply_activation=False``; ``adapter`` as in
        :meth:`score_pairs_with_stats`."""
        return self.score_pairs_with_stats(
            pairs, batch_size=batch_size, apply_activation=apply_activation, adapter=adapter
        ).values

    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Character span of each token of each text, special tokens excluded (for splitting long texts)."""
        return self.text_tokens.offsets(texts)

    def chunk_window(self, query: str) -> int:
        """Document tokens that fit one forward pass next to ``query`` (at least 16; a longer query is then
        truncated with the pair, longest first)."""
        special = self.text_tokens.special(pair=True)
        return max(16, self.max_seq_length - special - len(self.token_offsets([query])[0]))

    def score(
        self,
        query: str,
        documents: Sequence[str],
        *,
        batch_size: int = 32,
        apply_activation: bool = True,
        chunking: Chunking | None = None,
        adapter: str | None = None,
    ) -> np.ndarray:
        """Score each document against ``query``; ``(N,)`` float32 in input order: the relevance score
        (:meth:`relevance`; for several labels, the probability of the relevance label). ``adapter`` names the
        LoRA adapter (with its own head) that scores them (:attr:`adapters`; None: the base model).

        By default a document longer than the model's window is truncated, as sentence-transformers does.
        With ``chunking`` (:class:`~embedrank.models.chunking.Chunking`), it is split into overlapping
        windows that fit next to the query, every window is scored (all documents' windows share batches),
        and the window scores are aggregated (``max`` by default).
        """
        docs = check_texts(documents, "documents")
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a string, got {type(query).__name__}")

        def relevance(texts: Sequence[str]) -> np.ndarray:
            pairs = [(query, t) for t in texts]
            scored = self.score_pairs(pairs, batch_size=batch_size, apply_activation=apply_activation, adapter=adapter)
            return self.relevance(scored)

        if chunking is None:
            return relevance(docs)
        scores, _ = score_chunked(
            docs,
            relevance,
            offsets=self.token_offsets,
            window=self.chunk_window(query),
            chunking=chunking,
        )
        return scores

    def rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        *,
        chunking: Chunking | None = None,
        adapter: str | None = None,
    ) -> pd.DataFrame:
        """Documents sorted by score, highest first, ties broken by input index (``chunking`` and ``adapter`` as in
        :meth:`score`).

        Returns a DataFrame with columns ``index``, ``score``, ``text``.
        """
        scores = self.score(query, documents, chunking=chunking, adapter=adapter)
        return ranked_frame(rank_scores(scores, top_k), documents)


def ranked_frame(results: list[RankedResult], documents: Sequence[str]) -> pd.DataFrame:
    """Turn ranked results into the DataFrame notebooks show."""
    return pd.DataFrame(
        {
            "index": [r.index for r in results],
            "score": [r.score for r in results],
            "text": [documents[r.index] for r in results],
        }
    )
