"""Edge cases schemathesis cannot send, for ``eval/fuzz/api.py``: numbers JSON can write but a 64-bit float
cannot hold, integers past every bound, and every chunking field at its bounds with texts long enough to chunk.

Cases are built from the served OpenAPI document, so a new field is covered without editing this file. For
every POST operation, from each of its request examples (with ``model`` set to a served model that the
example's request succeeds with):

- every integer field of the request (its own, or one of the other request shape of a shared route) at its
  schema's minimum and maximum, one past each, ``2**63``, ``1e400``, ``-1e400`` and ``1e-400`` written as
  JSON literals; the same under ``"chunking": true`` with texts of several windows, where the operation
  has ``chunking``;
- ``1e400`` as an unknown field, as each input, and as the whole body.

Each answer must be below 500, JSON, and a 4xx must carry the error shape; a 4xx to a number out of range
must name the field in ``param`` or the message.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

LONG = " ".join(["retrieval", "!", "3.14", "漢字"] * 1500)  # token-dense: ~6,000 words, several windows
OUT_OF_RANGE = ("1e400", "-1e400", "99999999999999999999999999999999999999e9999")


@dataclasses.dataclass(frozen=True)
class Edge:
    path: str
    body: bytes
    field: str  # the field the edge is about
    out_of_range: bool  # a number a 64-bit float cannot hold: a 4xx must name the field


def _resolve(schema: Any, components: dict[str, Any]) -> Any:
    while isinstance(schema, dict) and "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _integer_bounds(schema: Any, components: dict[str, Any]) -> tuple[float, float] | None:
    """The (minimum, maximum) of an integer field, looking through ``oneOf``/``anyOf``/``allOf``."""
    schema = _resolve(schema, components)
    if not isinstance(schema, dict):
        return None
    if schema.get("type") == "integer":
        return schema.get("minimum", -(2**63)), schema.get("maximum", 2**63 - 1)
    for key in ("oneOf", "anyOf", "allOf"):
        for sub in schema.get(key, []):
            found = _integer_bounds(sub, components)
            if found is not None:
                return found
    return None


def _properties(schema: Any, components: dict[str, Any]) -> dict[str, Any]:
    schema = _resolve(schema, components)
    if not isinstance(schema, dict):
        return {}
    props = dict(schema.get("properties", {}))
    for key in ("oneOf", "anyOf", "allOf"):
        for sub in schema.get(key, []):
            props.update(_properties(sub, components))
    return props


def _examples(content: dict[str, Any]) -> list[dict[str, Any]]:
    found = content.get("examples") or content.get("schema", {}).get("examples") or []
    if isinstance(found, dict):
        return [e["value"] for e in found.values()]
    return list(found)


def _long_texts(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with every text to embed or rerank replaced by :data:`LONG`."""
    out = dict(body)
    for key in ("input", "texts", "inputs", "documents"):
        value = out.get(key)
        if isinstance(value, str):
            out[key] = LONG
        elif isinstance(value, list):
            out[key] = [{**v, "text": LONG} if isinstance(v, dict) else LONG for v in value]
    return out


def _with_literal(body: dict[str, Any], field: str, literal: str) -> bytes:
    marker = "__EDGE_LITERAL__"
    return json.dumps({**body, field: marker}).replace(json.dumps(marker), literal).encode()


def edges(schema: dict[str, Any], bases: dict[str, list[dict[str, Any]]]) -> list[Edge]:
    """Every edge case of the POST operations in ``schema``; ``bases[path]`` are the valid bodies to start from."""
    components = schema.get("components", {}).get("schemas", {})
    out: list[Edge] = []
    for path, operations in sorted(schema["paths"].items()):
        post = operations.get("post")
        if post is None or path not in bases:
            continue
        content = post["requestBody"]["content"]["application/json"]
        props = _properties(content["schema"], components)
        for base in bases[path]:
            variants = [base]
            if "chunking" in props:
                variants.append({**_long_texts(base), "chunking": True})
            for variant in variants:
                for field, prop in sorted(props.items()):
                    bounds = _integer_bounds(prop, components)
                    if bounds is None:
                        continue
                    low, high = int(bounds[0]), int(bounds[1])
                    for value in (low, high, low - 1, high + 1, 2**63):
                        out.append(Edge(path, _with_literal(variant, field, str(value)), field, False))
                    for literal in OUT_OF_RANGE:
                        out.append(Edge(path, _with_literal(variant, field, literal), field, True))
                    out.append(Edge(path, _with_literal(variant, field, "1e-400"), field, False))
            out.append(Edge(path, _with_literal(base, "x_unknown", "1e400"), "x_unknown", True))
            for key in ("input", "texts", "inputs", "documents", "query"):
                if key in base:
                    out.append(Edge(path, _with_literal(base, key, "1e400"), key, True))
                    out.append(Edge(path, _with_literal(base, key, "[1e400]"), key, True))
        out.append(Edge(path, b"1e400", "", False))
    return out


def bases(schema: dict[str, Any], models: list[str], post: Any) -> dict[str, list[dict[str, Any]]]:
    """Each POST operation's request examples, with ``model`` set to a served model they succeed with;
    ``post(path, body) -> status``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path, operations in schema["paths"].items():
        content = operations.get("post", {}).get("requestBody", {}).get("content", {}).get("application/json")
        if content is None:  # no POST, or one without a JSON body (a file upload, a cancel)
            continue
        for example in _examples(content):
            for model in models if "model" in example else [None]:
                body = {**example, "model": model} if model else dict(example)
                if post(path, json.dumps(body).encode()) == 200:
                    out.setdefault(path, []).append(body)
                    break
    return out


def failure(edge: Edge, status: int, text: str) -> str | None:
    """Why an answer to ``edge`` is wrong, or None."""
    if status >= 500:
        return f"{status}: {text[:300]}"
    try:
        data = json.loads(text)
    except ValueError:
        return f"{status}, not JSON: {text[:200]}"
    if status < 400:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict) or not {"message", "type", "code"} <= error.keys():
        return f"{status} without the error shape: {text[:200]}"
    named = edge.field and (edge.field == (error.get("param") or "").split("[")[0] or edge.field in error["message"])
    if edge.out_of_range and edge.field and not named:
        return f"{status} does not name {edge.field!r}: {text[:200]}"
    return None
