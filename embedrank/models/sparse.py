"""SPLADE sparse encoder: text -> one weight per vocabulary entry, as sentence-transformers' ``SparseEncoder``
with ``MLMTransformer`` and ``SpladePooling("max")``.

A masked language model gives logits over the vocabulary at every token; SPLADE keeps, per vocabulary
entry, the largest ``log(1 + ReLU(logit))`` over the text's tokens (:func:`~embedrank.math.sparse.splade_max`),
so a text is a sparse vector of the terms it contains and the terms the model expands it to. Vectors come
back as ``scipy.sparse.csr_matrix`` rows (``(N, V)``, float32); :func:`~embedrank.math.sparse.sparse_scores`
scores them by dot product.

Loads a sentence-transformers sparse layout (``modules.json`` with ``MLMTransformer`` and ``SpladePooling``)
or a plain ``*ForMaskedLM`` checkpoint. Inference runs on torch; texts are batched by token length, and a
batch's logits (``batch x tokens x vocabulary``) are pooled at once, so ``batch_size`` bounds the memory.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from embedrank.errors import UnsupportedModelError
from embedrank.math.sparse import max_rows, prune_rows, to_csr
from embedrank.models.adapters import Adapters, adapter_folders, attach_adapters
from embedrank.models.checks import check_max_seq_length, check_texts
from embedrank.models.chunking import Chunking, ChunkPlan, document_flags, require_max, summed_counts
from embedrank.models.prompts import with_prompt
from embedrank.models.router import Branched, on_branch
from embedrank.models.tokens import TextTokens, TokenizesText, TokenRow, TokenSpan, with_adapter
from embedrank.registry import ModelSpec, resolve
from embedrank.runtime.backends import ChoosesAdapters, Runtime, TorchRuntime, with_adapters
from embedrank.runtime.exports import check_streams, load_transformer, runs_on
from embedrank.runtime.static import static_tokenizer
from embedrank.types import ModelOutput

_MLM = ("MLMTransformer", "Transformer")  # the older and the newer name of the fill-mask transformer module
_POOLING = "SpladePooling"


def _sparse_layout(path: Path) -> None:
    """Check a sentence-transformers sparse layout, if ``path`` has one (the registry reads its max length).

    Raises:
        UnsupportedModelError: modules other than ``MLMTransformer`` and ``SpladePooling("max")`` with ReLU.
    """
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    if len(kinds) != 2 or kinds[0] not in _MLM or kinds[1] != _POOLING:
        raise UnsupportedModelError(
            f"{path}: a sparse encoder of modules {kinds} is not supported; supported: a masked-LM "
            f"Transformer (or MLMTransformer) and {_POOLING}"
        )
    pooling_file = path / modules[1]["path"] / "config.json"
    pooling = json.loads(pooling_file.read_text(encoding="utf-8")) if pooling_file.is_file() else {}
    if pooling.get("pooling_strategy", "max") != "max" or pooling.get("activation_function", "relu") != "relu":
        raise UnsupportedModelError(
            f"{path}: SpladePooling {pooling} is not supported; supported: max pooling of log(1 + ReLU)"
        )


@dataclasses.dataclass(frozen=True)
class TorchFacts:
    """What runs a SPLADE model (the ``runtime`` facts the service reports): torch, in fp32."""

    backend: str = "torch"
    precision: str = "fp32"
    inference_precision: str = "f32"


class StaticSparse:
    """sentence-transformers' ``SparseStaticEmbedding`` (inference-free SPLADE's query side): one weight per
    vocabulary entry (IDF-like); a text's vector holds the weight of each token it contains, once."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight.float()  # (V,)
        self.config = dataclasses.make_dataclass("Config", [("vocab_size", int)])(int(self.weight.shape[0]))

    def __call__(self, features: dict[str, torch.Tensor]) -> np.ndarray:
        """``(B, V)`` float32: token presence (padding left out) times the weights, as sentence-transformers."""
        ids, mask = features["input_ids"], features["attention_mask"]
        presence = torch.zeros(ids.shape[0], self.weight.shape[0], dtype=torch.int64)
        presence.scatter_(1, ids, mask.to(torch.int64))
        return (presence * self.weight).float().numpy()


class SparseEncoder(TokenizesText, Branched, ChoosesAdapters):
    """A SPLADE model: :meth:`encode` texts to sparse vectors over the vocabulary (on torch, fp32). An
    inference-free SPLADE (a sentence-transformers ``Router``: a weight per vocabulary entry for queries, a
    masked LM for documents) is its document branch with the query branch in :attr:`branches`
    (:meth:`encode_query`, :meth:`encode_document`, ``encode(task=)``)."""

    runtime = TorchFacts()

    def __init__(self, spec: ModelSpec, model: Any, tokenizer: Any, *, max_seq_length: int | None = None) -> None:
        self.spec = spec
        self.model_id = spec.model_id
        self.model = model
        self.text_tokens = TextTokens(
            tokenizer, max_length=max_seq_length or spec.max_seq_length, lower_case=spec.do_lower_case
        )

    @classmethod
    def from_pretrained(
        cls, model_id: str, *, max_seq_length: int | None = None, trust_remote_code: bool = False, **options: Any
    ) -> SparseEncoder:
        """Load a SPLADE model by hub id, local path or bundled name (sentence-transformers' sparse layout or a
        masked LM); ``options`` as :meth:`from_spec`.

        Raises:
            UnsupportedModelError: not a masked LM, or sparse modules other than SPLADE's.
        """
        spec = resolve(model_id, trust_remote_code=trust_remote_code)
        return cls.from_spec(spec, max_seq_length=max_seq_length, **options)

    @classmethod
    def from_spec(
        cls,
        spec: ModelSpec,
        *,
        max_seq_length: int | None = None,
        backend: str | None = None,
        precision: str | None = None,
        calibration: Any = None,
        cache_dir: str | Path | None = None,
        device: str = "cpu",
        streams: int = 1,
        adapters: Adapters = None,
    ) -> SparseEncoder:
        """Load the weights of a resolved model (:func:`~embedrank.registry.resolve`) of kind ``sparse``.
        ``backend`` (``"torch"`` unless named: ``"openvino"``, ``"onnx"``) and ``precision`` choose what runs
        the masked LM; an exported graph includes SPLADE's pooling, so it hands back ``(B, V)`` weights.
        ``device``, ``streams`` and ``adapters`` (LoRA adapters over the masked LM) as :meth:`Encoder.from_spec
        <embedrank.models.encoder.Encoder.from_spec>` (``device``: torch only; ``streams``: OpenVINO only);
        :meth:`encode`'s ``adapter`` picks one per call.

        Raises:
            UnsupportedModelError: not a SPLADE model; adapters on an inference-free SPLADE (a Router) or an
                adapter that is no LoRA one, or fits another model.
            InvalidInputError: an adapter folder that holds no adapter.
        """
        check_max_seq_length(max_seq_length)
        if spec.kind != "sparse":
            raise UnsupportedModelError(
                f"{spec.model_id!r} is a {spec.kind} model, not a masked language model pooled as SPLADE "
                "(a sentence-transformers sparse layout, or a *ForMaskedLM checkpoint)"
            )
        _sparse_layout(Path(spec.path))  # refuses sparse modules other than SPLADE's
        folders = adapter_folders(spec.path, adapters)
        if folders and (spec.branches or spec.static):
            raise UnsupportedModelError(
                f"model {spec.model_id!r} is an inference-free SPLADE (a Router): adapters apply to one masked LM"
            )
        device, backend, precision = runs_on(device, backend, precision, static=spec.static is not None, spec=spec)
        if spec.static is not None:  # a weight per vocabulary entry, no transformer
            from safetensors.torch import load_file

            check_streams(streams, "torch", "fp32")  # a lookup in torch: one stream

            root = Path(spec.path, spec.static)
            weight = load_file(str(root / "model.safetensors"))["weight"]
            encoder = cls(spec, StaticSparse(weight), static_tokenizer(root), max_seq_length=max_seq_length)
        else:
            window = max_seq_length or spec.max_seq_length
            runs: dict[str, Any] = dict(
                device=device, max_seq_length=window, calibration=calibration, cache_dir=cache_dir, streams=streams
            )

            def load(adapted: ModelSpec, backend: str, precision: str | None) -> tuple[Any, Runtime]:
                tokenizer, model = load_transformer(adapted, "splade", backend=backend, precision=precision, **runs)
                if isinstance(model, torch.nn.Module):
                    return tokenizer, TorchRuntime(model.to(device), tokenizer, "splade")  # type: ignore[return-value]
                return tokenizer, model

            tokenizer, runtime = load(spec, backend or "torch", precision)
            runtime = attach_adapters(runtime, spec, folders, lambda adapted, b, p: load(adapted, b, p)[1])
            encoder = cls(spec, runtime, tokenizer, max_seq_length=max_seq_length)
            encoder.runtime = runtime  # type: ignore[assignment]
        options = {
            "backend": backend,
            "precision": precision,
            "calibration": calibration,
            "cache_dir": cache_dir,
            "device": device,
        }
        encoder.add_branches(
            partial(cls.from_spec, max_seq_length=max_seq_length, **options)
        )  # a Router's other branches
        return encoder

    @property
    def vocab_size(self) -> int:
        """``V``: the length of every sparse vector."""
        if isinstance(self.model, StaticSparse):
            return int(self.model.config.vocab_size)
        return int(json.loads(Path(self.spec.path, "config.json").read_text(encoding="utf-8"))["vocab_size"])

    def __repr__(self) -> str:
        return f"SparseEncoder({self.model_id!r}, vocab_size={self.vocab_size}, max_seq_length={self.max_seq_length})"

    @on_branch
    def encode_with_stats(
        self,
        texts: Sequence[str],
        *,
        task: str | None = None,
        batch_size: int = 16,
        top_k: int | None = None,
        truncate: bool = True,
        chunking: Chunking | None = None,
        adapter: str | None = None,
    ) -> tuple[sp.csr_matrix, list[int], list[bool]]:
        """The sparse vectors ``(N, V)`` in input order (only each text's ``top_k`` largest weights with
        ``top_k``), each text's token count (special tokens included) and whether it was truncated; ``task``
        picks a Router model's branch (``"query"``, ``"document"``; None: its default branch); ``adapter`` names
        the LoRA adapter the texts run with (:attr:`adapters`; None: the base model).

        With ``chunking``, a text longer than one forward pass is read window by window
        (:mod:`embedrank.models.chunking`; ``chunking.aggregate`` must be ``"max"``) and its vector holds each
        term's largest weight over all its windows (:func:`~embedrank.math.sparse.max_rows`): SPLADE's max
        over tokens, over every token of the text. Token counts are then summed over the windows, and
        ``truncated`` flags text the chunking bounds left out.

        Raises:
            InputTooLongError: ``truncate=False`` and a text is longer than ``max_seq_length`` tokens (with
                ``chunking``: than its bounds allow).
            InvalidInputError: ``chunking.aggregate`` is not ``"max"``; an adapter the model lacks.
        """
        texts = check_texts(texts)
        index = self.adapter_index(adapter)
        if chunking is not None:
            return self._encode_windows(
                texts, batch_size=batch_size, top_k=top_k, truncate=truncate, chunking=chunking, adapter=adapter
            )
        rows: list[sp.csr_matrix | None] = [None] * len(texts)
        counts, cut = [0] * len(texts), [False] * len(texts)
        for positions, batch in self.text_tokens.batches(texts, batch_size=batch_size, truncate=truncate):
            matrix = to_csr(self._weights(with_adapters(batch.features, index)), top_k)
            for k, i in enumerate(positions):
                rows[i], counts[i], cut[i] = matrix[k], batch.token_counts[k], batch.truncated[k]
        stacked = sp.vstack(rows, format="csr") if rows else sp.csr_matrix((0, self.vocab_size), dtype=np.float32)
        return stacked.astype(np.float32), counts, cut

    @on_branch
    def encode(
        self,
        texts: Sequence[str],
        *,
        task: str | None = None,
        batch_size: int = 16,
        top_k: int | None = None,
        truncate: bool = True,
        chunking: Chunking | None = None,
        adapter: str | None = None,
    ) -> sp.csr_matrix:
        """The sparse vectors ``(N, V)`` of ``texts`` (see :meth:`encode_with_stats`)."""
        vectors, _, _ = self.encode_with_stats(
            texts, batch_size=batch_size, top_k=top_k, truncate=truncate, chunking=chunking, adapter=adapter
        )
        return vectors

    def _encode_windows(
        self,
        texts: list[str],
        *,
        batch_size: int,
        top_k: int | None,
        truncate: bool,
        chunking: Chunking,
        adapter: str | None = None,
    ) -> tuple[sp.csr_matrix, list[int], list[bool]]:
        """:meth:`encode_with_stats` window by window, each text's weights the max over its windows."""
        require_max(chunking, "a SPLADE vector is a max over tokens, so its windows combine by max")
        plan = ChunkPlan.make(
            texts, self.token_offsets, window=self.chunk_window(), chunking=chunking, truncate=truncate, param="texts"
        )
        rows, counts, cut = self.encode_with_stats(
            plan.texts, batch_size=batch_size, truncate=truncate, adapter=adapter
        )
        vectors = max_rows(rows, plan.windows.owners, len(texts))
        vectors = prune_rows(vectors, top_k) if top_k is not None else vectors
        return vectors, summed_counts(plan.windows, counts), document_flags(plan.windows, cut)

    def encode_query(self, texts: Sequence[str], **options: Any) -> sp.csr_matrix:
        """:meth:`encode` on the query branch (an inference-free SPLADE's weights per token), as
        sentence-transformers' ``encode_query``; the model itself when it has one branch."""
        return self.encode(texts, task="query", **options)

    def encode_document(self, texts: Sequence[str], **options: Any) -> sp.csr_matrix:
        """:meth:`encode` on the document branch, as sentence-transformers' ``encode_document``."""
        return self.encode(texts, task="document", **options)

    # -- the serving engine's interface (embedrank.serving.runners.AsyncSparseEncoder) -------------------
    def tokenize_rows(self, texts: Sequence[str], *, adapter: str | None = None) -> list[TokenRow]:
        """Texts tokenized once, unpadded, cut at ``max_seq_length`` (what the engine batches), each with the index
        of the LoRA adapter ``adapter`` it runs with (:meth:`adapter_index`).

        Raises:
            InvalidInputError: the model has no adapter named ``adapter``.
        """
        index = self.adapter_index(adapter)
        rows = self.text_tokens.rows(texts)
        return with_adapter(rows, index)

    def weights_rows(self, rows: Sequence[TokenRow]) -> ModelOutput:
        """SPLADE weights ``(B, V)`` of rows from :meth:`tokenize_rows`, padded together (dense float32), each with
        its row's adapter."""
        batch = self.text_tokens.collate(rows)
        features = with_adapters(batch.features, [r.adapter for r in rows])
        return ModelOutput(self._weights(features), batch.token_counts, batch.truncated)

    # -- token accounting (/v1/tokenize, TEI's /tokenize) and long texts ---------------------------
    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Character span of each token of each text, special tokens excluded (for splitting long texts)."""
        return self.text_tokens.offsets(texts)

    def chunk_window(self) -> int:
        """Text tokens that fit one forward pass: the max length minus the special tokens."""
        return max(1, self.max_seq_length - self.text_tokens.special())

    def count_tokens(self, texts: Sequence[str], *, prompt: str = "") -> list[int]:
        """Untruncated token count of each ``prompt + text`` as the model sees it, special tokens included."""
        return self.text_tokens.lengths(with_prompt(check_texts(texts), prompt))

    def tokens(self, texts: Sequence[str], *, prompt: str = "", truncate: bool = True) -> list[list[str]]:
        """The tokens the model sees for each ``prompt + text`` (cut at ``max_seq_length`` unless ``truncate=False``)."""
        return self.text_tokens.seen(with_prompt(check_texts(texts), prompt), truncate=truncate)

    def token_spans(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[TokenSpan]]:
        """Each token of each text (id, text, special, character span), untruncated."""
        return self.text_tokens.spans(texts, add_special_tokens=add_special_tokens)

    @torch.inference_mode()
    def _weights(self, features: dict[str, torch.Tensor]) -> np.ndarray:
        """One padded batch through the masked LM, pooled: ``(B, V)`` float32."""
        if isinstance(self.model, StaticSparse):
            return self.model(features)
        return self.model(features).float().cpu().numpy()  # the runtime pools: (B, V)

    def decode(self, vector: sp.csr_matrix, top: int = 10) -> list[tuple[str, float]]:
        """The ``top`` heaviest terms of one sparse vector (a ``(1, V)`` row), heaviest first."""
        row = sp.csr_matrix(vector)
        order = np.argsort(-row.data, kind="stable")[:top]
        tokens = self.tokenizer.convert_ids_to_tokens(row.indices[order].tolist())
        return [(t, float(w)) for t, w in zip(tokens, row.data[order], strict=True)]
