"""The manual's configuration reference (``docs/configuration.md``), rendered from the settings table
:class:`service.settings.Settings`; ``python -m service.settings_reference > docs/configuration.md`` writes it."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

import msgspec
from msgspec import Meta

from embedrank.serving.pool import DEFAULT_ENTRIES
from service.settings import OTHER_ENVIRONMENT, ModelEntry, env_name, fields, groups


def _type_name(kind: Any) -> str:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Annotated:  # a constrained type (a positive integer): its words are the base type's
        return _type_name(args[0])
    if kind is ModelEntry:
        return "model table"
    if origin is tuple:
        return f"list of {_type_name(args[0])}s"
    if origin is dict:
        return f"table of {_type_name(args[1])}s by name"
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None)) + " (optional)"
    return {str: "text", int: "integer", float: "number", bool: "boolean"}.get(kind, str(kind))


def _default_text(name: str, default: Any) -> str:
    if name == "models":
        return f"`{DEFAULT_ENTRIES[0].id}` (the packaged model)"
    if default is None or default == ():
        return "unset"
    if isinstance(default, bool):
        return "`true`" if default else "`false`"
    return f"`{default}`"


def render_reference() -> str:
    """The manual's configuration reference (``docs/configuration.md``), rendered from :class:`Settings`."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Rendered from service/settings.py (service/settings_reference.py) by `python -m service.settings_reference > docs/configuration.md`;"
        " a test checks that this page equals what the table renders. -->",
        "",
        "The HTTP service reads its settings from `EMBEDRANK_` environment variables and from a TOML file named",
        "by `EMBEDRANK_CONFIG`. Each setting has one TOML key and one environment variable, its key in upper case",
        "after `EMBEDRANK_`.",
        "",
        "**Precedence.** For each setting, the environment variable wins over the file's key, and the file's key",
        "over the default. An empty environment variable counts as unset. `EMBEDRANK_MODELS` replaces every",
        "`[[models]]` table of the file; the other lists are replaced, not merged, in the same way.",
        "",
        "**Types.** In the environment a list is comma-separated (`EMBEDRANK_API_KEYS=key-1,key-2`) and a boolean",
        "is `true`, `false`, `1` or `0`. In the file, values are TOML values: a list is an array",
        '(`api_keys = ["key-1", "key-2"]`), a number is not quoted.',
        "",
        "**Errors.** The service does not start, and says which setting is wrong and where its value came from,",
        "when a value has the wrong type or is out of range, the file has a key the table below does not have,",
        "an `EMBEDRANK_` variable is not one of those on this page, `api_keys` is set but holds no key, or a key",
        "is not visible ASCII without spaces.",
        "",
        "## Settings",
        "",
        "The settings are grouped by what they concern. The groups organize this page and the code that reads",
        "them; in the file every key stays at the top level, whatever its group.",
    ]
    for group, table in groups().items():
        lines += [
            "",
            f"### {group.capitalize()}",
            "",
            (table.__doc__ or "").strip(),
            "",
            "| file key | environment variable | type | default | meaning |",
            "|---|---|---|---|---|",
        ]
        for name, setting in fields().items():
            if setting.group == group:
                kind, default = _type_name(setting.kind), _default_text(name, setting.default)
                lines.append(f"| `{name}` | `{env_name(name)}` | {kind} | {default} | {setting.help} |")
    lines += [
        "",
        "## Model tables",
        "",
        "Each `[[models]]` table of the file describes one served model with these keys; an",
        "`EMBEDRANK_MODELS` entry `id=path@backend:precision` sets the first, second, fifth and sixth.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    hints = typing.get_type_hints(ModelEntry, include_extras=True)
    for field in msgspec.structs.fields(ModelEntry):
        kind, *extras = typing.get_args(hints[field.name])
        help_text = next(m.description for m in extras if isinstance(m, Meta) and m.description)
        default = "required" if field.required else _default_text(field.name, field.default)
        lines.append(f"| `{field.name}` | {_type_name(kind)} | {default} | {help_text} |")
    lines += [
        "",
        "## Example",
        "",
        "```toml",
        *EXAMPLE_TOML.strip().splitlines(),
        "```",
        "",
        "## Other environment variables",
        "",
        "| variable | read by | meaning |",
        "|---|---|---|",
    ]
    for group, reader in (("library", "the library and the service"), ("replica", "a front process")):
        for name, help_text in OTHER_ENVIRONMENT[group].items():  # the project's own scripts': the testing guide
            lines.append(f"| `{name}` | {reader} | {help_text} |")
    lines += [
        "",
        "## Tracing",
        "",
        "OpenTelemetry's own variables turn traces on; with none set the service records none. The",
        "[deployment guide](guides/deployment.md#tracing) says what each trace holds.",
        "",
        "| variable | meaning |",
        "|---|---|",
        *(f"| `{name}` | {help_text} |" for name, help_text in TRACING_ENVIRONMENT.items()),
    ]
    return "\n".join(lines) + "\n"


TRACING_ENVIRONMENT = {
    "OTEL_TRACES_EXPORTER": "the exporters, comma-separated: `otlp`, `console`, or another installed exporter's name; "
    "`none` (or unset, with no OTLP endpoint): no traces",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "the collector (`http://collector:4318`); set alone, it turns `otlp` on",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "the traces' own OTLP endpoint, if it differs",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "`http/protobuf` (default, installed) or `grpc` (install "
    "`opentelemetry-exporter-otlp-proto-grpc`)",
    "OTEL_EXPORTER_OTLP_HEADERS": "headers sent with each export (`api-key=...`)",
    "OTEL_SERVICE_NAME": "the `service.name` of the traces (default `embedrank`)",
    "OTEL_RESOURCE_ATTRIBUTES": "more attributes of the service (`deployment.environment=prod`)",
    "OTEL_TRACES_SAMPLER": "`parentbased_always_on` (default: every request, or as the caller's `traceparent` "
    "decided), `parentbased_traceidratio` with `OTEL_TRACES_SAMPLER_ARG=0.1` for 10%, `always_off`",
    "OTEL_PROPAGATORS": "how a caller's trace context is read (default `tracecontext,baggage`: W3C `traceparent`)",
    "OTEL_SDK_DISABLED": "`true`: no traces, whatever else is set",
}


EXAMPLE_TOML = """
api_keys_file = "/run/secrets/embedrank-keys"
max_inputs = 512
cors_origins = ["https://app.example.com"]

[[models]]
id = "sentence-transformers/all-MiniLM-L6-v2"
aliases = ["all-MiniLM-L6-v2", "text-embedding-3-small"]

[[models]]
id = "minilm-int8"
path = "sentence-transformers/all-MiniLM-L6-v2"
backend = "openvino"
precision = "int8"
"""


if __name__ == "__main__":
    print(render_reference(), end="")
