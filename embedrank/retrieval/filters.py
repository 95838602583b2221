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
_EXACT = 2**53
"""Integers up to this magnitude are exact in float64: a column of them is compared as floats."""


def _exact(value: Any) -> bool:
    return isinstance(value, float) or abs(value) <= _EXACT


@dataclasses.dataclass(frozen=True)
class Column:
    """One attribute over many documents, held for comparisons at C speed: each value's comparison type
    ``kinds`` ``(N,)`` (int8: missing, bool, number, string), the numbers ``(N,)`` (float64, NaN where none;
    ``exact`` when float64 holds every one of them), each string's rank ``codes`` ``(N,)`` (int32, -1 where none)
    among the distinct ``strings`` ``(S,)`` sorted, each boolean ``flags`` ``(N,)`` (int8, -1 where none), and the
    ``values`` ``(N,)`` themselves (objects: numbers float64 cannot hold exactly are compared as Python does)."""

    kinds: np.ndarray
    numbers: np.ndarray
    exact: bool
    codes: np.ndarray
    strings: np.ndarray
    flags: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, values: Sequence[Scalar | None]) -> Column:
        """The column of ``values``, one per document (None: the document lacks the key)."""
        kinds = np.fromiter((_KINDS[_kind(v)] if v is not None else 0 for v in values), np.int8, len(values))
        number, text, flag = kinds == _KINDS["number"], kinds == _KINDS["str"], kinds == _KINDS["bool"]
        column = np.empty(len(values), dtype=object)
        column[:] = list(values)
        numbers = np.full(len(values), np.nan)
        numbers[number] = [float(v) for v in column[number]]
        strings = sorted(set(column[text]))
        rank = {s: i for i, s in enumerate(strings)}
        codes = np.full(len(values), -1, dtype=np.int32)
        codes[text] = [rank[v] for v in column[text]]
        flags = np.full(len(values), -1, dtype=np.int8)
        flags[flag] = column[flag].astype(bool)
        ordered = np.empty(len(strings), dtype=object)
        ordered[:] = strings
        exact = all(_exact(v) for v in column[number])
        return cls(kinds, numbers, exact, codes, ordered, flags, column)

    def equal(self, value: Scalar) -> np.ndarray:
        """``(N,)`` bool: the documents whose value has ``value``'s type and equals it."""
        if _kind(value) == "bool":
            return self.flags == int(value)
        return self.compare("eq", value)

    def compare(self, op: str, value: Scalar) -> np.ndarray:
        """``(N,)`` bool: the documents whose value has ``value``'s type (a number or a string) and stands in
        ``op`` (``eq gt gte lt lte``) to it."""
        if _kind(value) == "str":
            left, right = (int(np.searchsorted(self.strings, value, side)) for side in ("left", "right"))
            if op == "eq":
                return (self.codes >= left) & (self.codes < right)
            lower, upper = {"gt": (right, None), "gte": (left, None), "lt": (0, left), "lte": (0, right)}[op]
            return (self.codes >= lower) & (self.codes < upper) if upper is not None else self.codes >= lower
        if self.exact and _exact(value):  # NaN, where a document has no number, compares false
            return np.asarray(COMPARISONS[op](self.numbers, float(value)), dtype=bool)
        same = self.kinds == _KINDS["number"]
        out = np.zeros(len(self.kinds), dtype=bool)
        out[same] = np.asarray(COMPARISONS[op](self.values[same], value), dtype=bool)
        return out


@dataclasses.dataclass(frozen=True)
class AttributeColumns:
    """Many documents' attributes by key, for filtering them all at once (:func:`allowed_rows`): a
    :class:`Column` per key."""

    size: int
    columns: Mapping[str, Column]

    @classmethod
    def of(cls, attributes: Sequence[Attributes]) -> AttributeColumns:
        """The columns of ``attributes``, one mapping per document."""
        raw: dict[str, list[Scalar | None]] = {}
        for row, attrs in enumerate(attributes):
            for key, value in attrs.items():
                if key not in raw:
                    raw[key] = [None] * len(attributes)
                raw[key][row] = value
        return cls(len(attributes), {key: Column.of(values) for key, values in raw.items()})


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
    column = columns.columns.get(where.key)
    if column is None:  # no document has the key: only ne and nin pass
        return np.full(columns.size, where.op in ("ne", "nin"))
    if where.op in ("in", "nin"):
        found = np.zeros(columns.size, dtype=bool)
        for value in where.value:
            found |= column.equal(value)
        return found if where.op == "in" else ~found
    if where.op == "eq":
        return column.equal(where.value)
    if where.op == "ne":
        return ~column.equal(where.value)
    return column.compare(where.op, where.value)
