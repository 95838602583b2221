"""sentence-transformers' ``Router``: models whose queries and documents take different modules.

An asymmetric model (``Router.for_query_document``) embeds queries with one stack of modules and documents
with another: a static embedding for queries (no transformer at query time) and a transformer for documents,
or two transformers. Its ``modules.json`` starts with a ``Router`` whose ``router_config.json`` names the
routes (``structure``: route -> module folders), the default route and optional ``route_mappings``
(``(task, modality)`` -> route). Each route is a model of its own here
(:func:`~embedrank.registry.describe` with ``route=``); :class:`Routed` holds them, and :func:`pick_route`
chooses one for a task as sentence-transformers does for text.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from embedrank.errors import InvalidInputError
from embedrank.models.prompts import DOCUMENT_NAMES, INPUT_TYPES, QUERY_NAMES
from embedrank.registry import ModelSpec, describe

F = TypeVar("F", bound=Callable[..., Any])
Key = tuple[str | None, str | None]  # (task, modality)


@dataclasses.dataclass(frozen=True)
class RouteTable:
    """A Router's routes, its default route and its ``(task, modality) -> route`` mappings."""

    routes: tuple[str, ...]
    default: str | None
    mappings: Mapping[Key, str] = dataclasses.field(default_factory=dict)


def read_routes(folder: str | Path) -> RouteTable:
    """The :class:`RouteTable` in ``folder/router_config.json`` (mapping keys as sentence-transformers
    writes them, ``"('query', None)"``); the default route is the first one when the file names none and
    allows it, as sentence-transformers does."""
    config = json.loads(Path(folder, "router_config.json").read_text(encoding="utf-8"))
    routes = tuple(config["structure"])
    params = config.get("parameters") or {}
    mappings: dict[Key, str] = {}
    for key, route in (params.get("route_mappings") or {}).items():
        task, modality = ast.literal_eval(key)
        mappings[(task, modality if isinstance(modality, str) or modality is None else None)] = route
    default = params.get("default_route")
    if default is None and params.get("allow_empty_key", True):
        default = routes[0]
    return RouteTable(routes, default, mappings)


def pick_route(table: RouteTable, task: str | None, modality: str = "text") -> str:
    """The route for ``task`` (``"query"``, ``"document"``, ...; None: no task), as sentence-transformers'
    ``Router`` resolves it: ``(task, modality)``, ``(task, None)``, ``(None, modality)``, ``(None, None)``
    mappings, then a route named like the task or the modality, then the default route.

    >>> table = RouteTable(("query", "document"), "document")
    >>> pick_route(table, "query"), pick_route(table, None), pick_route(table, "document")
    ('query', 'document', 'document')

    Raises:
        InvalidInputError: ``task`` names no route and the table has none for it (``param="task"``).
    """
    for key in ((task, modality), (task, None), (None, modality), (None, None)):
        if key in table.mappings:
            return table.mappings[key]
    for name in (task, modality):
        if name in table.routes:
            return name
    if task is not None:
        raise InvalidInputError(
            f"the model has no route for task {task!r}; its routes: {list(table.routes)}", param="task"
        )
    if table.default is None:
        raise InvalidInputError(
            f"name a task: the model has no default route; its routes: {list(table.routes)}", param="task"
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


class Routed:
    """The routes of a Router model: the model object is its default route, :attr:`routes` maps every
    route to the model that runs it (itself for the default route), and :meth:`for_task` picks one."""

    spec: ModelSpec
    routes: dict[str, Any] = {}  # noqa: RUF012 - empty for every model that is no Router
    route_table: RouteTable | None = None

    def add_routes(self, build: Callable[[ModelSpec], Any]) -> None:
        """Load every other route of this Router model with ``build(route_spec)`` (no-op for other models)."""
        if not self.spec.routes or self.spec.router is None:
            return
        source = self.spec.source if self.spec.source != "fake" else "local"
        routes = {}
        for route in self.spec.routes:
            if route == self.spec.route:
                routes[route] = self
                continue
            spec = describe(
                self.spec.model_id,
                self.spec.router,
                source,  # type: ignore[arg-type]
                trust_remote_code=self.spec.trust_remote_code,
                route=route,
            )
            routes[route] = build(dataclasses.replace(spec, routes=(), router=None))
        self.routes, self.route_table = routes, read_routes(self.spec.router)

    def for_task(self, task: str | None) -> Any:
        """The model that runs ``task``'s route (:func:`pick_route`); this model when it is no Router."""
        if not self.routes or self.route_table is None:
            return self
        return self.routes[pick_route(self.route_table, task)]


def routed(method: F) -> F:
    """Run ``method`` on the model of the route its ``task`` argument picks (:meth:`Routed.for_task`)."""

    @functools.wraps(method)
    def run(self: Routed, *args: Any, task: str | None = None, **kwargs: Any) -> Any:
        return method(self.for_task(task), *args, **kwargs)

    return run  # type: ignore[return-value]
