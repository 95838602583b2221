"""Bi-encoder: text -> vector, with tokenize, forward and pool+normalize kept as separate steps."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from embedrank.errors import InvalidInputError, ModelKindError, UnsupportedModelError
from embedrank.math.pooling import PoolingMode, exclude_leading, pool
from embedrank.math.quantization import check_embedding_type, quantize
from embedrank.math.similarity import check_dimensions, finish_vectors, truncate_dims
from embedrank.models.adapters import Adapters, adapter_folders, adapter_for, adapter_prompt, attach_adapters
from embedrank.models.batching import AHEAD_CHUNK, PROGRESS_THRESHOLD
from embedrank.models.checks import check_max_seq_length, check_texts
from embedrank.models.chunking import Chunking, ChunkPlan
from embedrank.models.dense import apply_dense, load_dense
from embedrank.models.prompts import DOCUMENT_NAMES, QUERY_NAMES, role_prompt, select_prompt, with_prompt
from embedrank.models.ranges import FitsRanges, RangeSample
from embedrank.models.router import Branched, on_branch
from embedrank.models.signature import EmbeddingSignature
from embedrank.models.tokens import TextTokens, Tokenized, TokenizesText, TokenRow, TokenSpan, with_adapter
from embedrank.registry import DEFAULT_EMBEDDING_MODEL, ModelSpec, resolve, weights_fingerprint
from embedrank.runtime.backends import Runtime, RuntimeFacts, TorchRuntime, with_adapters
from embedrank.runtime.exports import load_transformer, runs_on
from embedrank.runtime.lora import BASE
from embedrank.texts import packaged_sample
from embedrank.types import ModelOutput


class Encoder(TokenizesText, Branched, FitsRanges, RuntimeFacts):
    """A transformer encoder with embedrank's own pooling and normalization; a sentence-transformers
    ``Router`` model is its default branch, with the others in :attr:`branches` (``task=`` picks one).

    Use :meth:`from_pretrained`; the constructor takes already-loaded parts.
    """

    def __init__(
        self,
        spec: ModelSpec,
        model: torch.nn.Module | Runtime,
        tokenizer: Any,
        *,
        device: str | torch.device = "cpu",
        pooling: PoolingMode | str | None = None,
        normalize: bool | None = None,
        max_seq_length: int | None = None,
        padding_free: bool | None = None,
    ) -> None:
        self.spec = spec
        self.device = torch.device(device)
        # the transformer itself: a torch module (run by TorchRuntime) or an exported graph's runtime
        if isinstance(model, torch.nn.Module):
            self.runtime: Runtime = TorchRuntime(model.to(device), tokenizer, "encoder", padding_free=padding_free)
        else:
            self.runtime = model
        self.text_tokens = TextTokens(
            tokenizer, max_length=max_seq_length or spec.max_seq_length, lower_case=spec.do_lower_case
        )
        self.pooling = PoolingMode(pooling) if pooling is not None else (spec.pooling or PoolingMode.MEAN)
        self.normalize = spec.normalize if normalize is None else normalize
        self._range_sample: RangeSample | None = None
        self.adapter_folders: dict[str, str] = {}  # each LoRA adapter's folder, by name (from_spec's adapters)
        self._dimension: int | None = None
        self.dense = load_dense(spec.path, spec.dense)  # sentence-transformers Dense layers after pooling

    @classmethod
    def from_pretrained(
        cls, model_id: str = DEFAULT_EMBEDDING_MODEL, *, trust_remote_code: bool = False, **options: Any
    ) -> Encoder:
        """Load an embedding model by id, local path or hub id (see :mod:`embedrank.registry`);
        ``options`` are those of :meth:`from_spec` (``backend``, ``precision``, ...).

        Raises:
            ModelNotFoundError, NotAModelError: the id does not lead to a model.
            UnsupportedModelError: it needs its own code and ``trust_remote_code`` is False, or a module we lack.
            ModelKindError: the model is a cross-encoder.
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
        pooling: PoolingMode | str | None = None,
        normalize: bool | None = None,
        max_seq_length: int | None = None,
        torch_dtype: torch.dtype | None = None,
        in_router: bool = False,
        streams: int = 1,
        adapters: Adapters = None,
    ) -> Encoder:
        """Load an already resolved model (:func:`~embedrank.registry.resolve`).

        ``backend`` (``"openvino"`` by default, ``"torch"``, ``"onnx"``) and ``precision`` (``"fp32"``,
        ``"bf16"``, ``"int8"``) choose what runs the transformer (:mod:`embedrank.runtime.backends`; a static
        model runs in torch, :mod:`embedrank.runtime.static`); the first OpenVINO or ONNX load exports into the
        cache (``cache_dir``, :mod:`embedrank.runtime.exports`), and int8 calibrates on ``calibration`` (texts
        or a ``.txt``/``.jsonl`` file; default: the packaged sample, :func:`~embedrank.texts.packaged_sample`). Every branch of a Router
        model loads with the same settings, except that a static branch runs in torch (``in_router``).
        ``streams`` (OpenVINO only) runs each batch as that many parts at once, for throughput over many texts
        at the cost of one text's latency (:class:`~embedrank.runtime.backends.OpenVINORuntime`).

        ``adapters`` are LoRA adapters over the model (:mod:`embedrank.models.adapters`): None loads those it ships
        (``adapters/<name>/``), a mapping names PEFT adapter folders, a list of folders is named by theirs, an empty
        one loads none. :meth:`encode`'s ``adapter`` (or ``task``) picks one per call. On torch, a batch mixing
        adapters runs in one pass (each row's update added); an exported backend runs one export per adapter.

        Raises:
            ModelKindError: the model is a cross-encoder.
            InvalidInputError: an unknown backend, or a precision the backend does not run; an adapter folder
                that holds none.
            UnsupportedModelError: an adapter that is no plain LoRA one, or fits another model; adapters on a
                Router or static model.
        """
        check_max_seq_length(max_seq_length)
        if spec.kind not in ("embedding", "m3"):  # bge-m3's dense vectors are an embedding model's
            what = "a causal LM scored as an LLM reranker" if spec.scoring == "yes-no" else "a classification head"
            what, loader = {
                "sparse": ("SPLADE", "SparseEncoder"),
                "multi-vector": ("ColBERT", "ColBERTEncoder"),
                "image-text": ("CLIP or SigLIP", "ImageTextEncoder"),
            }.get(spec.kind, (what, "CrossEncoder"))
            raise ModelKindError(
                f"model {spec.model_id!r} is a {spec.kind} ({what}), not an embedding model; load it with "
                f"{loader}.from_pretrained"
            )
        max_len = max_seq_length or spec.max_seq_length
        device, backend, precision = runs_on(device, backend, precision, static=spec.static is not None, spec=spec)
        runs: dict[str, Any] = dict(
            backend=backend,
            precision=precision,
            device=device,
            torch_dtype=torch_dtype,
            cache_dir=cache_dir,
            streams=streams,
        )
        # a Router's static branch runs in torch, in one stream, whatever runs the other branches (which keep
        # the backend and precision asked for, whichever branch is the default)
        lookup = bool((in_router or spec.branches) and spec.static)
        own = {**runs, "backend": None, "precision": None, "streams": 1} if lookup else runs
        tokenizer, model = load_transformer(spec, "encoder", **own, max_seq_length=max_len, calibration=calibration)
        enc = cls(spec, model, tokenizer, device=device, pooling=pooling, normalize=normalize, max_seq_length=max_len)
        folders = adapter_folders(spec.path, adapters)
        if folders and (spec.branches or spec.static):
            raise UnsupportedModelError(
                f"model {spec.model_id!r} is a {'Router' if spec.branches else 'static'} model: adapters apply to one "
                f"transformer"
            )

        def load_adapted(adapted: ModelSpec, backend: str, precision: str) -> Runtime:
            options = {**own, "backend": backend, "precision": precision}
            return load_transformer(adapted, "encoder", **options, max_seq_length=max_len, calibration=calibration)[1]  # type: ignore[return-value]

        enc.runtime = attach_adapters(enc.runtime, spec, folders, load_adapted)
        enc.adapter_folders = folders
        enc.add_branches(lambda branch: cls.from_spec(branch, **runs, calibration=calibration, in_router=True))
        return enc

    # -- facts -----------------------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        return self.spec.model_id

    @property
    def dimension(self) -> int:
        if self.spec.dimension:
            return int(self.spec.dimension)
        if self._dimension is None:  # no Pooling config says it: the width of one embedding, measured once
            self._dimension = int(self.forward(self.tokenize(["dimension"]).features).shape[-1])
        return self._dimension

    @dimension.setter
    def dimension(self, value: int) -> None:
        """Say the embedding width where it is known without a forward pass (a front process, told by the
        engine process that measured it)."""
        self._dimension = int(value)

    def __repr__(self) -> str:
        facts = f"pooling={self.pooling.value}, normalize={self.normalize}, max_seq_length={self.max_seq_length}"
        return f"Encoder({self.model_id!r}, dim={self.dimension}, {facts}, backend={self.backend}, precision={self.precision})"

    # -- the three steps -------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str], *, truncate: bool = True) -> Tokenized:
        """Step 1: texts -> padded features ``(B, T)`` with token counts and truncation flags."""
        return self.text_tokens.batch(texts, truncate=truncate)

    def count_tokens(
        self, texts: Sequence[str], *, prompt_name: str | None = None, prompt: str | None = None
    ) -> list[int]:
        """Untruncated token count of each text as the model sees it (prompt and special tokens included);
        the service uses it to refuse over-long input before compute."""
        return self.text_tokens.lengths(self.apply_prompt(texts, prompt_name, prompt))

    def tokens(
        self, texts: Sequence[str], *, prompt_name: str | None = None, prompt: str | None = None, truncate: bool = True
    ) -> list[list[str]]:
        """The tokens the model sees for each text (prompt and special tokens included; cut at
        ``max_seq_length`` unless ``truncate=False``), as the tokenizer spells them."""
        return self.text_tokens.seen(self.apply_prompt(check_texts(texts), prompt_name, prompt), truncate=truncate)

    def token_spans(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[TokenSpan]]:
        """Each token of each text (ids, text, special, character span), untruncated (:func:`token_spans`)."""
        return self.text_tokens.spans(texts, add_special_tokens=add_special_tokens)

    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Character span of each token of each text, special tokens excluded (for splitting long texts)."""
        return self.text_tokens.offsets(texts)

    def chunk_window(self, prompt: str | None = None) -> int:
        """Text tokens that fit one forward pass: the max length minus special tokens and ``prompt`` (None:
        the document prompt)."""
        prompt = self.document_prompt if prompt is None else prompt
        used = len(self.token_offsets([prompt])[0]) if prompt else 0
        return max(1, self.max_seq_length - self.text_tokens.special() - used)

    @property
    def query_prompt(self) -> str:
        """The text :meth:`encode_query` puts before each query (``""`` when the model has none): the prompt of
        the query adapter (:func:`~embedrank.models.adapters.adapter_prompt`) if it has one, else the query prompt."""
        return self._role_prompt("query", QUERY_NAMES)

    @property
    def document_prompt(self) -> str:
        """The text :meth:`encode_document` puts before each document (``""`` when the model has none), chosen
        as :attr:`query_prompt` is."""
        return self._role_prompt("document", DOCUMENT_NAMES)

    def _role_prompt(self, role: str, names: tuple[str, ...]) -> str:
        own = adapter_prompt(self.spec.prompts, adapter_for(self.adapters, role))
        if own is not None:
            return self.spec.prompts[own]
        return role_prompt(self.spec.prompts, self.spec.default_prompt_name, names)

    def encode_query(self, texts: Iterable[str], *, prompt_name: str | None = None, **options: Any) -> Any:
        """:meth:`encode` with the model's query prompt (``"query"``; else its default prompt) unless
        ``prompt_name`` says otherwise, as sentence-transformers' ``encode_query``."""
        chosen: dict[str, Any] = {"prompt_name": prompt_name} if prompt_name else {"prompt": self.query_prompt}
        return self.encode(texts, **chosen, **{"task": "query", **options})

    def encode_document(self, texts: Iterable[str], *, prompt_name: str | None = None, **options: Any) -> Any:
        """:meth:`encode` with the model's document prompt (the first of ``"document"``, ``"passage"``,
        ``"corpus"`` it has; else its default prompt) unless ``prompt_name`` says otherwise, as
        sentence-transformers' ``encode_document``."""
        chosen: dict[str, Any] = {"prompt_name": prompt_name} if prompt_name else {"prompt": self.document_prompt}
        return self.encode(texts, **chosen, **{"task": "document", **options})

    @property
    def prompts(self) -> dict[str, str]:
        """The model's named prompts (``config_sentence_transformers.json``), e.g. ``{"query": "query: "}``."""
        return dict(self.spec.prompts)

    def apply_prompt(
        self, texts: Sequence[str], prompt_name: str | None = None, prompt: str | None = None
    ) -> list[str]:
        """``texts`` with the selected prompt before each (:func:`~embedrank.models.prompts.select_prompt`:
        ``prompt``, the prompt named ``prompt_name``, else the model's default prompt, else none).

        Raises:
            InvalidInputError: ``prompt_name`` is not one of the model's prompts (the message lists them).
        """
        text = select_prompt(self.spec.prompts, self.spec.default_prompt_name, prompt_name=prompt_name, prompt=prompt)
        return with_prompt(texts, text)

    @torch.inference_mode()
    def forward(self, features: dict[str, torch.Tensor], *, all_positions: bool = False) -> torch.Tensor:
        """Step 2: features -> token states ``(B, T, H)`` by :attr:`runtime` (``all_positions``: masked ones too)."""
        return self.runtime(features, all_positions=all_positions)

    @torch.inference_mode()
    def postprocess(
        self,
        token_embeddings: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        normalize: bool | None = None,
        dimensions: int | None = None,
    ) -> np.ndarray:
        """Step 3: pool ``(B, T, H) -> (B, H)``, Dense layers, normalize, optionally truncate to ``dimensions``.

        Returns float32 numpy ``(B, D)``.
        """
        pooled = self.pooled(token_embeddings, attention_mask).cpu().numpy()
        return self.finish_vectors(pooled, normalize=normalize, dimensions=dimensions)

    @torch.inference_mode()
    def pooled(self, token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Step 3, first half, where the states are (a GPU keeps them): pool ``(B, T, H) -> (B, H)`` and the Dense
        layers, in fp32 whatever the runtime computes in (bf16, fp16); ``(B, D)``."""
        states = token_embeddings.float()
        return apply_dense(pool(states, attention_mask.to(states.device), self.pooling), self.dense).float()

    def finish_vectors(
        self, pooled: np.ndarray, *, normalize: bool | None = None, dimensions: int | None = None
    ) -> np.ndarray:
        """Step 3, second half, on the host: normalize (the model's setting unless ``normalize`` says), truncate
        to ``dimensions``; float32 ``(B, D)``."""
        return finish_vectors(
            pooled, normalize=self.normalize if normalize is None else normalize, dimensions=dimensions
        )

    def pooled_batch(self, batch: Tokenized, *, skip: Any = 0, adapter: Any = BASE) -> torch.Tensor:
        """Step 2 and the first half of step 3 on one tokenized batch: ``(B, D)`` pooled fp32, on the model's
        device. ``skip``: leading tokens (per row, or one count for all) that pooling leaves out; ``adapter``:
        the adapter index (:meth:`adapter_index`) each row runs with (per row, or one for all)."""
        mask = batch.features["attention_mask"]
        if np.any(skip):
            mask = exclude_leading(mask, torch.as_tensor(skip).expand(mask.shape[0]))
        return self.pooled(self.forward(with_adapters(batch.features, adapter)), mask)

    def embed_tokenized(
        self, batch: Tokenized, *, normalize: bool | None = None, dimensions: int | None = None, skip: Any = 0
    ) -> np.ndarray:
        """Steps 2 and 3 on one tokenized batch; ``(B, D)`` float32. ``skip``: leading tokens (per row, or one
        count for all) that pooling leaves out."""
        pooled = self.pooled_batch(batch, skip=skip).cpu().numpy()
        return self.finish_vectors(pooled, normalize=normalize, dimensions=dimensions)

    def encode_batch(self, texts: Sequence[str]) -> ModelOutput:
        """All three steps on one batch, in input order."""
        out = self.embed_rows(self.tokenize_rows(texts))
        return dataclasses.replace(out, values=self.finish_vectors(out.values))

    def tokenize_rows(self, texts: Sequence[str], *, prompt: str = "", adapter: str | None = None) -> list[TokenRow]:
        """Step 1 without padding: one :class:`~embedrank.models.tokens.TokenRow` per text, ``prompt`` before
        each (the serving engine tokenizes at submit time, budgets on real lengths, then batches rows of many
        requests); a row's ``skip`` is the prompt's tokens that pooling leaves out (:meth:`prompt_skip`), its
        ``adapter`` the index of the LoRA adapter it runs with (:meth:`adapter_index`).

        Raises:
            InvalidInputError: the model has no adapter named ``adapter``.
        """
        rows = self.text_tokens.rows(with_prompt(texts, prompt), skip=self.prompt_skip(prompt))
        index = self.adapter_index(adapter)
        return with_adapter(rows, index)

    def embed_rows(self, rows: Sequence[TokenRow]) -> ModelOutput:
        """Step 2 and the first half of step 3 on rows from :meth:`tokenize_rows`, padded together: the pooled
        vectors ``(B, D)`` float32, before :meth:`finish_vectors` (normalizing, the cut to ``dimensions``),
        which the caller applies once with its options; what the engine runs per pass (its rows may run with
        different adapters: one pass on torch, one per adapter on an exported backend)."""
        batch = self.text_tokens.collate(rows)
        pooled = self.pooled_batch(batch, skip=[r.skip for r in rows], adapter=[r.adapter for r in rows])
        return ModelOutput(pooled.cpu().numpy(), batch.token_counts, batch.truncated)

    def prompt_skip(self, prompt: str) -> int:
        """Tokens of ``prompt`` pooling leaves out: none, unless the model pools without its prompt
        (``include_prompt=False``); then the prompt's tokens bar a trailing special one, as sentence-transformers."""
        if self.spec.include_prompt or not prompt:
            return 0
        ids = self.tokenizer(self.text_tokens.prepare([prompt]))["input_ids"][0]
        return len(ids) - int(bool(ids) and ids[-1] in self.tokenizer.all_special_ids)

    # -- convenience -----------------------------------------------------------------------------
    @on_branch
    def encode_with_stats(
        self,
        texts: Iterable[str],
        *,
        task: str | None = None,
        batch_size: int = 32,
        show_progress: bool | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        truncate: bool = True,
        prompt_name: str | None = None,
        prompt: str | None = None,
        chunking: Chunking | None = None,
        adapter: str | None = None,
    ) -> ModelOutput:
        """Encode texts, longest first in batches; embeddings ``(N, D)`` in input order with token counts
        (prompt included) and truncation flags (:class:`~embedrank.types.ModelOutput`).

        ``adapter`` names the LoRA adapter the texts run with (:attr:`adapters`; None: the base model, unless
        ``task`` picks one: :func:`~embedrank.models.adapters.adapter_for`, with the adapter's prompt when the
        call names none, as jina-embeddings-v3's ``task``).

        With ``chunking``, a text longer than one forward pass is split into windows (each with the
        prompt) and its embedding is the token-weighted mean of theirs, renormalized
        (:func:`~embedrank.models.chunking.pool_windows`); ``truncated`` then flags text left out by the
        chunking bounds, and ``chunked`` counts the texts split."""
        if batch_size < 1:
            raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}", param="batch_size")
        check_dimensions(dimensions, self.dimension)  # before any work
        if adapter is None and task is not None:
            adapter = adapter_for(self.adapters, task)
            if prompt is None and prompt_name is None:  # the prompt that goes with the adapter the task picked
                prompt_name = adapter_prompt(self.spec.prompts, adapter)
        index = self.adapter_index(adapter)
        chosen = select_prompt(self.spec.prompts, self.spec.default_prompt_name, prompt_name=prompt_name, prompt=prompt)
        if chunking is not None:
            window, texts = self.chunk_window(chosen), check_texts(texts)
            plan = ChunkPlan.make(
                texts, self.token_offsets, window=window, chunking=chunking, truncate=truncate, param="texts"
            )
            encode = partial(self.encode_with_stats, batch_size=batch_size, show_progress=show_progress)
            parts = encode(plan.texts, normalize=normalize, truncate=truncate, prompt=chosen, adapter=adapter)
            do_norm = self.normalize if normalize is None else normalize
            pooled = plan.vectors(parts, normalize=do_norm)
            vectors = truncate_dims(pooled.values, dimensions, renormalize=do_norm)
            return dataclasses.replace(pooled, values=vectors)
        items, skip = with_prompt(check_texts(texts), chosen), self.prompt_skip(chosen)
        out = np.empty((len(items), dimensions or self.dimension), dtype=np.float32)
        counts = [0] * len(items)
        truncated = [False] * len(items)
        show = len(items) >= PROGRESS_THRESHOLD if show_progress is None else show_progress
        on_gpu = self.on_gpu
        batches = self.text_tokens.batches(items, batch_size=batch_size, truncate=truncate, ahead=on_gpu)
        # on a GPU, batches are queued one after another and their vectors copied back together every
        # AHEAD_CHUNK texts: the host prepares the next batches while the GPU computes, instead of waiting for
        # each batch's vectors
        pending: list[tuple[list[int], Tokenized, torch.Tensor]] = []
        with tqdm(total=len(items), desc="Encoding", unit="text", disable=not show) as bar:

            def copy_back() -> None:
                host = torch.cat([p for _, _, p in pending]).cpu().numpy()
                at = 0
                for positions, batch, _ in pending:
                    rows = host[at : at + len(positions)]
                    at += len(positions)
                    out[positions] = self.finish_vectors(rows, normalize=normalize, dimensions=dimensions)
                    for j, pos in enumerate(positions):
                        counts[pos] = batch.token_counts[j]
                        truncated[pos] = batch.truncated[j]
                    bar.update(len(positions))
                pending.clear()

            for positions, batch in batches:
                pending.append((positions, batch, self.pooled_batch(batch, skip=skip, adapter=index)))
                if not on_gpu or sum(len(p) for p, _, _ in pending) >= AHEAD_CHUNK:
                    copy_back()
            if pending:
                copy_back()
        return ModelOutput(out, counts, truncated)

    @on_branch
    def encode(
        self,
        texts: Iterable[str],
        *,
        task: str | None = None,
        batch_size: int = 32,
        show_progress: bool | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        chunking: Chunking | None = None,
        embedding_type: str = "float32",
        ranges: np.ndarray | None = None,
        precision: str | None = None,
        adapter: str | None = None,
    ) -> np.ndarray:
        """Encode texts to numpy ``(N, D)`` in input order: float32, or compact vectors with ``embedding_type``.

        ``normalize`` overrides the model's own setting; ``dimensions`` truncates (Matryoshka-style)
        and renormalizes. ``prompt_name`` (one of :attr:`prompts`) or ``prompt`` (any text) is put before
        each text, as sentence-transformers does; without either, the model's default prompt applies, if
        it has one. ``chunking`` embeds long texts window by window (see :meth:`encode_with_stats`).
        ``task`` picks a Router model's branch (``"query"``, ``"document"``; None: its default branch), or a
        model's LoRA adapter (:attr:`adapters`), as ``adapter`` names one (see :meth:`encode_with_stats`).
        ``embedding_type`` is ``float32`` (or ``float``), ``int8``, ``uint8``, ``binary`` or ``ubinary``,
        with sentence-transformers' ``quantize_embeddings`` semantics (:mod:`embedrank.math.quantization`);
        int8/uint8 use ``ranges`` ``(2, D)`` if given, else :meth:`quantization_ranges`. A progress bar
        shows for long inputs unless ``show_progress=False``. ``precision`` is the former name of
        ``embedding_type`` (deprecated: ``precision`` now names only what the runtime computes in).
        """
        if precision is not None:  # the former name; precision now names what the runtime computes in
            warnings.warn("encode(precision=) is deprecated: use embedding_type=", DeprecationWarning, stacklevel=2)
            embedding_type = precision
        try:
            embedding_type = check_embedding_type(embedding_type)
        except ValueError as exc:
            raise InvalidInputError(str(exc), param="embedding_type") from None
        vectors = self.encode_with_stats(
            texts,
            task=task,
            adapter=adapter,
            batch_size=batch_size,
            show_progress=show_progress,
            normalize=normalize,
            dimensions=dimensions,
            prompt_name=prompt_name,
            prompt=prompt,
            chunking=chunking,
        ).embeddings
        if embedding_type in ("int8", "uint8") and ranges is None:
            ranges = self.quantization_ranges(dimensions, normalize=normalize, adapter=adapter)
        return quantize(vectors, embedding_type, ranges)

    # -- ranges for int8/uint8 embeddings (range_sample, fit_ranges, quantization_ranges: FitsRanges) ----
    def default_range_texts(self) -> list[str]:
        return packaged_sample()

    def embed_for_ranges(self, texts: list[str], *, normalize: bool, adapter: str | None = None) -> np.ndarray:
        return self.encode(texts, batch_size=64, show_progress=False, prompt="", normalize=normalize, adapter=adapter)

    def ranges_depend_on(self, adapter: str | None = None) -> str | None:
        """The embedding signature, the weights' names, sizes and times, and the runtime's graph and the
        precision it computes in (an int8 graph calibrated otherwise, bf16 on a CPU without it: other vectors);
        with ``adapter``, that adapter's folder and weights too."""
        signature = EmbeddingSignature.of(self)  # fingerprints the weights of local and hub models; here all
        if signature.weights is None:
            signature = dataclasses.replace(signature, weights=weights_fingerprint(self.spec.path))
        runtime = self.runtime
        graph = getattr(runtime, "path", "")
        computes = getattr(runtime, "inference_precision", "")
        device = getattr(runtime, "device", "cpu")
        key = f"{signature.cache_key()}|graph={graph}|computes={computes}|device={device}"
        if adapter is not None:
            folder = self.adapter_folders[adapter]
            key += f"|adapter={adapter}:{folder}:{weights_fingerprint(folder)}"
        return key


class OverEncoder(TokenizesText, RuntimeFacts):
    """A model built over an :class:`Encoder`'s transformer (a ColBERT model, bge-m3): its tokenizer, window,
    runtime and token accounting are the encoder's."""

    encoder: Encoder

    @property
    def text_tokens(self) -> TextTokens:  # type: ignore[override]
        return self.encoder.text_tokens

    @property
    def runtime(self) -> Runtime:  # type: ignore[override]
        return self.encoder.runtime

    @property
    def model_id(self) -> str:
        return self.encoder.model_id

    def count_tokens(
        self, texts: Sequence[str], *, prompt_name: str | None = None, prompt: str | None = None
    ) -> list[int]:
        """:meth:`Encoder.count_tokens`."""
        return self.encoder.count_tokens(texts, prompt_name=prompt_name, prompt=prompt)

    def tokens(
        self, texts: Sequence[str], *, prompt_name: str | None = None, prompt: str | None = None, truncate: bool = True
    ) -> list[list[str]]:
        """:meth:`Encoder.tokens`."""
        return self.encoder.tokens(texts, prompt_name=prompt_name, prompt=prompt, truncate=truncate)

    def token_spans(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[TokenSpan]]:
        """:meth:`Encoder.token_spans`."""
        return self.encoder.token_spans(texts, add_special_tokens=add_special_tokens)

    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """:meth:`Encoder.token_offsets`."""
        return self.encoder.token_offsets(texts)
