"""Attribute filters: evaluated over whole columns (what a store's search does), they give the answer of the
document-by-document reference, :func:`~embedrank.retrieval.filters.matches`, on every operator and every mix of
value types, a key missing, and nesting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedrank.retrieval.filters import AttributeColumns, allowed_rows, matches, parse_filter

pytestmark = pytest.mark.kernel_free

KEYS = ("year", "lang", "draft")
VALUES = st.one_of(
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, 2.0, -1.5, 2**60 + 1]),  # a float equal to an int, and an int past float64's precision
    st.sampled_from(["a", "b", "2", ""]),
)
DOCUMENTS = st.lists(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=3), min_size=1, max_size=12)


def comparison() -> st.SearchStrategy[dict]:
    scalar = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 2.0, 2**60, "a", "b", "2"]))
    ordered = st.builds(
        lambda op, key, value: {"type": op, "key": key, "value": value},
        st.sampled_from(["gt", "gte", "lt", "lte"]),
        st.sampled_from(KEYS),
        scalar,
    )
    equality = st.builds(
        lambda op, key, value: {"type": op, "key": key, "value": value},
        st.sampled_from(["eq", "ne"]),
        st.sampled_from(KEYS),
        st.one_of(scalar, st.booleans()),
    )
    membership = st.builds(
        lambda op, key, values: {"type": op, "key": key, "value": values},
        st.sampled_from(["in", "nin"]),
        st.sampled_from(KEYS),
        st.lists(scalar, max_size=3),
    )
    return st.one_of(ordered, equality, membership)


FILTERS = st.recursive(
    comparison(),
    lambda inner: st.builds(
        lambda op, filters: {"type": op, "filters": filters},
        st.sampled_from(["and", "or"]),
        st.lists(inner, min_size=1, max_size=3),
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(DOCUMENTS, FILTERS)
def test_a_filter_over_columns_answers_as_document_by_document(documents, raw):
    where = parse_filter(raw)
    expected = [matches(where, attributes) for attributes in documents]
    assert allowed_rows(where, AttributeColumns.of(documents)).tolist() == expected


def test_a_key_no_document_has_passes_ne_and_nin_only():
    columns = AttributeColumns.of([{"year": 2020}, {}])
    for op, value, passes in (("eq", 1, False), ("ne", 1, True), ("in", [1], False), ("nin", [1], True)):
        where = parse_filter({"type": op, "key": "author", "value": value})
        assert allowed_rows(where, columns).tolist() == [passes, passes]
