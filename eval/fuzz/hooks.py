"""Schemathesis hooks for ``eval/fuzz/api.py`` (loaded through ``SCHEMATHESIS_HOOKS=eval.fuzz.hooks``).

- Every call is counted by operation, phase and generation mode, and the counts are written as JSON to
  ``$EMBEDRANK_FUZZ_COUNTS`` when the run ends, so the harness can show how many cases each endpoint got.
- Two kinds of rejection are exempt from ``positive_data_acceptance``, and only those: a text longer than
  the model's token limit sent with ``"truncate": false`` (Cohere's ``"NONE"``) is refused with 400 ``input_too_long``. A token
  limit cannot be written in JSON Schema (it depends on the tokenizer), so the schema cannot call such a
  request invalid; the server must refuse it rather than cut the text silently. The case is still sent and
  every other check (no 5xx, documented status, content type, response schema) still applies to it.
  The same holds for a ``chunk_overlap`` over half the window (400 ``chunk_overlap_too_large``): the window
  depends on the model, its prompt and the query. And ``output_not_available``: ``sparse`` or ``multivector``
  asked of a model that lacks it while one that has it is served (the schema offers them only then); and a
  ``prompt_name`` (an enum of every served model's prompts) asked of a model that does not have it. For vector
  stores: a ``file_id`` in the body that names no uploaded file of the key (400 ``file_not_found``: the schema
  cannot know which files exist; the path's store answers 404), and a static chunk larger than the store's model
  reads at once (400 ``chunk_too_large``: the window depends on the store's model), and a search's ``splade``
  stage asked of a store created without a SPLADE model (400 ``no_sparse_model``: the schema offers the stage
  only while a SPLADE model is served; which stores have one it cannot know).
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import threading
from typing import Any

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData

_counts: collections.Counter[str] = collections.Counter()
_lock = threading.Lock()


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    meta = case.meta
    phase = meta.phase.name.value if meta is not None else "explicit"
    mode = meta.generation.mode.value if meta is not None else "positive"
    with _lock:
        _counts[f"{case.operation.label}|{phase}|{mode}"] += 1


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure except the documented 400s to schema-valid requests (the module docstring's list)."""
    if isinstance(failure, RejectedPositiveData) and response.status_code == 400:
        body = case.body if isinstance(case.body, dict) else {}
        try:
            error = response.json()["error"]
            code = error["code"]
        except (ValueError, KeyError, TypeError):
            return True
        if code == "chunk_overlap_too_large":  # over half of this model's window (beside its prompt or query)
            return False
        if code == "output_not_available":  # sparse/multivector asked of a served model that lacks it
            return False
        if code in ("file_not_found", "chunk_too_large"):  # no such upload; a chunk past the store model's window
            return False
        if code == "no_sparse_model" and case.operation.path.endswith("/search"):  # a store without a SPLADE
            return False
        if code == "invalid_value" and error.get("param") == "prompt_name":
            return False  # a prompt another served model has, asked of one without it (a SPLADE has none)
        return not (code == "input_too_long" and body.get("truncate") in (False, "NONE"))
    return True


def _write_counts() -> None:
    path = os.environ.get("EMBEDRANK_FUZZ_COUNTS")
    if path:
        with open(path, "w") as f:
            json.dump(dict(_counts), f, indent=1, sort_keys=True)


atexit.register(_write_counts)
