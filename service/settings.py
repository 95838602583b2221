"""Service settings from environment variables, or from a TOML file named by ``EMBEDRANK_CONFIG``.

Environment variables (all optional):

- ``EMBEDRANK_MODELS``: comma-separated ``id`` or ``id=path_or_hub_id`` entries, each optionally ending in
  ``@backend[:precision]`` (``mini-int8=sentence-transformers/all-MiniLM-L6-v2@openvino:int8``): the same
  weights can be served under several ids with different backends. Every embedding model
  serves ``/v1/embeddings`` and, as a bi-encoder (cosine) scorer, ``/v1/rerank``; a cross-encoder serves
  ``/v1/rerank`` only, with its own scores. Default: the packaged ``sentence-transformers/all-MiniLM-L6-v2``.
- ``EMBEDRANK_BACKEND`` (``openvino``; or ``torch``, ``onnx``) and ``EMBEDRANK_PRECISION`` (``fp32``; or
  ``bf16``, ``int8``): what runs every model whose entry names no backend (:mod:`embedrank.runtime.backends`).
  An OpenVINO or ONNX model is exported on its first start and read from the export cache after that.
- ``EMBEDRANK_TRUST_REMOTE_CODE``: comma-separated model ids whose own Python code (``auto_map`` in their
  config: nomic-embed, gte-*-v1.5, jina-embeddings) may run. Off for every model unless named here or by
  ``trust_remote_code = true`` in its ``[[models]]`` table; a model that needs it is refused at startup with
  a message that says so.
- ``EMBEDRANK_API_KEYS`` (comma-separated) and/or ``EMBEDRANK_API_KEYS_FILE`` (one key per line).
- ``EMBEDRANK_NO_AUTH=1``: run without authentication (a warning is printed at startup).
- ``EMBEDRANK_CORS_ORIGINS``: comma-separated origins (``https://app.example.com``, or ``*``) allowed to
  call the API from a browser; CORS is off when unset.
- ``EMBEDRANK_ACCESS_LOG=1``: keep the ASGI server's per-request access log (off by default; ``/metrics``
  counts requests by route and status).
- ``EMBEDRANK_TUNE_MALLOC=0``: keep glibc's default allocator settings (by default the service calls
  :func:`embedrank.serving.allocator.tune_malloc` so activation memory is reused, not page-faulted per
  layer, and gives it back with ``malloc_trim`` after ``EMBEDRANK_IDLE_SECONDS`` (30) without work).
- ``EMBEDRANK_TOKEN_IDS`` (``cl100k_base``): token-id arrays in ``/v1/embeddings`` input are OpenAI's token
  ids and are decoded with ``cl100k_base`` (as LangChain's ``OpenAIEmbeddings`` sends them); ``off`` refuses them.
- Limits: ``EMBEDRANK_MAX_INPUTS`` (2048), ``EMBEDRANK_MAX_DOCUMENTS`` (1000),
  ``EMBEDRANK_MAX_BODY_BYTES`` (16 MiB), ``EMBEDRANK_MAX_TEXT_CHARS`` (100000),
  ``EMBEDRANK_MAX_REQUEST_TOKENS`` (1048576: the tokens one request may hold after tokenizing and chunking;
  past it, 413 ``request_too_large`` before any of its work is queued), ``EMBEDRANK_MAX_MULTIVECTOR_TOKENS``
  (8192: the token vectors a bge-m3 ``multivector`` answer may hold; past it, 400 before any work).
- ``EMBEDRANK_DRAIN_SECONDS`` (30): on SIGTERM, ``/health`` and new requests answer 503 at once, the work
  in flight gets this long, then every connection is closed and the process exits 0.
  ``EMBEDRANK_BODY_TIMEOUT_SECONDS`` (30): a request body that takes longer to arrive is answered 408.
  ``EMBEDRANK_HEADER_TIMEOUT_SECONDS`` (20): a connection that waits longer than this for a request's
  headers (slowloris, or one opened and never used) gets 408 and is closed (:mod:`service.connections`).
- Overload: a request whose estimated wait for its first forward pass (the work scheduled before it, at
  the measured speed) exceeds ``EMBEDRANK_MAX_QUEUE_SECONDS`` (30) is answered 429 with ``Retry-After``;
  so is one that would take the queue past ``EMBEDRANK_MAX_QUEUE`` (8192 items).
- Engine: ``EMBEDRANK_TARGET_BATCH_SECONDS`` (0.25; 0: a fixed budget), ``EMBEDRANK_MAX_BATCH_TOKENS`` (8192),
  ``EMBEDRANK_MAX_BATCH_SIZE`` (128), ``EMBEDRANK_BATCH_WAIT_MS`` (0: off;
  the most a batch waits for concurrent callers to rejoin, ended early when arrivals stop; a lone request
  never waits. Off because the wait left the forward thread idle and cost throughput in every measured load).

A model path ``fake:encoder``, ``fake:encoder-with-prompts`` or ``fake:cross-encoder`` serves a weightless fake model
(:mod:`embedrank.testing.fake`), for trying the API or testing a client without loading weights.

The TOML file has the same keys in lower case without the prefix, and ``[[models]]`` tables with
``id``, optional ``path``, optional ``aliases``, optional ``backend`` and ``precision``, optional
``trust_remote_code`` (``true`` lets the model's own code run), optional
``ranges``: a ``.txt`` (one text per line) or BEIR ``.jsonl`` file whose embeddings set an embedding
model's int8/uint8 ranges for ``embedding_types`` (default: :mod:`embedrank.models.ranges`' seeded
vocabulary sentences), and optional ``calibration``: such a file to calibrate the int8 runtime of a model
with ``precision = "int8"`` (default: :mod:`embedrank.runtime.exports`). A ``calibration`` on an embedding
model that is not int8 is read as ``ranges``, with a deprecation warning (it used to set both). Top-level
``backend`` and ``precision`` are the defaults for every model.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from embedrank.errors import InvalidInputError
from embedrank.registry import DEFAULT_EMBEDDING_MODEL
from embedrank.runtime.backends import BACKEND_ENV, PRECISION_ENV, check_backend
from embedrank.serving.engine import EngineConfig


def read_keys_file(path: str) -> list[str]:
    """The keys in ``path``, one per line (blank lines and ``#`` comments skipped).

    Raises:
        SettingsError: the file cannot be read, is not UTF-8, or holds no key (a server that starts with a
            key file meant to hold its keys, but none in it, would refuse every client).
    """
    name = f"EMBEDRANK_API_KEYS_FILE={path}"
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SettingsError(f"{name}: not UTF-8 text (byte {exc.start}); write one key per line") from None
    except OSError as exc:
        raise SettingsError(f"{name}: {exc}") from exc
    keys = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if not keys:
        raise SettingsError(f"{name}: the file holds no key; write one key per line")
    return keys


class SettingsError(ValueError):
    """A setting is malformed; raised at startup with the variable's name."""


def parse_model_entry(text: str) -> ModelEntry:
    """One ``EMBEDRANK_MODELS`` entry: ``id``, ``id=path`` or either with ``@backend[:precision]``.

    >>> parse_model_entry("minilm-int8=sentence-transformers/all-MiniLM-L6-v2@openvino:int8")
    ModelEntry(id='minilm-int8', path='sentence-transformers/all-MiniLM-L6-v2', aliases=(), ranges=None, calibration=None, backend='openvino', precision='int8', trust_remote_code=False)
    >>> parse_model_entry("minilm@torch").backend
    'torch'
    """
    head, at, runtime = text.rpartition("@") if "@" in text else (text, "", "")
    backend, _, precision = runtime.partition(":")
    model_id, _, model_path = head.partition("=")
    if not model_id.strip() or (at and not backend.strip()):
        raise SettingsError(f"EMBEDRANK_MODELS entry {text!r} must be id, id=path, or either with @backend[:precision]")
    return ModelEntry(
        id=model_id.strip(),
        path=model_path.strip() or None,
        backend=backend.strip() or None,
        precision=precision.strip() or None,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelEntry:
    id: str
    path: str | None = None  # local path or hub id; defaults to id
    aliases: tuple[str, ...] = ()
    ranges: str | None = None  # texts (.txt or .jsonl) whose embeddings set int8/uint8 embedding ranges
    calibration: str | None = None  # texts (.txt or .jsonl) that calibrate an int8 runtime (precision int8)
    backend: str | None = None  # torch, openvino, onnx; None: EMBEDRANK_BACKEND, else openvino
    precision: str | None = None  # fp32, bf16, int8; None: EMBEDRANK_PRECISION, else fp32
    trust_remote_code: bool = False  # run the Python code the model ships (its config's auto_map)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    max_inputs: int = 2048
    max_documents: int = 1000
    max_body_bytes: int = 16 * 1024 * 1024
    max_text_chars: int = 100_000
    max_request_tokens: int = 1_048_576  # tokens one request may hold after tokenizing (and chunking): 413 past it
    max_multivector_tokens: int = 8192  # bge-m3 token vectors one /v1/embeddings response may hold: 400 past it


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    models: tuple[ModelEntry, ...] = (ModelEntry(id=DEFAULT_EMBEDDING_MODEL, aliases=("all-MiniLM-L6-v2",)),)
    api_keys: tuple[str, ...] = ()
    no_auth: bool = False
    limits: Limits = dataclasses.field(default_factory=Limits)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    drain_seconds: float = 30.0  # SIGTERM: at most this long for the work in flight, then exit 0
    body_timeout_seconds: float = 30.0  # a request body that takes longer to arrive gets 408
    header_timeout_seconds: float = 20.0  # a connection waiting longer for request headers: 408, closed
    access_log: bool = False
    tune_malloc: bool = True
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API; empty: CORS off
    token_ids: bool = True  # token-id input read as cl100k_base (EMBEDRANK_TOKEN_IDS=cl100k_base); off: refused

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = dict(os.environ if environ is None else environ)
        data: dict = {}
        if env.get("EMBEDRANK_CONFIG"):
            path = Path(env["EMBEDRANK_CONFIG"]).expanduser()
            try:
                data = tomllib.loads(path.read_text())
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise SettingsError(f"EMBEDRANK_CONFIG={path}: {exc}") from exc

        def get(name: str, default):
            key = f"EMBEDRANK_{name.upper()}"
            raw = env.get(key, data.get(name))
            if raw is None or raw == "":
                return default
            try:
                if isinstance(default, bool):
                    return raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes", "on")
                return type(default)(raw)
            except (TypeError, ValueError) as exc:
                raise SettingsError(f"{key} must be a {type(default).__name__}, got {raw!r}") from exc

        models: list[ModelEntry] = []
        if env.get("EMBEDRANK_MODELS"):
            for part in env["EMBEDRANK_MODELS"].split(","):
                if part.strip():
                    models.append(parse_model_entry(part.strip()))
        else:
            for entry in data.get("models", []):
                models.append(
                    ModelEntry(
                        id=entry["id"],
                        path=entry.get("path"),
                        aliases=tuple(entry.get("aliases", ())),
                        ranges=entry.get("ranges"),
                        calibration=entry.get("calibration"),
                        backend=entry.get("backend"),
                        precision=entry.get("precision"),
                        trust_remote_code=entry.get("trust_remote_code", False) is True,
                    )
                )
        trusted = {m.strip() for m in env.get("EMBEDRANK_TRUST_REMOTE_CODE", "").split(",") if m.strip()}
        unknown = trusted - {m.id for m in models}
        if unknown and models:
            raise SettingsError(
                f"EMBEDRANK_TRUST_REMOTE_CODE names {sorted(unknown)}, which no model entry has as its id"
            )
        models = [dataclasses.replace(m, trust_remote_code=True) if m.id in trusted else m for m in models]
        default_backend = env.get(BACKEND_ENV) or data.get("backend")
        default_precision = env.get(PRECISION_ENV) or data.get("precision")
        models = [
            dataclasses.replace(m, backend=m.backend or default_backend, precision=m.precision or default_precision)
            for m in models or cls().models
        ]
        keys = [k.strip() for k in env.get("EMBEDRANK_API_KEYS", "").split(",") if k.strip()]
        keys += [str(k) for k in data.get("api_keys", [])]
        keys_file = env.get("EMBEDRANK_API_KEYS_FILE") or data.get("api_keys_file")
        if keys_file:
            keys += read_keys_file(keys_file)
        base = cls()
        limits = Limits(**{f.name: get(f.name, getattr(base.limits, f.name)) for f in dataclasses.fields(Limits)})
        engine = EngineConfig(
            max_batch_tokens=get("max_batch_tokens", base.engine.max_batch_tokens),
            target_batch_seconds=get("target_batch_seconds", base.engine.target_batch_seconds or 0.0) or None,
            max_batch_size=get("max_batch_size", base.engine.max_batch_size),
            max_wait_ms=get("batch_wait_ms", base.engine.max_wait_ms),
            max_queue_items=get("max_queue", base.engine.max_queue_items),
            max_queue_seconds=get("max_queue_seconds", base.engine.max_queue_seconds),
            idle_seconds=get("idle_seconds", base.engine.idle_seconds),
        )
        token_ids = str(get("token_ids", "cl100k_base")).strip().lower()
        if token_ids not in ("cl100k_base", "off"):
            raise SettingsError(f"EMBEDRANK_TOKEN_IDS must be cl100k_base or off, got {token_ids!r}")
        settings = cls(
            models=tuple(models),
            api_keys=tuple(dict.fromkeys(keys)),
            no_auth=get("no_auth", base.no_auth),
            limits=limits,
            engine=engine,
            drain_seconds=get("drain_seconds", base.drain_seconds),
            body_timeout_seconds=get("body_timeout_seconds", base.body_timeout_seconds),
            header_timeout_seconds=get("header_timeout_seconds", base.header_timeout_seconds),
            access_log=get("access_log", base.access_log),
            tune_malloc=get("tune_malloc", base.tune_malloc),
            cors_origins=tuple(o.strip() for o in str(get("cors_origins", "")).split(",") if o.strip()),
            token_ids=token_ids != "off",
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        for entry in self.models:
            if (entry.path or "").startswith("fake:"):
                continue
            try:
                check_backend(entry.backend, entry.precision)
            except InvalidInputError as exc:
                raise SettingsError(f"model {entry.id!r}: {exc}") from None
        for name in (f.name for f in dataclasses.fields(Limits)):
            if getattr(self.limits, name) < 1:
                raise SettingsError(f"limit {name} must be >= 1")
        if self.drain_seconds < 0 or self.body_timeout_seconds <= 0 or self.header_timeout_seconds <= 0:
            raise SettingsError("drain_seconds must be >= 0, body_timeout_seconds and header_timeout_seconds > 0")
        if self.engine.max_queue_seconds <= 0:
            raise SettingsError("max_queue_seconds must be > 0")
        if self.engine.max_queue_items < 1 or self.engine.max_batch_tokens < 1 or self.engine.max_batch_size < 1:
            raise SettingsError("engine queue, batch tokens and batch size must be >= 1")
