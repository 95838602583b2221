"""Runners take explicit options: one a runner does not know is a TypeError, not silently dropped, and one
that does not apply to its model kind is refused with the field's name before any work."""

from __future__ import annotations

import asyncio

import pytest

from embedrank.errors import InvalidInputError
from embedrank.serving.engine import EngineConfig
from embedrank.serving.options import COHERE_FIELDS, TEI_FIELDS, EmbedOptions
from embedrank.serving.sparse import AsyncSparseEncoder
from embedrank.testing.fake import FakeSparseEncoder

pytestmark = pytest.mark.kernel_free


def test_an_unknown_option_is_a_type_error_and_normalize_is_refused_for_splade():
    runner = AsyncSparseEncoder(FakeSparseEncoder(), EngineConfig(max_wait_ms=0))
    with pytest.raises(TypeError, match="normalise"):
        EmbedOptions(normalise=True)  # type: ignore[call-arg]
    with pytest.raises(InvalidInputError, match="unnormalized") as err:
        asyncio.run(runner.embed(["x"], EmbedOptions(normalize=True)))
    assert err.value.param == "normalize"


@pytest.mark.parametrize(
    ("fields", "option", "param"),
    [(COHERE_FIELDS, "dimensions", "output_dimension"), (TEI_FIELDS, "truncation_side", "truncation_direction")],
)
def test_a_refused_option_names_the_field_of_the_request_that_sent_it(fields, option, param):
    runner = AsyncSparseEncoder(FakeSparseEncoder(), EngineConfig(max_wait_ms=0))
    value = {"dimensions": 8, "truncation_side": "left"}[option]
    with pytest.raises(InvalidInputError) as err:
        asyncio.run(runner.embed(["x"], EmbedOptions(fields=fields, **{option: value})))
    assert err.value.param == param
