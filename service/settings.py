"""The service's settings: one typed table, :class:`Config`, read from a TOML file and from the environment.

Every setting is a field of :class:`Config` with one name, one type, one default and one line of help. Its
TOML key is that name; its environment variable is the name in upper case after ``EMBEDRANK_``
(``max_inputs``: ``EMBEDRANK_MAX_INPUTS``). The TOML file is the one ``EMBEDRANK_CONFIG`` names. For each
setting, the environment variable wins over the file's key, and the file's key over the default; an empty
environment variable counts as unset. In the environment a list is comma-separated
(``EMBEDRANK_API_KEYS=key-1,key-2``); in the file it is a TOML array (``api_keys = ["key-1", "key-2"]``).

Anything the table cannot read stops the start with a :class:`SettingsError` naming the setting and where its
value came from: a value of the wrong type or out of range, a TOML key or ``[[models]]`` key the table does
not have, an ``EMBEDRANK_`` variable that no part of embedrank reads, an API key list that is set but holds no
key, a key that a client could not send. The configuration reference in the manual is rendered from the table
(:mod:`service.settings_reference`).

>>> settings = Settings.from_env({"EMBEDRANK_API_KEYS": "key-1,key-2", "EMBEDRANK_MAX_INPUTS": "64"})
>>> settings.api_keys, settings.limits.max_inputs
(('key-1', 'key-2'), 64)
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import os
import re
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from embedrank.errors import ConfigurationError, InvalidInputError
from embedrank.paths import CACHE_ENV, DATA_ENV
from embedrank.serving.engine import CPU_BATCH_SIZE, CPU_BATCH_TOKENS, EngineConfig
from embedrank.serving.hosting import GPU_BATCH_SIZE, GPU_MAX_BATCH_TOKENS
from embedrank.serving.pool import DEFAULT_ENTRIES, ModelEntry, check_device, check_runtime
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
    ModelEntry(id='minilm-int8', path='sentence-transformers/all-MiniLM-L6-v2', aliases=(), ranges=None, calibration=None, backend='openvino', precision='int8', device=None, trust_remote_code=False)
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
class Limits:
    max_inputs: int = 2048
    max_documents: int = 1000
    max_body_bytes: int = 16 * 1024 * 1024
    max_text_chars: int = 100_000
    max_request_tokens: int = 1_048_576  # tokens one request may hold after tokenizing (and chunking): 413 past it
    max_multivector_tokens: int = 8192  # bge-m3 token vectors one /v1/embeddings response may hold: 400 past it
    max_file_bytes: int = 100_000_000  # an uploaded batch input file: 413 past it
    max_batch_lines: int = 50_000  # request lines of one batch's input file: the batch fails past it
    max_batches_in_flight: int = 16  # unfinished batches of one API key: 429 past it


_LIMITS = Limits()
_ENGINE = EngineConfig()
DEFAULT_MODELS = DEFAULT_ENTRIES

DRAIN_SECONDS = 30.0
BODY_TIMEOUT_SECONDS = 30.0
HEADER_TIMEOUT_SECONDS = 20.0
BATCH_LEASE_SECONDS = 60.0
EMBEDDING_CACHE_BYTES = 1 << 30  # 1 GiB: about 650,000 vectors of 384 floats
Positive = Meta(ge=1)


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The settings table: every setting of the service, its type, default and meaning."""

    models: Annotated[
        tuple[ModelEntry, ...],
        Meta(
            description="the served models. Environment: comma-separated `id` or `id=path`, each optionally "
            "ending in `@backend[:precision]`; file: one `[[models]]` table per model (keys below). The environment "
            "variable replaces every `[[models]]` table. A path `fake:encoder`, `fake:encoder-with-prompts` or "
            "`fake:cross-encoder` serves a weightless fake for testing clients"
        ),
    ] = DEFAULT_MODELS
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
    max_inputs: Annotated[int, Positive, Meta(description="texts per embeddings request")] = _LIMITS.max_inputs
    max_documents: Annotated[int, Positive, Meta(description="documents per rerank request")] = _LIMITS.max_documents
    max_body_bytes: Annotated[
        int, Positive, Meta(description="bytes of a request body, after decompression (413 past it)")
    ] = _LIMITS.max_body_bytes
    max_text_chars: Annotated[int, Positive, Meta(description="characters per text")] = _LIMITS.max_text_chars
    max_request_tokens: Annotated[
        int,
        Positive,
        Meta(
            description="tokens one request may hold after tokenizing and chunking; past it, 413 "
            "`request_too_large` before any of its work is queued"
        ),
    ] = _LIMITS.max_request_tokens
    max_multivector_tokens: Annotated[
        int,
        Positive,
        Meta(
            description="token vectors one multi-vector (bge-m3, ColBERT) answer may hold; past it, 400 before any work"
        ),
    ] = _LIMITS.max_multivector_tokens
    max_file_bytes: Annotated[
        int, Positive, Meta(description="bytes of a file uploaded to `/v1/files` (a batch's input; 413 past it)")
    ] = _LIMITS.max_file_bytes
    max_batch_lines: Annotated[
        int,
        Positive,
        Meta(description="request lines of one batch's input file (a batch whose file holds more fails)"),
    ] = _LIMITS.max_batch_lines
    max_batches_in_flight: Annotated[
        int, Positive, Meta(description="batches one API key may have unfinished at once (429 past it)")
    ] = _LIMITS.max_batches_in_flight
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
    drain_seconds: Annotated[
        float,
        Meta(
            ge=0,
            description="on SIGTERM, how long the work in flight gets before every connection is closed "
            "(new requests get 503 at once)",
        ),
    ] = DRAIN_SECONDS
    body_timeout_seconds: Annotated[
        float, Meta(gt=0, description="a request body that takes longer to arrive gets 408")
    ] = BODY_TIMEOUT_SECONDS
    header_timeout_seconds: Annotated[
        float,
        Meta(gt=0, description="a connection that waits longer for a request's headers gets 408 and is closed"),
    ] = HEADER_TIMEOUT_SECONDS
    access_log: Annotated[
        bool,
        Meta(
            description="one log line per request: its id, method, route, model, status and latency (`/metrics` "
            "counts them either way)"
        ),
    ] = False
    on_model_failure: Annotated[
        Literal["exit", "serve-others"],
        Meta(
            description="a model that cannot be loaded: `exit` stops the start (one line on stderr, exit code 3); "
            "`serve-others` serves the models that loaded, `/health` says which failed and why, and a request "
            "for a failed one gets 503 with the reason (with no model loaded the start stops as with `exit`)"
        ),
    ] = "exit"
    public_docs: Annotated[
        bool,
        Meta(
            description="serve the API's OpenAPI description (`/openapi.json`) and its Swagger UI (`/docs`) and "
            "ReDoc (`/docs/redoc`) pages without a key; false: they need a key like every route but `/health`"
        ),
    ] = True
    log_level: Annotated[
        Literal["debug", "info", "warning", "error"],
        Meta(
            description="the service's log lines at this level and above; `debug` also prints the traceback of a "
            "failure that stops the start (otherwise one line, exit code 3)"
        ),
    ] = "info"
    metrics_batch_ids: Annotated[
        bool,
        Meta(
            description="`/metrics` shows each unfinished batch's progress with its id (any key may read "
            "`/metrics`: off, the batches' lines are summed)"
        ),
    ] = False
    log_format: Annotated[
        Literal["text", "json"],
        Meta(
            description="`json`: every log line of the process as one JSON object (timestamp, level, logger, "
            "message, and for a request's lines its request_id, route, method, model, status and latency_ms)"
        ),
    ] = "text"
    tune_malloc: Annotated[
        bool,
        Meta(
            description="reuse freed activation memory while busy and give it back after `idle_seconds` "
            "(glibc only); false: the allocator's defaults"
        ),
    ] = True
    batch_dir: Annotated[
        str | None,
        Meta(
            description="the folder of the Batch API's database and files, created on first use (default: "
            "`$XDG_DATA_HOME/embedrank/batches`, else `~/.local/share/embedrank/batches`)"
        ),
    ] = None
    embedding_cache_bytes: Annotated[
        int,
        Meta(
            ge=0,
            description="the embedding cache's bound, in bytes of vectors (least recently used evicted past it); "
            "0: no cache. Batch lines always use it, direct requests when `embedding_cache_direct` is set",
        ),
    ] = EMBEDDING_CACHE_BYTES
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
    batch_lease_seconds: Annotated[
        float,
        Meta(
            gt=0,
            description="how long a claim on a batch's chunk of lines lasts unless renewed (a running chunk renews "
            "it every third of this): a replica that dies has its chunks run by another after this long",
        ),
    ] = BATCH_LEASE_SECONDS
    batch_database: Annotated[
        str | None,
        Meta(
            description="the Batch API's database: unset, SQLite in `batch_dir` (one host); a `postgresql://` "
            "URL, a PostgreSQL server that replicas share (each with `batch_dir` on a folder they all reach; "
            'needs `pip install "embedrank[postgres]"`)'
        ),
    ] = None


# Variables read outside the service's table: the library's, and the project's own scripts'. An EMBEDRANK_
# variable in neither place is refused at startup (a misspelt setting would otherwise be silently ignored).
OTHER_ENVIRONMENT = {
    "library": {
        CONFIG_ENV: "the TOML file the service reads its settings from (the keys in the table above)",
        CACHE_ENV: "where exported runtimes and cached corpus vectors are kept (default: "
        "`$XDG_CACHE_HOME/embedrank`, else `~/.cache/embedrank`)",
        DATA_ENV: "the folder of BEIR-layout collections that `eval/run.py` and the benchmarks read",
    },
    "development": {
        "EMBEDRANK_TEST_CACHE": "where the test suite keeps its cache (default: `.cache/tests` in the checkout)",
        "EMBEDRANK_NOTEBOOK_QUICK": "`1`: the notebooks run a shortened workload (the test suite sets it)",
        "EMBEDRANK_RERANKER": "the cross-encoder the retrieve-then-rerank notebook uses",
        "EMBEDRANK_FUZZ_COUNTS": "where `eval/fuzz_api.py`'s hooks write the cases per endpoint",
    },
}


@functools.cache
def fields() -> dict[str, tuple[Any, Any, str]]:
    """Every setting of :class:`Config`: ``name -> (type, default, help)`` (read once: the table is fixed)."""
    hints = typing.get_type_hints(Config, include_extras=True)
    out = {}
    for field in msgspec.structs.fields(Config):
        annotated = hints[field.name]
        kind, *extras = typing.get_args(annotated)
        help_text = next(m.description for m in extras if isinstance(m, Meta) and m.description)
        out[field.name] = (kind, field.default, help_text)
    return out


@functools.cache
def known_environment() -> frozenset[str]:
    """Every ``EMBEDRANK_`` variable some part of embedrank reads."""
    settings = {env_name(name) for name in fields()}
    return frozenset(settings | {name for group in OTHER_ENVIRONMENT.values() for name in group})


def _is_text_list(kind: Any) -> bool:
    """Whether a setting's type is a list of texts (comma-separated in the environment, an array in a file)."""
    return typing.get_origin(kind) is tuple and typing.get_args(kind)[0] is str


_LIST_FIELDS = frozenset(name for name, (kind, _, _) in fields().items() if _is_text_list(kind))


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


def _convert(data: dict[str, Any], *, strict: bool, where: str) -> Config:
    """``data`` as a :class:`Config`; a :class:`SettingsError` naming the setting and ``where`` otherwise."""
    try:
        return msgspec.convert(data, Config, strict=strict)
    except msgspec.ValidationError as exc:
        msg, at = split_at(str(exc))
        path = at or ""
        unknown = re.fullmatch(r"Object contains unknown field `(.+)`", msg)
        if unknown:
            known = [f.name for f in msgspec.structs.fields(ModelEntry if path else Config)]
            close = difflib.get_close_matches(unknown[1], known, 1)
            guess = f" (did you mean `{close[0]}`?)" if close else ""
            table = f"the [[models]] table {path}" if path else "the file"
            choices = (
                "are " + ", ".join(f"`{k}`" for k in known) if path else "are listed in the configuration reference"
            )
            raise SettingsError(f"{where}: unknown key `{unknown[1]}`{guess} in {table}; the keys {choices}") from None
        name = path.split("[", 1)[0].split(".", 1)[0]
        label = env_name(name) if where == "environment" else f"`{path}` in {where}"
        given = data.get(name)
        if msg.startswith("Invalid enum value"):
            kind = fields()[name][0]
            msg = "must be one of " + ", ".join(f"`{v}`" for v in typing.get_args(kind))
        hint = ""
        if name in _LIST_FIELDS and isinstance(given, str):
            hint = f'; write a TOML array: {name} = ["{given}"]'
        value = f" (given {given!r})" if where == "environment" and name not in ("api_keys", "models") else ""
        raise SettingsError(f"{label}{value}: {_plain(msg)}{hint}") from None


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What the service runs on, built from a :class:`Config` (:meth:`from_env`) or directly (the tests)."""

    models: tuple[ModelEntry, ...] = DEFAULT_MODELS
    api_keys: tuple[str, ...] = ()
    no_auth: bool = False
    limits: Limits = dataclasses.field(default_factory=Limits)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    drain_seconds: float = DRAIN_SECONDS
    body_timeout_seconds: float = BODY_TIMEOUT_SECONDS
    header_timeout_seconds: float = HEADER_TIMEOUT_SECONDS
    access_log: bool = False
    log_level: str = "info"
    log_format: str = "text"
    metrics_batch_ids: bool = False
    on_model_failure: str = "exit"
    public_docs: bool = True
    tune_malloc: bool = True
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API; empty: CORS off
    token_ids: bool = True  # token-id input read as cl100k_base; False: refused
    batch_dir: str | None = None  # the Batch API's database and files; None: default_batch_dir()
    batch_database: str | None = None  # a postgresql:// URL; None: SQLite in batch_dir
    batch_lease_seconds: float = BATCH_LEASE_SECONDS  # a claim on a chunk lasts this long unless renewed
    embedding_cache_bytes: int = EMBEDDING_CACHE_BYTES  # 0: no embedding cache
    embedding_cache_dir: str | None = None  # None: the batch folder
    embedding_cache_direct: bool = False  # direct embedding requests use the cache too

    def batch_folder(self) -> Path:
        """The Batch API's folder: ``batch_dir``, else :func:`default_batch_dir`."""
        return Path(self.batch_dir).expanduser() if self.batch_dir else default_batch_dir()

    def embedding_cache_path(self) -> Path | None:
        """The embedding cache's file; None when it is off."""
        if not self.embedding_cache_bytes:
            return None
        folder = Path(self.embedding_cache_dir).expanduser() if self.embedding_cache_dir else self.batch_folder()
        return folder / "embedding-cache.db"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings of ``environ`` (default ``os.environ``) and of the TOML file its ``EMBEDRANK_CONFIG``
        names; see the module's docstring for precedence.

        Raises:
            SettingsError: a setting cannot be read; the message names it.
        """
        env = dict(os.environ if environ is None else environ)
        set_in_env = _from_environment(env)
        in_env = _convert(set_in_env, strict=False, where="environment")
        path = env.get(CONFIG_ENV, "").strip()
        file_data = _from_file(path) if path else {}
        in_file = _convert(file_data, strict=True, where=f"{CONFIG_ENV}={path}")
        config = msgspec.structs.replace(in_file, **{name: getattr(in_env, name) for name in set_in_env})
        keys_source = env_name("api_keys") if "api_keys" in set_in_env else f"`api_keys` in {CONFIG_ENV}={path}"
        if ("api_keys" in set_in_env or "api_keys" in file_data) and not config.api_keys:
            raise SettingsError(
                f"{keys_source} is set but holds no key; give at least one, or unset it to have a key generated"
            )
        return cls.of(config, keys_source=keys_source)

    @classmethod
    def of(cls, config: Config, *, keys_source: str = "api_keys") -> Settings:
        """The settings :class:`Config` describes, checked as a whole."""
        keys = list(config.api_keys)
        for key in keys:
            check_key(key, keys_source)
        if config.api_keys_file:
            from_file = read_keys_file(config.api_keys_file)
            for key in from_file:
                check_key(key, f"{env_name('api_keys_file')}={config.api_keys_file}")
            keys += from_file
        for origin in config.cors_origins:
            _check_origin(origin)
        for name in ("batch_dir", "embedding_cache_dir"):
            folder = getattr(config, name)
            if folder and Path(folder).expanduser().exists() and not Path(folder).expanduser().is_dir():
                raise SettingsError(
                    f"{env_name(name)} (`{name}` in a file) is {folder!r}, a file; name a folder "
                    "(it is created on first use)"
                )
        if config.batch_database is not None:
            _check_batch_database(config.batch_database)
        if config.device is not None:
            try:  # each model's own device is checked in validate()
                check_device(config.device)
            except InvalidInputError as exc:
                raise SettingsError(f"{env_name('device')} (`device` in a file): {exc}") from None
        try:  # the names alone; each model's pair is checked in validate()
            check_runtime(config.backend or "auto", config.precision or "auto")
        except InvalidInputError as exc:
            name = "backend" if exc.param == "backend" else "precision"
            raise SettingsError(f"{env_name(name)} (`{name}` in a file): {exc}") from None
        models = list(config.models)
        ids = [m.id for m in models]
        duplicated = sorted({i for i in ids if ids.count(i) > 1})
        if duplicated:
            raise SettingsError(f"models: the id {duplicated[0]!r} is given to more than one model")
        unknown = set(config.trust_remote_code) - set(ids)
        if unknown:
            raise SettingsError(
                f"{env_name('trust_remote_code')} names {sorted(unknown)}, which no model entry has as its id"
            )
        models = [
            msgspec.structs.replace(
                m,
                trust_remote_code=m.trust_remote_code or m.id in config.trust_remote_code,
                backend=m.backend or config.backend,
                precision=m.precision or config.precision,
                device=m.device or config.device,
            )
            for m in models
        ]
        settings = cls(
            models=tuple(models),
            api_keys=tuple(dict.fromkeys(keys)),
            no_auth=config.no_auth,
            limits=Limits(**{f.name: getattr(config, f.name) for f in dataclasses.fields(Limits)}),
            engine=EngineConfig(
                max_batch_tokens=config.max_batch_tokens,
                target_batch_seconds=config.target_batch_seconds or None,
                max_batch_size=config.max_batch_size,
                max_wait_ms=config.batch_wait_ms,
                max_queue_items=config.max_queue,
                max_queue_seconds=config.max_queue_seconds,
                idle_seconds=config.idle_seconds,
            ),
            drain_seconds=config.drain_seconds,
            body_timeout_seconds=config.body_timeout_seconds,
            header_timeout_seconds=config.header_timeout_seconds,
            access_log=config.access_log,
            log_level=config.log_level,
            log_format=config.log_format,
            metrics_batch_ids=config.metrics_batch_ids,
            public_docs=config.public_docs,
            on_model_failure=config.on_model_failure,
            tune_malloc=config.tune_malloc,
            cors_origins=config.cors_origins,
            token_ids=config.token_ids != "off",
            batch_dir=config.batch_dir,
            batch_database=config.batch_database,
            batch_lease_seconds=config.batch_lease_seconds,
            embedding_cache_bytes=config.embedding_cache_bytes,
            embedding_cache_dir=config.embedding_cache_dir,
            embedding_cache_direct=config.embedding_cache_direct,
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        """Check what no single setting's type says: each model's backend, precision and device (one this
        machine has)."""
        for entry in self.models:
            if (entry.path or "").startswith("fake:"):
                continue
            try:
                check_runtime(entry.backend, entry.precision)
                check_device(entry.device)
            except InvalidInputError as exc:
                raise SettingsError(f"model {entry.id!r}: {exc}") from None


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
