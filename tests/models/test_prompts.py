"""Query and document prompts on a local copy of the packaged model whose config names prompts: equal to
sentence-transformers' ``encode(..., prompt_name=...)``, ``encode_query`` and ``encode_document``."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from embedrank import Encoder
from embedrank.errors import InvalidInputError
from embedrank.models.scorers import BiEncoderScorer

PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = ["What causes the seasons?", "The tilt of Earth's axis causes the seasons.", "Bananas are rich in potassium."]


@pytest.fixture(scope="module")
def prompted_dir(tmp_path_factory, model_path):
    out = tmp_path_factory.mktemp("prompted") / "minilm-prompted"
    shutil.copytree(model_path, out)
    cfg_path = out / "config_sentence_transformers.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    cfg.update(prompts=PROMPTS, default_prompt_name=None)
    cfg_path.write_text(json.dumps(cfg))
    return str(out)


@pytest.fixture(scope="module")
def prompted(prompted_dir):
    return Encoder.from_pretrained(prompted_dir)


@pytest.fixture(scope="module")
def st_prompted(prompted_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(prompted_dir, device="cpu")


def test_prompts_are_read_from_the_models_own_files(prompted):
    assert prompted.prompts == PROMPTS
    assert (prompted.query_prompt, prompted.document_prompt) == ("query: ", "passage: ")


@pytest.mark.parametrize("name", ["query", "passage"])
def test_prompt_name_equals_sentence_transformers(prompted, st_prompted, name):
    ours = prompted.encode(TEXTS, prompt_name=name)
    ref = st_prompted.encode(TEXTS, prompt_name=name, convert_to_numpy=True)
    np.testing.assert_allclose(ours, ref, atol=1e-5)
    assert np.abs(ours - prompted.encode(TEXTS)).max() > 1e-3  # the prompt changed the vectors


def test_encode_query_and_document_equal_sentence_transformers(prompted, st_prompted):
    np.testing.assert_allclose(prompted.encode_query(TEXTS), st_prompted.encode_query(TEXTS), atol=1e-5)
    # encode_document takes the first of "document", "passage", "corpus" the model has, as sentence-transformers
    # 5 does. sentence-transformers 6 gives every model an empty "document" prompt, so its encode_document
    # drops an e5-style "passage: " prompt; we keep the model's own passage prompt.
    assert st_prompted.prompts["document"] == "" and "document" not in prompted.prompts
    ref = st_prompted.encode(TEXTS, prompt_name="passage")
    np.testing.assert_allclose(prompted.encode_document(TEXTS), ref, atol=1e-5)
    np.testing.assert_allclose(prompted.encode(TEXTS, prompt="query: "), prompted.encode_query(TEXTS), atol=1e-6)


def test_token_counts_include_the_prompt(prompted):
    plain = prompted.count_tokens(TEXTS)
    with_query = prompted.count_tokens(TEXTS, prompt_name="query")
    assert [a - b for a, b in zip(with_query, plain, strict=True)] == [2, 2, 2]  # "query", ":"
    out = prompted.encode_with_stats(TEXTS, prompt_name="query")
    assert out.token_counts == with_query
    assert prompted.tokens(["Hi"], prompt_name="query") == [["[CLS]", "query", ":", "hi", "[SEP]"]]


def test_unknown_prompt_name_lists_the_models_prompts(prompted):
    with pytest.raises(InvalidInputError, match=r"'doc'.*\['passage', 'query'\]"):
        prompted.encode(TEXTS, prompt_name="doc")
    with pytest.raises(InvalidInputError, match="not both"):
        prompted.encode(TEXTS, prompt_name="query", prompt="x")


def test_bi_encoder_scorer_uses_query_and_document_prompts(prompted):
    scores = BiEncoderScorer(prompted).score(TEXTS[0], TEXTS[1:])
    expected = prompted.encode_document(TEXTS[1:]) @ prompted.encode_query(TEXTS[:1])[0]
    np.testing.assert_allclose(scores, expected, atol=1e-5)


def test_the_corpus_cache_key_includes_the_document_prompt(prompted, encoder):
    from embedrank.retrieval.pipeline import encoder_cache_key

    assert "passage: " in encoder_cache_key(prompted) and "prompt" not in encoder_cache_key(encoder)
