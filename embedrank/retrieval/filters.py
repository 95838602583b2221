"""Attribute filters, as OpenAI's Vector Stores API writes them: a comparison ``{"type": "eq", "key": "year",
"value": 2021}`` (``eq ne gt gte lt lte in nin``) or a compound ``{"type": "and", "filters": [...]}``
(``and``, ``or``), nested.

:func:`parse_filter` checks a filter's shape, depth and size once (every refusal names the clause at fault);
:func:`matches` evaluates the parsed filter on one document's attributes (a flat mapping of strings, numbers
and booleans), :func:`allowed_rows` on many documents' at once (their :class:`AttributeColumns`). Parsing is linear in the filter's size and refuses past ``max_clauses`` or ``max_depth`` before
it reads further, so a filter of ten thousand nested clauses costs a few microseconds, not a recursion error.

The comparison rules are OpenAI's: ``eq``/``ne`` compare values of the same type (a number never equals a
string); ``gt gte lt lte`` compare numbers with numbers and strings with strings, and are false for a document
whose value has the other type or that lacks the key; ``in``/``nin`` take a list. A document that lacks the key
matches ``ne`` and ``nin`` only.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

import numpy as np

from embedrank.errors import InvalidInputError, RequestTooLargeError

Scalar = str | int | float | bool
Attributes = Mapping[str, Scalar]

COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "gt": operator.gt,
    "gte": operator.ge,
    "lt": operator.lt,
    "lte": operator.le,
}
COMPOUNDS = ("and", "or")


Operator = Literal["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin"]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """``attributes[key] <op> value``; ``value`` is a tuple for ``in``/``nin``."""

    op: Operator
    key: str
    value: Any


@dataclasses.dataclass(frozen=True)
class Compound:
    op: Literal["and", "or"]
    filters: tuple[Filter, ...]


Filter = Comparison | Compound


def _kind(value: Any) -> str:
    """A value's comparison type: booleans are not numbers (``True == 1`` is false here)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "str" if isinstance(value, str) else "other"


def parse_filter(raw: Any, *, max_clauses: int = 100, max_depth: int = 8, param: str = "filters") -> Filter:
    """``raw`` (decoded JSON) as a :class:`Filter`, within ``max_clauses`` clauses (comparisons and compounds
    together) nested at most ``max_depth`` deep.

    >>> parse_filter({"type": "and", "filters": [{"type": "eq", "key": "a", "value": 1}]})
    Compound(op='and', filters=(Comparison(op='eq', key='a', value=1),))

    Raises:
        InvalidInputError: a malformed clause (``param`` names the field and the message the clause's path,
            ``filters.filters[2].value``).
        RequestTooLargeError: a filter past either bound (its ``limit`` names which).
    """
    count = 0

    def clause(node: Any, path: str, depth: int) -> Filter:
        nonlocal count
        count += 1
        if count > max_clauses:
            raise RequestTooLargeError(
                f"{param} has more than {max_clauses} clauses", param=param, limit="max_filter_clauses"
            )
        if depth > max_depth:
            raise RequestTooLargeError(
                f"{param} is nested more than {max_depth} deep ({path})", param=param, limit="max_filter_depth"
            )
        if not isinstance(node, dict):
            raise InvalidInputError(f"{path} must be an object with a 'type'", param=param)
        kind = node.get("type")
        kind = kind if isinstance(kind, str) else None
        if kind in COMPOUNDS:
            extra = set(node) - {"type", "filters"}
            children = node.get("filters")
            if extra or not isinstance(children, list) or not children:
                raise InvalidInputError(
                    f"{path}: a compound filter has 'type' and a non-empty list 'filters' only", param=param
                )
            if len(children) > max_clauses:
                raise RequestTooLargeError(
                    f"{param} has more than {max_clauses} clauses", param=param, limit="max_filter_clauses"
                )
            return Compound(
                cast(Literal["and", "or"], kind),
                tuple(clause(c, f"{path}.filters[{i}]", depth + 1) for i, c in enumerate(children)),
            )
        if kind in COMPARISONS or kind in ("in", "nin"):
            if set(node) != {"type", "key", "value"}:
                raise InvalidInputError(f"{path}: a comparison has exactly 'type', 'key' and 'value'", param=param)
            key, value = node["key"], node["value"]
            if not isinstance(key, str) or not key:
                raise InvalidInputError(f"{path}.key must be a non-empty string", param=param)
            if kind in ("in", "nin"):
                if not isinstance(value, list) or len(value) > max_clauses:
                    raise InvalidInputError(
                        f"{path}.value must be a list of at most {max_clauses} strings or numbers for {kind!r}",
                        param=param,
                    )
                if any(_kind(v) not in ("str", "number") for v in value):
                    raise InvalidInputError(f"{path}.value holds an item that is no string or number", param=param)
                return Comparison(cast(Operator, kind), key, tuple(value))
            if _kind(value) == "other":
                raise InvalidInputError(f"{path}.value must be a string, a number or a boolean", param=param)
            if kind not in ("eq", "ne") and _kind(value) == "bool":
                raise InvalidInputError(f"{path}: {kind!r} compares numbers or strings, not booleans", param=param)
            return Comparison(cast(Operator, kind), key, value)
        raise InvalidInputError(
            f"{path}.type must be one of {[*COMPARISONS, 'in', 'nin', *COMPOUNDS]}, got {str(kind)[:40]!r}",
            param=param,
        )

    return clause(raw, param, 1)


def matches(where: Filter, attributes: Attributes) -> bool:
    """Whether a document with ``attributes`` passes ``where``.

    >>> year = parse_filter({"type": "gte", "key": "year", "value": 2020})
    >>> matches(year, {"year": 2021}), matches(year, {"year": "2021"}), matches(year, {})
    (True, False, False)
    >>> matches(parse_filter({"type": "nin", "key": "lang", "value": ["de"]}), {})
    True
    """
    if isinstance(where, Compound):
        test = all if where.op == "and" else any
        return test(matches(f, attributes) for f in where.filters)
    present = where.key in attributes
    value = attributes.get(where.key)
    if where.op in ("in", "nin"):
        found = present and any(_kind(v) == _kind(value) and v == value for v in where.value)
        return found if where.op == "in" else not found
    same = present and _kind(value) == _kind(where.value)
    if where.op == "ne":
        return not (same and value == where.value)
    return same and COMPARISONS[where.op](value, where.value)


_KINDS = {"missing": 0, "bool": 1, "number": 2, "str": 3, "other": 4}


@dataclasses.dataclass(frozen=True)
class AttributeColumns:
    """Many documents' attributes by key, for filtering them all at once (:func:`allowed_rows`): per key, the
    documents' values ``(N,)`` (objects; None where missing) and each value's comparison type ``(N,)`` (int8:
    missing, bool, number, string)."""

    size: int
    values: Mapping[str, np.ndarray]
    kinds: Mapping[str, np.ndarray]

    @classmethod
    def of(cls, attributes: Sequence[Attributes]) -> AttributeColumns:
        """The columns of ``attributes``, one mapping per document."""
        values: dict[str, np.ndarray] = {}
        kinds: dict[str, np.ndarray] = {}
        for row, attrs in enumerate(attributes):
            for key, value in attrs.items():
                if key not in values:
                    values[key] = np.full(len(attributes), None, dtype=object)
                    kinds[key] = np.zeros(len(attributes), dtype=np.int8)
                values[key][row] = value
                kinds[key][row] = _KINDS[_kind(value)]
        return cls(len(attributes), values, kinds)


def allowed_rows(where: Filter, columns: AttributeColumns) -> np.ndarray:
    """``(N,)`` bool: the documents whose attributes pass ``where``, each clause evaluated over a whole column
    (the same answers as :func:`matches` document by document).

    >>> columns = AttributeColumns.of([{"year": 2021}, {"year": "2021"}, {}])
    >>> allowed_rows(parse_filter({"type": "gte", "key": "year", "value": 2020}), columns).tolist()
    [True, False, False]
    >>> allowed_rows(parse_filter({"type": "nin", "key": "year", "value": [2021]}), columns).tolist()
    [False, True, True]
    """
    if isinstance(where, Compound):
        parts = [allowed_rows(f, columns) for f in where.filters]
        return np.logical_and.reduce(parts) if where.op == "and" else np.logical_or.reduce(parts)
    values = columns.values.get(where.key)
    if values is None:  # no document has the key: only ne and nin pass
        return np.full(columns.size, where.op in ("ne", "nin"))
    kinds = columns.kinds[where.key]

    def equal(value: Any) -> np.ndarray:
        same = kinds == _KINDS[_kind(value)]
        out = np.zeros(columns.size, dtype=bool)
        out[same] = np.asarray(values[same] == value, dtype=bool)
        return out

    if where.op in ("in", "nin"):
        found = np.logical_or.reduce([equal(v) for v in where.value]) if where.value else np.zeros(columns.size, bool)
        return found if where.op == "in" else ~found
    if where.op == "eq":
        return equal(where.value)
    if where.op == "ne":
        return ~equal(where.value)
    same = kinds == _KINDS[_kind(where.value)]
    out = np.zeros(columns.size, dtype=bool)
    out[same] = np.asarray(COMPARISONS[where.op](values[same], where.value), dtype=bool)
    return out
