"""sentence-transformers' ``Router``: models whose queries and documents take different modules.

An asymmetric model (``Router.for_query_document``) embeds queries with one stack of modules and documents
with another: a static embedding for queries (no transformer at query time) and a transformer for documents,
or two transformers. Its ``modules.json`` starts with a ``Router`` whose ``router_config.json`` names the
branches (``structure``: branch -> module folders), the default branch and optional ``route_mappings``
(``(task, modality)`` -> branch). Each branch is a model of its own here
(:func:`~embedrank.registry.describe` with ``branch=``); :class:`Branched` holds them, and :func:`pick_branch`
chooses one for a task as sentence-transformers does for text.

sentence-transformers calls a branch a *route*; embedrank says *branch*, so that a route is only ever an HTTP
route of the service. The former names (``RouteTable``, ``read_routes``, ``pick_route``, ``Routed``, ``routed``,
a model's ``routes`` and ``route_table``, a spec's ``routes`` and ``route``, ``describe(route=)``) still work
with a ``DeprecationWarning`` and are removed in the next release.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from embedrank.errors import InvalidInputError
from embedrank.models.prompts import DOCUMENT_NAMES, INPUT_TYPES, QUERY_NAMES
from embedrank.registry import ModelSpec, describe

F = TypeVar("F", bound=Callable[..., Any])
Key = tuple[str | None, str | None]  # (task, modality)


@dataclasses.dataclass(frozen=True)
class BranchTable:
    """A Router's branches, its default branch and its ``(task, modality) -> branch`` mappings."""

    branches: tuple[str, ...]
    default: str | None
    mappings: Mapping[Key, str] = dataclasses.field(default_factory=dict)


def read_branches(folder: str | Path) -> BranchTable:
    """The :class:`BranchTable` in ``folder/router_config.json`` (mapping keys as sentence-transformers
    writes them, ``"('query', None)"``); the default branch is the first one when the file names none and
    allows it, as sentence-transformers does."""
    config = json.loads(Path(folder, "router_config.json").read_text(encoding="utf-8"))
    branches = tuple(config["structure"])
    params = config.get("parameters") or {}
    mappings: dict[Key, str] = {}
    for key, branch in (params.get("route_mappings") or {}).items():
        task, modality = ast.literal_eval(key)
        mappings[(task, modality if isinstance(modality, str) or modality is None else None)] = branch
    default = params.get("default_route")
    if default is None and params.get("allow_empty_key", True):
        default = branches[0]
    return BranchTable(branches, default, mappings)


def pick_branch(table: BranchTable, task: str | None, modality: str = "text") -> str:
    """The branch for ``task`` (``"query"``, ``"document"``, ...; None: no task), as sentence-transformers'
    ``Router`` resolves it: ``(task, modality)``, ``(task, None)``, ``(None, modality)``, ``(None, None)``
    mappings, then a branch named like the task or the modality, then the default branch.

    >>> table = BranchTable(("query", "document"), "document")
    >>> pick_branch(table, "query"), pick_branch(table, None), pick_branch(table, "document")
    ('query', 'document', 'document')

    Raises:
        InvalidInputError: ``task`` names no branch and the table has none for it (``param="task"``).
    """
    for key in ((task, modality), (task, None), (None, modality), (None, None)):
        if key in table.mappings:
            return table.mappings[key]
    for name in (task, modality):
        if name in table.branches:
            return name
    if task is not None:
        raise InvalidInputError(
            f"the model has no branch for task {task!r}; its branches: {list(table.branches)}", param="task"
        )
    if table.default is None:
        raise InvalidInputError(
            f"name a task: the model has no default branch; its branches: {list(table.branches)}", param="task"
        )
    return table.default


def task_of(input_type: str | None = None, prompt_name: str | None = None) -> str | None:
    """The Router task a request names: ``"query"`` or ``"document"`` for the query and document input
    types and prompt names (``search_query``, ``passage``, ...), another prompt name as itself, else None.

    >>> task_of("search_query"), task_of(None, "passage"), task_of("clustering"), task_of()
    ('query', 'document', None, None)
    """
    names = INPUT_TYPES.get(input_type or "", ()) + ((prompt_name,) if prompt_name else ())
    if any(n in QUERY_NAMES for n in names):
        return "query"
    if any(n in DOCUMENT_NAMES for n in names):
        return "document"
    return prompt_name


class Branched:
    """The branches of a Router model: the model object is its default branch, :attr:`branches` maps every
    branch to the model that runs it (itself for the default branch), and :meth:`for_task` picks one."""

    spec: ModelSpec
    branches: dict[str, Any] = {}  # noqa: RUF012 - empty for every model that is no Router
    branch_table: BranchTable | None = None

    def add_branches(self, build: Callable[[ModelSpec], Any]) -> None:
        """Load every other branch of this Router model with ``build(branch_spec)`` (no-op for other models)."""
        if not self.spec.branches or self.spec.router is None:
            return
        source = self.spec.source if self.spec.source != "fake" else "local"
        branches = {}
        for branch in self.spec.branches:
            if branch == self.spec.branch:
                branches[branch] = self
                continue
            spec = describe(
                self.spec.model_id,
                self.spec.router,
                source,  # type: ignore[arg-type]
                trust_remote_code=self.spec.trust_remote_code,
                branch=branch,
            )
            branches[branch] = build(dataclasses.replace(spec, branches=(), router=None))
        self.branches, self.branch_table = branches, read_branches(self.spec.router)

    @property
    def routes(self) -> dict[str, Any]:
        """Deprecated name of :attr:`branches`."""
        _renamed("routes", "branches")
        return self.branches

    @property
    def route_table(self) -> BranchTable | None:
        """Deprecated name of :attr:`branch_table`."""
        _renamed("route_table", "branch_table")
        return self.branch_table

    def for_task(self, task: str | None) -> Any:
        """The model that runs ``task``'s branch (:func:`pick_branch`); this model when it is no Router."""
        if not self.branches or self.branch_table is None:
            return self
        return self.branches[pick_branch(self.branch_table, task)]


def on_branch(method: F) -> F:
    """Run ``method`` on the model of the branch its ``task`` argument picks (:meth:`Branched.for_task`)."""

    @functools.wraps(method)
    def run(self: Branched, *args: Any, task: str | None = None, **kwargs: Any) -> Any:
        return method(self.for_task(task), *args, task=task, **kwargs)

    return run  # type: ignore[return-value]


def _renamed(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is deprecated: a Router's routes are called branches ({new}); removed in the next release",
        DeprecationWarning,
        stacklevel=3,
    )


_FORMER_NAMES = {
    "RouteTable": "BranchTable",
    "read_routes": "read_branches",
    "pick_route": "pick_branch",
    "Routed": "Branched",
    "routed": "on_branch",
}


def __getattr__(name: str) -> Any:
    """The former names of this module's functions and classes, with a ``DeprecationWarning``."""
    if name in _FORMER_NAMES:
        _renamed(name, _FORMER_NAMES[name])
        return globals()[_FORMER_NAMES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
