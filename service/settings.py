"""The service's settings: one typed table, :class:`Settings`, read from a TOML file and from the environment.

The table is grouped by concern (:class:`Models`, :class:`Auth`, :class:`Server`, :class:`Limits`,
:class:`Images`, :class:`Engine`, :class:`Batches`, :class:`Cache`, :class:`Telemetry`), and each part of the service reads the
group it concerns (``settings.limits.max_inputs``). Every setting has one name, one type, one default and one
line of help. Its TOML key is that name, at the top of the file whatever its group; its environment variable is
the name in upper case after ``EMBEDRANK_`` (``max_inputs``: ``EMBEDRANK_MAX_INPUTS``). The TOML file is the one
``EMBEDRANK_CONFIG`` names. For each setting, the environment variable wins over the file's key, and the file's
key over the default; an empty environment variable counts as unset. In the environment a list is
comma-separated (``EMBEDRANK_API_KEYS=key-1,key-2``); in the file it is a TOML array
(``api_keys = ["key-1", "key-2"]``).

Anything the table cannot read stops the start with a :class:`SettingsError` naming the setting and where its
value came from: a value of the wrong type or out of range, a TOML key or ``[[models]]`` key the table does
not have, an ``EMBEDRANK_`` variable that no part of embedrank reads, an API key list that is set but holds no
key, a key that a client could not send. The configuration reference in the manual is rendered from the table
(:mod:`service.settings_reference`).

>>> settings = Settings.from_env({"EMBEDRANK_API_KEYS": "key-1,key-2", "EMBEDRANK_MAX_INPUTS": "64"})
>>> settings.auth.api_keys, settings.limits.max_inputs
(('key-1', 'key-2'), 64)
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import os
import re
import tomllib
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import msgspec
from msgspec import Meta

from embedrank.errors import ConfigurationError, InvalidInputError
from embedrank.paths import CACHE_ENV, DATA_ENV
from embedrank.serving.engine import CPU_BATCH_SIZE, CPU_BATCH_TOKENS, EngineConfig
from embedrank.serving.hosting import GPU_BATCH_SIZE, GPU_MAX_BATCH_TOKENS
from embedrank.serving.pool import DEFAULT_ENTRIES, ModelEntry, check_device, check_runtime
from embedrank.serving.vector_cache import VectorCache
from service.database_urls import is_postgres_url, redacted
from service.validation_messages import reworded, split_at

PREFIX = "EMBEDRANK_"
CONFIG_ENV = "EMBEDRANK_CONFIG"


class SettingsError(ConfigurationError):
    """A setting is malformed, or a model entry cannot be served as configured; raised at startup with the
    setting's name and where its value came from."""


def env_name(key: str) -> str:
    """The environment variable of the setting ``key``.

    >>> env_name("max_inputs")
    'EMBEDRANK_MAX_INPUTS'
    """
    return PREFIX + key.upper()


def parse_model_entry(text: str) -> ModelEntry:
    """One ``EMBEDRANK_MODELS`` entry: ``id``, ``id=path`` or either with ``@backend[:precision]``.

    >>> parse_model_entry("minilm-int8=sentence-transformers/all-MiniLM-L6-v2@openvino:int8")
    ModelEntry(id='minilm-int8', path='sentence-transformers/all-MiniLM-L6-v2', aliases=(), ranges=None, calibration=None, backend='openvino', precision='int8', device=None, trust_remote_code=False, adapters=None)
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


DEFAULT_MODELS = DEFAULT_ENTRIES
_ENGINE = EngineConfig()
Positive = Meta(ge=1)


class _Group(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A group of settings: one concern, read as a whole by what it concerns."""


class Models(_Group, frozen=True):
    """The served models, and what each entry gets where it names nothing itself."""

    entries: Annotated[
        tuple[ModelEntry, ...],
        Meta(
            description="the served models. Environment: comma-separated `id` or `id=path`, each optionally "
            "ending in `@backend[:precision]`; file: one `[[models]]` table per model (keys below). The environment "
            "variable replaces every `[[models]]` table. A path `fake:encoder`, `fake:encoder-with-prompts`, "
            "`fake:encoder-with-adapters`, `fake:cross-encoder` or `fake:cross-encoder-with-adapters` serves a "
            "weightless fake for testing clients"
        ),
    ] = msgspec.field(default=DEFAULT_MODELS, name="models")
    backend: Annotated[
        str | None,
        Meta(
            description="the runtime of every model whose entry names none: `openvino`, `torch`, `onnx` or "
            "`auto` (unset: `openvino`, and a model it cannot export runs on torch)"
        ),
    ] = None
    precision: Annotated[
        str | None,
        Meta(
            description="the precision of every model whose entry names none: `fp32`, `bf16`, `fp16` (torch on a "
            "GPU), `int8` or `auto` (unset: `fp32`; on a GPU, half precision)"
        ),
    ] = None
    device: Annotated[
        str | None,
        Meta(
            description="where every model whose entry names none runs: `cpu`, `cuda`, `cuda:<index>` or `auto` "
            "(a GPU where there is one; unset: `cpu`); on a GPU a model runs on torch in fp16 (bf16 if saved in "
            "bfloat16) unless its backend and precision are named"
        ),
    ] = None
    trust_remote_code: Annotated[
        tuple[str, ...],
        Meta(
            description="ids of models whose own Python code may run (as `trust_remote_code = true` in the "
            "model's table); a model that needs it is refused at startup otherwise"
        ),
    ] = ()
    on_model_failure: Annotated[
        Literal["exit", "serve-others"],
        Meta(
            description="a model that cannot be loaded: `exit` stops the start (one line on stderr, exit code 3); "
            "`serve-others` serves the models that loaded, `/health` says which failed and why, and a request "
            "for a failed one gets 503 with the reason (with no model loaded the start stops as with `exit`)"
        ),
    ] = "exit"

    def resolved(self) -> Models:
        """The entries with the group's backend, precision, device and trust applied where an entry names none.

        Raises:
            SettingsError: two entries share an id, or ``trust_remote_code`` names an id no entry has.
        """
        ids = [m.id for m in self.entries]
        duplicated = sorted({i for i in ids if ids.count(i) > 1})
        if duplicated:
            raise SettingsError(f"models: the id {duplicated[0]!r} is given to more than one model")
        unknown = set(self.trust_remote_code) - set(ids)
        if unknown:
            raise SettingsError(
                f"{env_name('trust_remote_code')} names {sorted(unknown)}, which no model entry has as its id"
            )
        entries = tuple(
            msgspec.structs.replace(
                m,
                trust_remote_code=m.trust_remote_code or m.id in self.trust_remote_code,
                backend=m.backend or self.backend,
                precision=m.precision or self.precision,
                device=m.device or self.device,
            )
            for m in self.entries
        )
        return msgspec.structs.replace(self, entries=entries)


class Auth(_Group, frozen=True):
    """Who may call the service."""

    api_keys: Annotated[
        tuple[str, ...],
        Meta(
            description="the keys clients send as `Authorization: Bearer <key>`; unset (and no key file): a "
            "random key is printed at startup. Set but empty: refused"
        ),
    ] = ()
    api_keys_file: Annotated[
        str | None, Meta(description="a file with one more key per line (`#` comments and blank lines skipped)")
    ] = None
    no_auth: Annotated[bool, Meta(description="serve without authentication (warned at startup)")] = False
    public_docs: Annotated[
        bool,
        Meta(
            description="serve the API's OpenAPI description (`/openapi.json`) and its Swagger UI (`/docs`) and "
            "ReDoc (`/docs/redoc`) pages without a key; false: they need a key like every route but `/health`"
        ),
    ] = True


MAX_FRONTS = 64
"""The most front processes a replica runs (``fronts``)."""


class Server(_Group, frozen=True):
    """The HTTP server: browsers, input decoding, timeouts and stopping."""

    cors_origins: Annotated[
        tuple[str, ...],
        Meta(
            description="browser origins allowed to call the API (`https://app.example.com`, or `*`); empty: CORS off"
        ),
    ] = ()
    token_ids: Annotated[
        Literal["cl100k_base", "off"],
        Meta(
            description="token-id arrays in `/v1/embeddings` input are decoded with OpenAI's `cl100k_base`; "
            "`off` refuses them with 400"
        ),
    ] = "cl100k_base"
    drain_seconds: Annotated[
        float,
        Meta(
            ge=0,
            description="on SIGTERM, how long the work in flight gets before every connection is closed "
            "(new requests get 503 at once)",
        ),
    ] = 30.0
    body_timeout_seconds: Annotated[
        float, Meta(gt=0, description="a request body that takes longer to arrive gets 408")
    ] = 30.0
    header_timeout_seconds: Annotated[
        float,
        Meta(gt=0, description="a connection that waits longer for a request's headers gets 408 and is closed"),
    ] = 20.0
    fronts: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_FRONTS,
            description="`python -m service`: HTTP front processes sharing the port, beside one engine process "
            "that computes for all of them; 0: one process does everything (as `litestar run` serves)",
        ),
    ] = 0

    @property
    def decodes_token_ids(self) -> bool:
        """Whether token-id input is read (as ``cl100k_base``) rather than refused."""
        return self.token_ids != "off"


class Limits(_Group, frozen=True):
    """What one request, one file and one key may hold: each bound is documented and answered with its status."""

    max_inputs: Annotated[int, Positive, Meta(description="texts per embeddings request")] = 2048
    max_documents: Annotated[int, Positive, Meta(description="documents per rerank request")] = 1000
    max_body_bytes: Annotated[
        int, Positive, Meta(description="bytes of a request body, after decompression (413 past it)")
    ] = 16 * 1024 * 1024
    max_text_chars: Annotated[int, Positive, Meta(description="characters per text")] = 100_000
    max_request_tokens: Annotated[
        int,
        Positive,
        Meta(
            description="tokens one request may hold after tokenizing and chunking; past it, 413 "
            "`request_too_large` before any of its work is queued"
        ),
    ] = 1_048_576
    max_multivector_tokens: Annotated[
        int,
        Positive,
        Meta(
            description="token vectors one multi-vector (bge-m3, ColBERT) answer may hold; past it, 400 before any work"
        ),
    ] = 8192
    max_images: Annotated[
        int, Positive, Meta(description="images per embeddings request, for image-text models (400 past it)")
    ] = 64
    max_image_bytes: Annotated[
        int,
        Positive,
        Meta(description="encoded bytes of one image (a data URL's length is judged before it is decoded; 413)"),
    ] = 10 * 1024 * 1024
    max_image_pixels: Annotated[
        int,
        Positive,
        Meta(
            description="pixels (width x height) one image may claim in its header; past it, 413 before "
            "anything is decompressed (decompression bombs)"
        ),
    ] = 40_000_000
    max_file_bytes: Annotated[
        int, Positive, Meta(description="bytes of a file uploaded to `/v1/files` (a batch's input; 413 past it)")
    ] = 100_000_000
    max_file_storage_per_key: Annotated[
        int,
        Positive,
        Meta(
            description="bytes the files of one API key may take together on the server's disk (uploads and batch "
            "results; an upload past it is refused with 429 `file_storage_exceeded`: delete files to make room)"
        ),
    ] = 10_000_000_000
    max_batch_lines: Annotated[
        int,
        Positive,
        Meta(description="request lines of one batch's input file (a batch whose file holds more fails)"),
    ] = 50_000
    max_batches_in_flight: Annotated[
        int, Positive, Meta(description="batches one API key may have unfinished at once (429 past it)")
    ] = 16
    max_vector_stores: Annotated[
        int,
        Positive,
        Meta(description="vector stores one API key may have at once, expired ones left out (429 past it)"),
    ] = 100
    max_vector_store_files: Annotated[
        int, Positive, Meta(description="files one vector store may hold (400 past it, before any is read)")
    ] = 10_000
    max_vector_store_chunks: Annotated[
        int,
        Positive,
        Meta(description="chunks one vector store may hold (a file that would pass it fails with `invalid_file`)"),
    ] = 1_000_000
    max_file_pages: Annotated[
        int, Positive, Meta(description="pages of a PDF attached to a vector store (past it the file fails)")
    ] = 2000
    file_read_seconds: Annotated[
        float,
        Meta(
            gt=0,
            description="seconds one file attached to a vector store may take to read (its text extracted, in a "
            "process of its own, killed past it; the file fails with `invalid_file`)",
        ),
    ] = 120.0
    file_read_cpu_seconds: Annotated[
        int, Positive, Meta(description="seconds of CPU reading one attached file may take (past it the file fails)")
    ] = 120
    file_read_memory: Annotated[
        int,
        Positive,
        Meta(
            description="bytes of memory the process reading one attached file may take beyond its start "
            "(past it the file fails)"
        ),
    ] = 1 << 30
    max_file_reads_per_key: Annotated[
        int,
        Positive,
        Meta(
            description="files of one API key read at once across the replicas (the others wait), so that no key "
            "takes every reading slot (8 a replica)"
        ),
    ] = 4
    max_searches_per_key: Annotated[
        int,
        Positive,
        Meta(
            description="vector store searches of one API key computed at once by a replica (the others wait; a "
            "replica searches in one thread per core, and no key holds all of them)"
        ),
    ] = 2
    max_filter_clauses: Annotated[
        int, Positive, Meta(description="clauses of a vector store search's `filters`, all levels together (400)")
    ] = 100
    max_filter_depth: Annotated[
        int, Positive, Meta(description="levels a vector store search's `filters` may nest (400 past it)")
    ] = 8


class Images(_Group, frozen=True):
    """Where the service may fetch an image a request names by URL (by default nowhere)."""

    image_url_hosts: Annotated[
        tuple[str, ...],
        Meta(
            description="hosts an `http(s)://` image may be fetched from (`images.example.com`, or `*.example.com` "
            "for its subdomains); empty: a remote image is a 400 and nothing is fetched"
        ),
    ] = ()
    image_url_private: Annotated[
        bool,
        Meta(
            description="allow those hosts to resolve to loopback, private or link-local addresses (an intranet "
            "image server); off: such an address is refused whatever the host's name"
        ),
    ] = False
    image_fetch_seconds: Annotated[
        float, Meta(gt=0, description="seconds one image's fetch may take, connecting included (400 past it)")
    ] = 10.0


class Engine(_Group, frozen=True):
    """How each model's forward passes are batched and queued, and their memory given back."""

    max_queue: Annotated[
        int, Positive, Meta(description="items waiting for a forward pass; past it, 429 with `Retry-After`")
    ] = _ENGINE.max_queue_items
    max_queue_seconds: Annotated[
        float,
        Meta(
            gt=0,
            description="a request whose estimated wait for its first forward pass is longer gets 429 "
            "with `Retry-After`",
        ),
    ] = _ENGINE.max_queue_seconds
    target_batch_seconds: Annotated[
        float,
        Meta(
            ge=0,
            description="a forward batch holds what the measured speed computes in about this long, so a "
            "new request waits about as long on any CPU; 0: always `max_batch_tokens`",
        ),
    ] = _ENGINE.target_batch_seconds or 0.0
    max_batch_tokens: Annotated[
        Annotated[int, Positive] | None,
        Meta(
            description=f"padded tokens per forward batch, at most (unset: {CPU_BATCH_TOKENS} on the CPU; on a GPU, "
            f"what a quarter of its free memory holds for the model, at most {GPU_MAX_BATCH_TOKENS})"
        ),
    ] = None
    max_batch_size: Annotated[
        Annotated[int, Positive] | None,
        Meta(
            description=f"texts per forward batch, at most (unset: {CPU_BATCH_SIZE} on the CPU, {GPU_BATCH_SIZE} "
            "on a GPU)"
        ),
    ] = None
    batch_wait_ms: Annotated[
        float,
        Meta(
            ge=0,
            description="the most a batch waits for concurrent callers to rejoin (a lone request never waits); 0: off",
        ),
    ] = _ENGINE.max_wait_ms
    idle_seconds: Annotated[
        float, Meta(gt=0, description="after this long without work, freed activation memory is given back")
    ] = _ENGINE.idle_seconds
    tune_malloc: Annotated[
        bool,
        Meta(
            description="reuse freed activation memory while busy and give it back after `idle_seconds` "
            "(glibc only); false: the allocator's defaults"
        ),
    ] = True

    def engine_config(self) -> EngineConfig:
        """The serving layer's engine configuration these settings describe."""
        return EngineConfig(
            max_batch_tokens=self.max_batch_tokens,
            target_batch_seconds=self.target_batch_seconds or None,
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.batch_wait_ms,
            max_queue_items=self.max_queue,
            max_queue_seconds=self.max_queue_seconds,
            idle_seconds=self.idle_seconds,
        )


class Batches(_Group, frozen=True):
    """The Batch API's database, files and claims."""

    batch_dir: Annotated[
        str | None,
        Meta(
            description="the folder of the Batch API's database and files, created on first use (default: "
            "`$XDG_DATA_HOME/embedrank/batches`, else `~/.local/share/embedrank/batches`)"
        ),
    ] = None
    batch_database: Annotated[
        str | None,
        Meta(
            description="the Batch API's database: unset, SQLite in `batch_dir` (one host); a `postgresql://` "
            "URL, a PostgreSQL server that replicas share (each with `batch_dir` on a folder they all reach; "
            'needs `pip install "embedrank[postgres]"`)'
        ),
    ] = None
    batch_lease_seconds: Annotated[
        float,
        Meta(
            gt=0,
            description="how long a claim on a batch's chunk of lines lasts unless renewed (a running chunk renews "
            "it every third of this): a replica that dies has its chunks run by another after this long",
        ),
    ] = 60.0

    def folder(self) -> Path:
        """The Batch API's folder: ``batch_dir``, else :func:`default_batch_dir`."""
        return Path(self.batch_dir).expanduser() if self.batch_dir else default_batch_dir()


class Cache(_Group, frozen=True):
    """The embedding cache: the dense vectors of texts already embedded, kept on disk."""

    embedding_cache_bytes: Annotated[
        int,
        Meta(
            ge=0,
            description="the embedding cache's bound, in bytes of vectors (least recently used evicted past it); "
            "0: no cache. Batch lines always use it, direct requests when `embedding_cache_direct` is set",
        ),
    ] = 1 << 30  # 1 GiB: about 650,000 vectors of 384 floats
    embedding_cache_dir: Annotated[
        str | None,
        Meta(
            description="the folder of the embedding cache's file, `embedding-cache.db` (default: `batch_dir`); "
            "a local disk when `batch_dir` is on a network file system",
        ),
    ] = None
    embedding_cache_direct: Annotated[
        bool,
        Meta(description="direct embedding requests use the embedding cache too (batch lines always do)"),
    ] = False

    def file(self, batches: Batches) -> Path | None:
        """The cache's file (in ``batches``' folder unless ``embedding_cache_dir`` says); None when it is off."""
        if not self.embedding_cache_bytes:
            return None
        folder = Path(self.embedding_cache_dir).expanduser() if self.embedding_cache_dir else batches.folder()
        return folder / "embedding-cache.db"

    def vector_cache(self, batches: Batches) -> VectorCache | None:
        """The embedding cache these settings describe (at :meth:`file`, bounded by ``embedding_cache_bytes``);
        None when it is off."""
        path = self.file(batches)
        return VectorCache(path, self.embedding_cache_bytes) if path is not None else None


class Telemetry(_Group, frozen=True):
    """What the service tells its operator: log lines and metrics."""

    log_level: Annotated[
        Literal["debug", "info", "warning", "error"],
        Meta(
            description="the service's log lines at this level and above; `debug` also prints the traceback of a "
            "failure that stops the start (otherwise one line, exit code 3)"
        ),
    ] = "info"
    log_format: Annotated[
        Literal["text", "json"],
        Meta(
            description="`json`: every log line of the process as one JSON object (timestamp, level, logger, "
            "message, and for a request's lines its request_id, route, method, model, status and latency_ms)"
        ),
    ] = "text"
    access_log: Annotated[
        bool,
        Meta(
            description="one log line per request: its id, method, route, model, status and latency (`/metrics` "
            "counts them either way)"
        ),
    ] = False
    metrics_batch_ids: Annotated[
        bool,
        Meta(
            description="`/metrics` shows each unfinished batch's progress with its id (any key may read "
            "`/metrics`: off, the batches' lines are summed)"
        ),
    ] = False


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The settings table: every setting of the service in its group, with its type, default and meaning.

    Build it with :meth:`from_env` (the environment and the TOML file, checked) or directly, group by group.
    """

    models: Models = msgspec.field(default_factory=Models)
    auth: Auth = msgspec.field(default_factory=Auth)
    server: Server = msgspec.field(default_factory=Server)
    limits: Limits = msgspec.field(default_factory=Limits)
    images: Images = msgspec.field(default_factory=Images)
    engine: Engine = msgspec.field(default_factory=Engine)
    batches: Batches = msgspec.field(default_factory=Batches)
    cache: Cache = msgspec.field(default_factory=Cache)
    telemetry: Telemetry = msgspec.field(default_factory=Telemetry)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings of ``environ`` (default ``os.environ``) and of the TOML file its ``EMBEDRANK_CONFIG``
        names, checked (:meth:`checked`); see the module's docstring for precedence.

        Raises:
            SettingsError: a setting cannot be read; the message names it.
        """
        env = dict(os.environ if environ is None else environ)
        set_in_env = _from_environment(env)
        in_env = _convert(set_in_env, strict=False, where="environment")
        path = env.get(CONFIG_ENV, "").strip()
        file_data = _from_file(path) if path else {}
        in_file = _convert(file_data, strict=True, where=f"{CONFIG_ENV}={path}")
        settings = _overlaid(in_file, in_env, set_in_env)
        keys_source = env_name("api_keys") if "api_keys" in set_in_env else f"`api_keys` in {CONFIG_ENV}={path}"
        if ("api_keys" in set_in_env or "api_keys" in file_data) and not settings.auth.api_keys:
            raise SettingsError(
                f"{keys_source} is set but holds no key; give at least one, or unset it to have a key generated"
            )
        return settings.checked(keys_source=keys_source)

    def checked(self, *, keys_source: str = "api_keys") -> Settings:
        """These settings checked as a whole and resolved: the key file's keys added to ``auth.api_keys``, the
        model group's defaults applied to each entry.

        Raises:
            SettingsError: what no single setting's type says is wrong (a key a client cannot send, an origin
                with a path, a file where a folder belongs, a model's backend, precision or device).
        """
        keys = list(self.auth.api_keys)
        for key in keys:
            check_key(key, keys_source)
        if self.auth.api_keys_file:
            from_file = read_keys_file(self.auth.api_keys_file)
            for key in from_file:
                check_key(key, f"{env_name('api_keys_file')}={self.auth.api_keys_file}")
            keys += from_file
        for origin in self.server.cors_origins:
            _check_origin(origin)
        for host in self.images.image_url_hosts:
            _check_image_host(host)
        for name, folder in (
            ("batch_dir", self.batches.batch_dir),
            ("embedding_cache_dir", self.cache.embedding_cache_dir),
        ):
            if folder and Path(folder).expanduser().exists() and not Path(folder).expanduser().is_dir():
                raise SettingsError(
                    f"{env_name(name)} (`{name}` in a file) is {folder!r}, a file; name a folder "
                    "(it is created on first use)"
                )
        if self.batches.batch_database is not None:
            _check_batch_database(self.batches.batch_database)
        if self.models.device is not None:
            try:  # each model's own device is checked below
                check_device(self.models.device)
            except InvalidInputError as exc:
                raise SettingsError(f"{env_name('device')} (`device` in a file): {exc}") from None
        try:  # the names alone; each model's pair is checked below
            check_runtime(self.models.backend or "auto", self.models.precision or "auto")
        except InvalidInputError as exc:
            name = "backend" if exc.param == "backend" else "precision"
            raise SettingsError(f"{env_name(name)} (`{name}` in a file): {exc}") from None
        models = self.models.resolved()
        for entry in models.entries:
            if (entry.path or "").startswith("fake:"):
                continue
            try:
                check_runtime(entry.backend, entry.precision)
                check_device(entry.device)
            except InvalidInputError as exc:
                raise SettingsError(f"model {entry.id!r}: {exc}") from None
        auth = msgspec.structs.replace(self.auth, api_keys=tuple(dict.fromkeys(keys)))  # checking again: the same
        return msgspec.structs.replace(self, models=models, auth=auth)


# Variables read outside the service's table: the library's, and the project's own scripts'. An EMBEDRANK_
# variable in neither place is refused at startup (a misspelt setting would otherwise be silently ignored).
OTHER_ENVIRONMENT = {
    "library": {
        CONFIG_ENV: "the TOML file the service reads its settings from (the keys in the table above)",
        CACHE_ENV: "where exported runtimes and cached corpus vectors are kept (default: "
        "`$XDG_CACHE_HOME/embedrank`, else `~/.cache/embedrank`)",
        DATA_ENV: "the folder of BEIR-layout collections that `eval/run.py` and the benchmarks read",
    },
    "replica": {
        "EMBEDRANK_ENGINE_SOCKET": "set by `python -m service` for its front processes: the engine process's Unix "
        "socket (not a setting: a front started without its replica has no engine to reach)",
    },
    "development": {
        "EMBEDRANK_TEST_CACHE": "where the test suite keeps its cache (default: `.cache/tests` in the checkout)",
        "EMBEDRANK_TEST_DATA": "the collections the test suite's tests marked `data` read (default: `EMBEDRANK_DATA` "
        "as the suite starts; every other test sees an empty data directory)",
        "EMBEDRANK_NOTEBOOK_QUICK": "`1`: the notebooks run a shortened workload (the test suite sets it)",
        "EMBEDRANK_RERANKER": "the cross-encoder the retrieve-then-rerank notebook uses",
        "EMBEDRANK_FUZZ_COUNTS": "where `eval/fuzz/api.py`'s hooks write the cases per endpoint",
    },
}


class Setting(NamedTuple):
    """One setting of the table: its group, its attribute there, its type, default and help."""

    group: str
    attribute: str
    kind: Any
    default: Any
    help: str


@functools.cache
def fields() -> dict[str, Setting]:
    """Every setting of :class:`Settings` by its name (its TOML key), group by group (read once: the table is
    fixed)."""
    out = {}
    for group in msgspec.structs.fields(Settings):
        hints = typing.get_type_hints(group.type, include_extras=True)
        for field in msgspec.structs.fields(group.type):
            kind, *extras = typing.get_args(hints[field.name])
            help_text = next(m.description for m in extras if isinstance(m, Meta) and m.description)
            out[field.encode_name] = Setting(group.name, field.name, kind, field.default, help_text)
    return out


@functools.cache
def groups() -> dict[str, type[msgspec.Struct]]:
    """Each group of the table by its name, in the table's order."""
    return {group.name: group.type for group in msgspec.structs.fields(Settings)}


@functools.cache
def known_environment() -> frozenset[str]:
    """Every ``EMBEDRANK_`` variable some part of embedrank reads."""
    settings = {env_name(name) for name in fields()}
    return frozenset(settings | {name for group in OTHER_ENVIRONMENT.values() for name in group})


def _is_text_list(kind: Any) -> bool:
    """Whether a setting's type is a list of texts (comma-separated in the environment, an array in a file)."""
    return typing.get_origin(kind) is tuple and typing.get_args(kind)[0] is str


_LIST_FIELDS = frozenset(name for name, setting in fields().items() if _is_text_list(setting.kind))


def _from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings the environment sets, as the text each variable holds (a list split on commas)."""
    stray = sorted(k for k in environ if k.startswith(PREFIX) and k not in known_environment())
    if stray:
        hints = [
            f"{name} (did you mean {close[0]}?)"
            if (close := difflib.get_close_matches(name, known_environment(), 1))
            else name
            for name in stray
        ]
        raise SettingsError(
            f"unknown environment variable {', '.join(hints)}: no embedrank setting has this name "
            "(the configuration reference lists them)"
        )
    data: dict[str, Any] = {}
    for name in fields():
        raw = environ.get(env_name(name))
        if raw is None or not raw.strip():
            continue
        if name in _LIST_FIELDS:
            data[name] = [part.strip() for part in raw.split(",") if part.strip()]
        elif name == "models":
            entries = [parse_model_entry(part.strip()) for part in raw.split(",") if part.strip()]
            data[name] = [msgspec.structs.asdict(entry) for entry in entries]
        else:
            data[name] = raw.strip()
    return data


def _from_file(path: str) -> dict[str, Any]:
    file = Path(path).expanduser()
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{CONFIG_ENV}={path}: {exc}") from exc


_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false (1 or 0 in the environment)",
    "str": "text",
    "array": "a list",
    "object": "a table",
    "null": "nothing",
}


def _plain(msg: str) -> str:
    """msgspec's message in the words of the reference (``Expected `int`, got `str``` -> ``expected an integer,
    got text``)."""
    msg = reworded(msg, _TYPE_WORDS)
    return msg[0].lower() + msg[1:]


def _unknown_key(where: str, key: str, known: list[str], table: str | None) -> SettingsError:
    close = difflib.get_close_matches(key, known, 1)
    guess = f" (did you mean `{close[0]}`?)" if close else ""
    if table is None:
        return SettingsError(
            f"{where}: unknown key `{key}`{guess} in the file; the keys are listed in the configuration reference"
        )
    keys = ", ".join(f"`{k}`" for k in known)
    return SettingsError(f"{where}: unknown key `{key}`{guess} in the [[models]] table {table}; the keys are {keys}")


def _convert(data: dict[str, Any], *, strict: bool, where: str) -> Settings:
    """Flat ``data`` (``{"max_inputs": 64}``, as the environment and the file name the settings) as
    :class:`Settings` (``limits.max_inputs``); a :class:`SettingsError` naming the setting and ``where``
    otherwise. A group's name is not a key: the file has no ``[limits]`` table."""
    grouped: dict[str, dict[str, Any]] = {}
    for name, value in data.items():
        if name in groups() and name not in fields():
            raise SettingsError(
                f"{where}: `{name}` is a group of the configuration reference, not a table of the file; write "
                "its keys at the top level (`max_inputs = 64`, not `[limits]`)"
            )
        if name not in fields():
            raise _unknown_key(where, name, list(fields()), None)
        grouped.setdefault(fields()[name].group, {})[name] = value
    try:
        return msgspec.convert(grouped, Settings, strict=strict)
    except msgspec.ValidationError as exc:
        msg, at = split_at(str(exc))
        path = (at or "").partition(".")[2]  # `limits.max_inputs` -> `max_inputs`, `models.models[0]` -> `models[0]`
        unknown = re.fullmatch(r"Object contains unknown field `(.+)`", msg)
        if unknown:  # only a [[models]] table can hold one: every other key was placed above
            raise _unknown_key(where, unknown[1], [f.name for f in msgspec.structs.fields(ModelEntry)], path) from None
        name = path.split("[", 1)[0].split(".", 1)[0]
        label = env_name(name) if where == "environment" else f"`{path}` in {where}"
        given = data.get(name)
        if msg.startswith("Invalid enum value"):
            msg = "must be one of " + ", ".join(f"`{v}`" for v in typing.get_args(fields()[name].kind))
        hint = ""
        if name in _LIST_FIELDS and isinstance(given, str):
            hint = f'; write a TOML array: {name} = ["{given}"]'
        value = f" (given {given!r})" if where == "environment" and name not in ("api_keys", "models") else ""
        raise SettingsError(f"{label}{value}: {_plain(msg)}{hint}") from None


def _overlaid(base: Settings, top: Settings, names: Iterable[str]) -> Settings:
    """``base`` with the settings ``names`` taken from ``top`` (the environment's over the file's)."""
    changed: dict[str, dict[str, Any]] = {}
    for name in names:
        setting = fields()[name]
        changed.setdefault(setting.group, {})[setting.attribute] = getattr(
            getattr(top, setting.group), setting.attribute
        )
    return msgspec.structs.replace(
        base,
        **{group: msgspec.structs.replace(getattr(base, group), **values) for group, values in changed.items()},
    )


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


def check_key(key: str, where: str) -> None:
    """A key a client can send in ``Authorization: Bearer <key>``: visible ASCII, no spaces, not empty."""
    if not key or any(not ("!" <= c <= "~") for c in key):
        raise SettingsError(
            f"{where}: an API key must be visible ASCII characters without spaces (a client sends it in an "
            "HTTP header); one key is not"
        )


def _check_origin(origin: str) -> None:
    if origin != "*" and not re.fullmatch(r"https?://[^/\s?#]+", origin):
        raise SettingsError(
            f"{env_name('cors_origins')}: {origin!r} is not an origin; write scheme://host[:port] with no path "
            "(https://app.example.com), or *"
        )


def _check_image_host(host: str) -> None:
    if not re.fullmatch(r"(\*\.)?[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*|\[?[0-9A-Fa-f:.]+\]?", host):
        raise SettingsError(
            f"{env_name('image_url_hosts')}: {host!r} is not a host; write a name (images.example.com), "
            "*.example.com for its subdomains, or an address, with no scheme, port or path"
        )


def _check_batch_database(url: str) -> None:
    where = f"{env_name('batch_database')} (`batch_database` in a file)"
    if not is_postgres_url(url):
        raise SettingsError(f"{where} is {redacted(url)!r}; name a PostgreSQL server, postgresql://user@host/database")
    if importlib.util.find_spec("psycopg") is None:
        raise SettingsError(
            f'{where} names a PostgreSQL server, which needs psycopg: pip install "embedrank[postgres]"'
        )


def default_batch_dir() -> Path:
    """Where the Batch API keeps its database and files unless ``batch_dir`` says: ``$XDG_DATA_HOME/embedrank/batches``
    (``~/.local/share/embedrank/batches``)."""
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "embedrank" / "batches"
