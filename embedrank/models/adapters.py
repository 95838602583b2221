"""A model's task adapters: the LoRA adapters an embedding model loads beside its base weights, and the one a
call's task picks.

Models such as jina-embeddings-v5 ship PEFT adapters in ``adapters/<task>/``; a team's own fine-tunes are PEFT
adapter folders saved over one base. :func:`adapter_folders` finds or takes them by name. A call names an adapter
(``adapter=``), or a task: a task named like an adapter picks it (jina's ``task="retrieval.query"``), and the query
and document roles (``encode_query``, ``encode_document``, the service's ``input_type``) pick the retrieval adapter
of their role (:data:`QUERY_ADAPTERS`, :data:`DOCUMENT_ADAPTERS`). An adapter's prompt is the model's prompt of the
same name, when it has one (:func:`adapter_prompt`). How the adapters run is the runtime's
(:mod:`embedrank.runtime.lora`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from embedrank.errors import InvalidInputError
from embedrank.registry import ModelSpec
from embedrank.runtime.backends import ElsewhereRuntime, PerAdapterRuntime, Runtime, TorchRuntime
from embedrank.runtime.lora import AdapterNames, RowAdapters, find_adapters, is_adapter, read_adapter

QUERY_ADAPTERS = ("retrieval.query", "query", "retrieval")
"""The adapter names a query looks for, in order (jina-embeddings-v3's, then one retrieval adapter for both roles,
as jina-embeddings-v5's)."""
DOCUMENT_ADAPTERS = ("retrieval.passage", "passage", "document", "retrieval")
"""The adapter names a document looks for, in order."""
ROLES = {"query": QUERY_ADAPTERS, "document": DOCUMENT_ADAPTERS}

Adapters = Mapping[str, "str | Path"] | Sequence["str | Path"] | None
LoadAdapted = Callable[[ModelSpec, str, str], Runtime]
"""Loads the runtime of one adapter's model (its spec, the backend, the precision)."""


def adapter_folders(model_path: str | Path, adapters: Adapters = None) -> dict[str, str]:
    """The adapters to load, by name: ``None`` takes those the model ships (:func:`~embedrank.runtime.lora.find_adapters`:
    ``adapters/<name>/`` or ``<name>/`` folders holding a PEFT adapter), a mapping names its folders, a sequence of
    folders is named by each folder's name; an empty one loads none.

    >>> adapter_folders("/nonexistent"), adapter_folders("/nonexistent", [])
    ({}, {})

    Raises:
        InvalidInputError: a folder holds no PEFT adapter, or two folders of a sequence have one name.
    """
    if adapters is None:
        return find_adapters(model_path)
    if isinstance(adapters, (str, Path)):
        raise InvalidInputError(
            "adapters takes a mapping of names to folders or a list of folders, not one folder", param="adapters"
        )
    named = (
        {str(k): str(v) for k, v in adapters.items()}
        if isinstance(adapters, Mapping)
        else {Path(p).name: str(p) for p in adapters}
    )
    if not isinstance(adapters, Mapping) and len(named) != len(adapters):
        raise InvalidInputError(f"two adapter folders have one name: {[str(p) for p in adapters]}", param="adapters")
    for name, folder in named.items():
        if not name:
            raise InvalidInputError("an adapter's name is empty", param="adapters")
        if not is_adapter(folder):
            raise InvalidInputError(
                f"adapter {name!r}: {folder} holds no PEFT adapter (adapter_config.json and adapter_model.safetensors)",
                param="adapters",
            )
    return named


def adapter_for(names: Sequence[str], task: str | None) -> str | None:
    """The adapter of ``names`` that ``task`` picks: the one named like the task, else for the ``"query"`` and
    ``"document"`` roles the first of :data:`ROLES` present; None (the base model) otherwise.

    >>> jina = ["retrieval.query", "retrieval.passage", "text-matching"]
    >>> adapter_for(jina, "query"), adapter_for(jina, "text-matching"), adapter_for(jina, "clustering")
    ('retrieval.query', 'text-matching', None)
    >>> adapter_for(["retrieval", "classification"], "document")
    'retrieval'
    """
    if task is None or not names:
        return None
    if task in names:
        return task
    return next((n for n in ROLES.get(task, ()) if n in names), None)


def role_of_task(task: str) -> str | None:
    """The role (``"query"``, ``"document"``) a task names: jina's retrieval tasks and the roles themselves; None for
    any other task.

    >>> role_of_task("retrieval.query"), role_of_task("retrieval.passage"), role_of_task("text-matching")
    ('query', 'document', None)
    """
    return next((role for role, names in ROLES.items() if task == role or task in names[:-1]), None)


def role_tasks() -> tuple[str, ...]:
    """The tasks that name a role (:func:`role_of_task`), which every model takes (one without adapters selects the
    role's prompt).

    >>> role_tasks()
    ('query', 'retrieval.query', 'document', 'retrieval.passage', 'passage')
    """
    return tuple(dict.fromkeys(name for role, names in ROLES.items() for name in (role, *names[:-1])))


def adapter_prompt(prompts: Mapping[str, str], adapter: str | None) -> str | None:
    """The name of the prompt that goes with ``adapter``: the model's prompt of the same name, else None.

    >>> adapter_prompt({"retrieval.query": "Represent the query: "}, "retrieval.query")
    'retrieval.query'
    """
    return adapter if adapter is not None and adapter in prompts else None


def attach_adapters(runtime: Runtime, spec: ModelSpec, folders: Mapping[str, str], load: LoadAdapted) -> Runtime:
    """``runtime`` running ``folders``' adapters too: on torch, each row's update added in one pass over a mixed
    batch (:class:`~embedrank.runtime.lora.RowAdapters`); on an exported backend, each adapter's own model, its
    updates merged into the weights and exported by ``load(spec_of_that_model, backend, precision)``, with the
    base runtime's backend and precision (:class:`~embedrank.runtime.backends.PerAdapterRuntime`); in a process
    whose forward passes run elsewhere, their names (rows carry an adapter's index there)."""
    if not folders:
        return runtime
    if isinstance(runtime, ElsewhereRuntime):  # a front's model: the adapters run where the weights are; named here
        runtime.adapters = AdapterNames(list(folders))
        return runtime
    if isinstance(runtime, TorchRuntime):
        runtime.adapters = RowAdapters(runtime.module, [read_adapter(f, n) for n, f in folders.items()])
        return runtime
    backend, precision = runtime.backend, runtime.precision
    adapted = {n: load(dataclasses.replace(spec, merged_adapter=f), backend, precision) for n, f in folders.items()}
    return PerAdapterRuntime(runtime, adapted)
