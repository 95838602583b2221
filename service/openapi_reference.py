"""The manual's HTTP API reference (``docs/http-api.md``), rendered from the service's own OpenAPI description
(what ``/openapi.json`` serves, with the default settings' limits): every route, its request body, its
responses and error codes, and every schema's fields. ``python -m service.openapi_reference >
docs/http-api.md`` writes it; a test checks that the page equals the description.
"""

from __future__ import annotations

import json
import re
from typing import Any

GENERIC_DESCRIPTIONS = {"Additional response", "Request fulfilled, document follows", "Document created, URL follows"}

CONSTRAINTS = {
    "minimum": ">= {}",
    "exclusiveMinimum": "> {}",
    "maximum": "<= {}",
    "exclusiveMaximum": "< {}",
    "minLength": "at least {} characters",
    "maxLength": "at most {} characters",
    "minItems": "at least {} items",
    "maxItems": "at most {} items",
    "pattern": "matches `{}`",
}


def openapi_document() -> dict[str, Any]:
    """The description a server with the default settings (the packaged model) serves at ``/openapi.json``;
    nothing is loaded to make it (the served models are described from their configuration)."""
    from litestar.serialization import encode_json

    from service.app import create_app
    from service.settings import Auth, Engine, Settings

    app = create_app(Settings(auth=Auth(api_keys=("reference",)), engine=Engine(tune_malloc=False)))
    document: dict[str, Any] = json.loads(encode_json(app.openapi_schema.to_schema()))  # as a client reads it
    return document


def _anchor(heading: str) -> str:
    """The id MkDocs gives a heading (Python-Markdown's ``toc`` slugify)."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower())


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def type_text(schema: dict[str, Any]) -> str:
    """A schema's type in words, with links to the named schemas it uses."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{_anchor(name)})"
    for key in ("allOf", "oneOf", "anyOf"):
        if key in schema:
            return " or ".join(dict.fromkeys(type_text(part) for part in schema[key]))
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    json_type = schema.get("type")
    if isinstance(json_type, list):
        return " or ".join(json_type)
    if json_type == "array":
        return f"array of {type_text(schema.get('items', {}))}"
    if json_type == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {type_text(schema['additionalProperties'])}"
    return str(json_type or "any")


def _constraints(schema: dict[str, Any]) -> list[str]:
    found = [text.format(schema[key]) for key, text in CONSTRAINTS.items() if key in schema]
    for key in ("allOf", "oneOf", "anyOf"):
        for part in schema.get(key, ()):
            found += _constraints(part)
    if "items" in schema:
        found += [
            f"each {c}" if not c.startswith("each ") else f"each item's {c[5:]}" for c in _constraints(schema["items"])
        ]
    return list(dict.fromkeys(found))


def _default(schema: dict[str, Any]) -> str:
    for part in (schema, *schema.get("oneOf", ()), *schema.get("anyOf", ())):
        if "default" in part:
            return f" Default `{json.dumps(part['default'])}`."
    return ""


def schema_section(name: str, schema: dict[str, Any]) -> list[str]:
    """A named schema: its description and a table of its fields (or its type)."""
    lines = [f"### {name}", ""]
    if schema.get("description"):
        lines += [_cell(schema["description"]), ""]
    properties = schema.get("properties")
    if not properties:
        return [*lines, f"Type: {type_text(schema)}.", ""]
    required = set(schema.get("required", ()))
    lines += ["| field | type | required | description |", "|---|---|---|---|"]
    for field, prop in properties.items():
        notes = [prop.get("description", "")]
        constraints = _constraints(prop)
        if constraints:
            notes.append("(" + "; ".join(constraints) + ")")
        text = _cell(" ".join(n for n in notes if n) + _default(prop))
        lines.append(f"| `{field}` | {_cell(type_text(prop))} | {'yes' if field in required else ''} | {text} |")
    return [*lines, ""]


def _operations(document: dict[str, Any]) -> list[tuple[str, list[str], dict[str, Any]]]:
    """``(method, paths, operation)`` for each operation, an operation served at several paths once."""
    grouped: dict[str, tuple[str, list[str], dict[str, Any]]] = {}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "delete", "head", "patch"):
                continue
            same = {k: v for k, v in operation.items() if k != "operationId"}
            key = method + json.dumps(same, sort_keys=True)
            grouped.setdefault(key, (method.upper(), [], operation))[1].append(path)
    return [(method, sorted(paths, key=lambda p: (-len(p), p)), op) for method, paths, op in grouped.values()]


def render_reference(document: dict[str, Any] | None = None) -> str:
    """The page: the API's description, a table of every route, each operation, then every schema."""
    document = openapi_document() if document is None else document
    info = document["info"]
    lines = [
        "# HTTP API reference",
        "",
        "<!-- rendered by `python -m service.openapi_reference > docs/http-api.md`: do not edit by hand -->",
        "",
        f"{info['title']} {info['version']}. {info['description']}",
        "",
        "A running server describes itself at `/openapi.json`, with Swagger UI at `/docs` and ReDoc at "
        "`/docs/redoc` (open without a key unless `public_docs` is off); this page is rendered from that "
        "description with the default settings, so the limits it quotes are the defaults "
        "([configuration reference](configuration.md)).",
        "",
        "| method | path | what it does |",
        "|---|---|---|",
    ]
    operations = _operations(document)
    for method, paths, operation in operations:
        title = f"{method} {paths[0]}"
        lines.append(
            f"| {method} | [{', '.join(f'`{p}`' for p in paths)}](#{_anchor(title)}) | {_cell(operation['summary'])} |"
        )
    lines.append("")
    for method, paths, operation in operations:
        lines += [f"## {method} {paths[0]}", "", f"**{_cell(operation['summary'])}.**", ""]
        if len(paths) > 1:
            lines += ["Also served at " + ", ".join(f"`{p}`" for p in paths[1:]) + ".", ""]
        if operation.get("description"):
            lines += [_cell(operation["description"]), ""]
        needs_key = operation.get("security", document.get("security")) not in ([], [{}])
        lines += ["Needs the API key." if needs_key else "Needs no key.", ""]
        parameters = operation.get("parameters", [])
        if parameters:
            lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
            for p in parameters:
                required = "yes" if p.get("required") else ""
                text = _cell(p.get("description", "") + _default(p.get("schema", {})))
                shape = _cell(type_text(p.get("schema", {})))
                lines.append(f"| `{p['name']}` | {p['in']} | {shape} | {required} | {text} |")
            lines.append("")
        body = operation.get("requestBody")
        if body:
            for media, content in body["content"].items():
                lines += [f"Request body (`{media}`): {type_text(content.get('schema', {}))}.", ""]
        lines += ["| status | body | when |", "|---|---|---|"]
        for status, response in sorted(operation.get("responses", {}).items()):
            content = response.get("content", {})
            shape = ", ".join(type_text(c.get("schema", {})) for c in content.values()) or "none"
            when = response.get("description", "")
            if when in GENERIC_DESCRIPTIONS:  # the framework's words for a success: say it plainly
                when = "success"
            lines.append(f"| {status} | {_cell(shape)} | {_cell(when)} |")
        lines.append("")
    lines += ["## Schemas", ""]
    for name, schema in sorted(document.get("components", {}).get("schemas", {}).items()):
        lines += schema_section(name, schema)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    import contextlib
    import sys

    with contextlib.redirect_stdout(sys.stderr):  # the app's log lines, while it describes itself
        page = render_reference()
    print(page, end="")
