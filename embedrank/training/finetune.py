"""Fine-tune a bi-encoder or a SPLADE on a collection's training judgments with sentence-transformers' trainers.

The recipe (:func:`finetune`), the same for both kinds of model:

1. (query, relevant document) pairs from the training split's qrels; a seeded ``validation_fraction`` of
   the training *queries* (with all their pairs) is held out, never trained on.
2. Hard negatives for each pair, mined from the collection's corpus with the model being trained
   (``sentence_transformers.util.mine_hard_negatives``) with the model being trained (a SPLADE's with
   ``mining_model``, a dense model, MiniLM unless named): the highest-ranked documents that are not judged
   relevant to that query, skipping the top ``skip_top`` and any whose similarity comes within
   ``relative_margin`` of the positive's (likely unjudged positives). Embeddings are cached on disk.
   With ``window`` (dense models), each positive and negative document is then replaced by its window of
   that many tokens that the model embeds nearest the query (:func:`to_windows`), for a model that will
   score documents by their best window (``eval/run.py --dense-windows --dense-window``).
3. ``MultipleNegativesRankingLoss`` (in-batch negatives plus the mined ones; the cached variant with
   ``mini_batch_size`` when ``cached_loss``), batches without duplicate texts. A SPLADE trains with
   ``SpladeLoss``: the sparse version of that loss plus FLOPS regularizers on query and document vectors
   (``query_regularizer_weight``, ``document_regularizer_weight``) that keep the vectors sparse.
4. Validation nDCG@10 on the held-out queries (``InformationRetrievalEvaluator``, over their judged
   documents plus ``validation_distractors`` other corpus documents), evaluated every ``eval_steps``;
   early stopping after ``patience`` evaluations without improvement, and the best checkpoint is kept.
5. The best model is saved in sentence-transformers' format: ``Encoder.from_pretrained(output)`` (or
   ``SparseEncoder.from_pretrained``), ``eval/run.py --model output`` (``--sparse-model``) and the service
   load it as any local model. ``embedrank_training.json``
   next to it records the configuration and the validation history, ``validation_queries.txt`` the ids of the
   held-out queries (``eval/run.py --split train --query-ids``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedrank.errors import InvalidInputError
from embedrank.models.chunking import require_fits
from embedrank.registry import DEFAULT_EMBEDDING_MODEL, resolve, weights_fingerprint
from embedrank.retrieval.cache import default_cache_dir
from embedrank.retrieval.data import BeirDataset, doc_text, load_beir
from embedrank.runtime.devices import resolve_device

VALIDATION_QUERIES = "validation_queries.txt"  # beside the model: the held-out query ids, one per line


@dataclasses.dataclass(frozen=True, kw_only=True)
class FinetuneConfig:
    model: str = DEFAULT_EMBEDDING_MODEL
    epochs: float = 2.0
    max_steps: int = -1  # > 0: stop after this many steps (quick runs, tests)
    batch_size: int = 64
    learning_rate: float = 3e-5
    warmup_ratio: float = 0.1
    negatives: int = 1  # hard negatives per pair
    skip_top: int = 3  # ranks skipped before negatives are taken (the very top is often relevant)
    relative_margin: float = 0.05  # a negative must score below (1 - margin) x the positive's similarity
    cached_loss: bool = False  # CachedMultipleNegativesRankingLoss: large batches in small memory
    mini_batch_size: int = 16
    validation_fraction: float = 0.1
    validation_distractors: int = 1000
    eval_steps: int = 10
    patience: int = 3
    max_seq_length: int | None = None  # None: the model's own
    seed: int = 42
    mining_model: str | None = None  # mines the negatives; None: the model itself (a SPLADE: MiniLM)
    query_regularizer_weight: float = 5e-5  # SPLADE only: FLOPS regularizer on query vectors
    document_regularizer_weight: float = 3e-5  # SPLADE only: FLOPS regularizer on document vectors
    window: int | None = None  # dense only: train on each document's window of this many tokens nearest the query
    device: str = "cpu"  # "cpu", "cuda" (the first visible GPU: mixed precision, bf16 where the GPU has it) or "auto"


@dataclasses.dataclass(frozen=True)
class FinetuneResult:
    output: Path
    best_validation_ndcg: float | None
    history: list[dict[str, float]]
    steps: int
    seconds: float


def split_queries(query_ids: list[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """``(train, validation)``: a seeded ``fraction`` of the sorted ids held out (at least one each).

    >>> split_queries(["a", "b", "c", "d", "e"], 0.4, 0)
    (['a', 'b', 'c'], ['d', 'e'])
    """
    if not 0 < fraction < 1:
        raise InvalidInputError(f"validation_fraction must be in (0, 1), got {fraction}")
    ids = sorted(query_ids)
    if len(ids) < 2:
        raise InvalidInputError("need at least 2 training queries to hold some out for validation")
    n_val = min(len(ids) - 1, max(1, round(fraction * len(ids))))
    held = set(np.random.default_rng(seed).choice(len(ids), size=n_val, replace=False).tolist())
    return [q for i, q in enumerate(ids) if i not in held], [q for i, q in enumerate(ids) if i in held]


def training_pairs(ds: BeirDataset, query_ids: list[str]) -> dict[str, list[str]]:
    """Columns ``anchor`` (query text) and ``positive`` (document text): one row per judged relevant pair."""
    anchors, positives = [], []
    for q in query_ids:
        for doc_id, grade in sorted(ds.qrels.get(q, {}).items()):
            if grade > 0 and doc_id in ds.corpus and q in ds.queries:
                anchors.append(ds.queries[q])
                positives.append(doc_text(ds.corpus[doc_id]))
    return {"anchor": anchors, "positive": positives}


def to_windows(pairs: Any, model: Any, window: int) -> Any:
    """``pairs`` with every document column (positive, negative, negative_N) replaced by the document's window
    of ``window`` tokens (32 overlap, or half the window if less) that ``model`` embeds nearest the row's
    anchor; a document that fits one window stays whole."""
    from embedrank.math.chunks import best_window_rows
    from embedrank.models.chunking import Chunking, split_windows
    from embedrank.models.tokens import text_offsets

    columns = [c for c in pairs.column_names if c != "anchor"]
    documents = sorted({text for c in columns for text in pairs[c]})
    split = split_windows(
        documents, lambda texts: text_offsets(model.tokenizer, texts), window=window, chunking=Chunking(window=window)
    )
    encode = dict(batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    window_vectors = model.encode(split.texts, **encode)
    query_vectors = model.encode(list(pairs["anchor"]), **encode)
    number = {text: i for i, text in enumerate(documents)}
    for column in columns:
        rows = np.array([number[text] for text in pairs[column]])
        picked = best_window_rows(query_vectors, window_vectors, split.owners, rows)
        pairs = pairs.remove_columns(column).add_column(column, [split.texts[i] for i in picked])
    return pairs.select_columns(["anchor", *columns])


def validation_evaluator(
    ds: BeirDataset, query_ids: list[str], distractors: int, seed: int, *, sparse: bool = False
) -> Any:
    """nDCG@10 etc. of the held-out queries over their judged documents plus ``distractors`` others (the
    sparse evaluator for a SPLADE)."""
    from sentence_transformers.evaluation import InformationRetrievalEvaluator
    from sentence_transformers.sparse_encoder.evaluation import SparseInformationRetrievalEvaluator

    judged = {d for q in query_ids for d in ds.qrels.get(q, {}) if d in ds.corpus}
    others = sorted(set(ds.corpus) - judged)
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(others), size=min(distractors, len(others)), replace=False)
    docs = sorted(judged) + [others[i] for i in sorted(picked)]
    kind = SparseInformationRetrievalEvaluator if sparse else InformationRetrievalEvaluator
    return kind(
        queries={q: ds.queries[q] for q in query_ids},
        corpus={d: doc_text(ds.corpus[d]) for d in docs},
        relevant_docs={q: {d for d, g in ds.qrels[q].items() if g > 0} for q in query_ids},
        name="validation",
        ndcg_at_k=[10],
        mrr_at_k=[10],
        accuracy_at_k=[1],
        precision_recall_at_k=[10, 100],
        map_at_k=[100],
        show_progress_bar=False,
        batch_size=64,
    )


@dataclasses.dataclass(frozen=True)
class _Kind:
    """What differs between training a dense bi-encoder and a SPLADE: sentence-transformers' classes."""

    model: Any
    trainer: Any
    arguments: Any
    loss: Any
    metric: str  # the validation evaluator's nDCG@10 in the trainer's log


def _kind(path: str, sparse: bool, cfg: FinetuneConfig, device: str) -> _Kind:
    if sparse:
        from sentence_transformers.sparse_encoder import (
            SparseEncoder,
            SparseEncoderTrainer,
            SparseEncoderTrainingArguments,
        )
        from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss

        model = SparseEncoder(path, device=device)
        loss = SpladeLoss(
            model,
            SparseMultipleNegativesRankingLoss(model),
            query_regularizer_weight=cfg.query_regularizer_weight,
            document_regularizer_weight=cfg.document_regularizer_weight,
        )
        return _Kind(model, SparseEncoderTrainer, SparseEncoderTrainingArguments, loss, "eval_validation_dot_ndcg@10")
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.losses import CachedMultipleNegativesRankingLoss, MultipleNegativesRankingLoss

    dense = SentenceTransformer(path, device=device)
    loss = (
        CachedMultipleNegativesRankingLoss(dense, mini_batch_size=cfg.mini_batch_size)
        if cfg.cached_loss
        else MultipleNegativesRankingLoss(dense)
    )
    return _Kind(
        dense, SentenceTransformerTrainer, SentenceTransformerTrainingArguments, loss, "eval_validation_cosine_ndcg@10"
    )


def training_device(device: str) -> str:
    """The device ``device`` names (:func:`~embedrank.runtime.devices.resolve_device`), as the trainer can use
    it: the CPU or the first visible GPU (the trainer picks ``cuda:0``; another GPU is chosen with
    ``CUDA_VISIBLE_DEVICES``).

    Raises:
        InvalidInputError: a device this machine lacks, or a GPU other than the first visible one.
    """
    resolved = resolve_device(device)
    if resolved not in ("cpu", "cuda:0"):
        raise InvalidInputError(
            f"device {device!r}: training runs on the first visible GPU; to train on another, run with "
            f"CUDA_VISIBLE_DEVICES={resolved.split(':')[1]} and device 'cuda'",
            param="device",
        )
    return resolved


def _mining_cache(model_path: str) -> Path:
    """Where ``mine_hard_negatives`` caches embeddings for this model's weights. It keys its files by the
    texts and the model's name, not its weights; the folder adds the weights, so a model trained again in
    place does not reuse vectors from before."""
    key = hashlib.sha256(f"{model_path}|{weights_fingerprint(model_path)}".encode()).hexdigest()
    return default_cache_dir() / "mining" / key[:24]


def finetune(
    dataset: str | Path | BeirDataset,
    output: str | Path,
    config: FinetuneConfig | None = None,
    *,
    data_dir: str | None = None,
) -> FinetuneResult:
    """Fine-tune ``config.model`` on ``dataset``'s training split and save the best model to ``output``
    (see the module docstring). Needs the ``train`` extra (``accelerate``)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.training_args import BatchSamplers
    from sentence_transformers.util import mine_hard_negatives
    from transformers import EarlyStoppingCallback, set_seed

    cfg = config or FinetuneConfig()
    device = training_device(cfg.device)  # before any work: a GPU this machine lacks fails at once
    start = time.perf_counter()
    ds = dataset if isinstance(dataset, BeirDataset) else load_beir(dataset, split="train", data_dir=data_dir)
    out = Path(output)
    set_seed(cfg.seed)
    train_q, val_q = split_queries([q for q in ds.qrels if q in ds.queries], cfg.validation_fraction, cfg.seed)
    pairs = Dataset.from_dict(training_pairs(ds, train_q))
    if len(pairs) < 2:
        raise InvalidInputError(f"{ds.name}: fewer than 2 relevant (query, document) pairs to train on")
    spec = resolve(cfg.model)
    if spec.kind not in ("embedding", "m3", "sparse"):
        raise InvalidInputError(f"{cfg.model} is a {spec.kind} model; this trains embedding and SPLADE models")
    sparse = spec.kind == "sparse"
    if cfg.window is not None and (sparse or cfg.window < 1):
        raise InvalidInputError(
            f"window trains a dense model on windows of >= 1 tokens; got {cfg.window} for {cfg.model}"
        )
    kind = _kind(spec.path, sparse, cfg, device)
    model = kind.model
    if cfg.max_seq_length:
        model.max_seq_length = cfg.max_seq_length
    require_fits(cfg.window, model.max_seq_length - model.tokenizer.num_special_tokens_to_add(pair=False))
    corpus_texts = [doc_text(ds.corpus[d]) for d in sorted(ds.corpus)]
    if cfg.negatives > 0:
        miner_path = resolve(cfg.mining_model or (DEFAULT_EMBEDDING_MODEL if sparse else cfg.model)).path
        miner = model if miner_path == spec.path else SentenceTransformer(miner_path, device=device)
        pairs = mine_hard_negatives(
            pairs,
            miner,
            corpus=corpus_texts,
            range_min=cfg.skip_top,
            range_max=cfg.skip_top + 50,
            relative_margin=cfg.relative_margin,
            num_negatives=cfg.negatives,
            sampling_strategy="top",
            output_format="n-tuple" if cfg.negatives > 1 else "triplet",
            batch_size=64,
            cache_folder=str(_mining_cache(miner_path)),
            verbose=True,
        )
    if cfg.window is not None:
        pairs = to_windows(pairs, model, cfg.window)
    evaluator = validation_evaluator(ds, val_q, cfg.validation_distractors, cfg.seed, sparse=sparse)
    metric = kind.metric
    args = kind.arguments(
        output_dir=str(out / "checkpoints"),
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        warmup_ratio=cfg.warmup_ratio,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        eval_strategy="steps",
        eval_steps=cfg.eval_steps,
        save_strategy="steps",
        save_steps=cfg.eval_steps,
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model=metric,
        greater_is_better=True,
        logging_steps=cfg.eval_steps,
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=device == "cpu",
        bf16=device != "cpu" and torch.cuda.is_bf16_supported(),  # mixed precision: weights and optimizer in fp32
        fp16=device != "cpu" and not torch.cuda.is_bf16_supported(),
        report_to="none",
        dataloader_num_workers=0,
    )
    trainer = kind.trainer(
        model=model,
        args=args,
        train_dataset=pairs,
        loss=kind.loss,
        evaluator=evaluator,
        callbacks=[EarlyStoppingCallback(early_stopping_patience=cfg.patience)],
    )
    trainer.train()
    model.save_pretrained(str(out))
    history = [
        {k: float(v) for k, v in entry.items() if isinstance(v, (int, float))}
        for entry in trainer.state.log_history
        if metric in entry
    ]
    best = trainer.state.best_metric
    seconds = round(time.perf_counter() - start, 1)
    record = {
        "base_model": cfg.model,
        "dataset": ds.name,
        "train_queries": len(train_q),
        "validation_queries": len(val_q),
        "train_rows": len(pairs),
        "config": dataclasses.asdict(cfg),
        "best_validation_ndcg@10": best,
        "best_checkpoint": trainer.state.best_model_checkpoint,
        "steps": trainer.state.global_step,
        "history": history,
        "seconds": seconds,
    }
    (out / "embedrank_training.json").write_text(json.dumps(record, indent=2))
    (out / VALIDATION_QUERIES).write_text("".join(f"{q}\n" for q in val_q), encoding="utf-8")  # never trained on
    return FinetuneResult(out, best, history, trainer.state.global_step, seconds)
