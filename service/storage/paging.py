"""Lists as OpenAI's are paged: newest first (or oldest, ``order="asc"``), after or before a row named by its id,
at most ``limit``, with whether more follow.

Rows are ordered by their table's ``seq`` (the order they were made in); a cursor is a row's id, found within the
same scope as the list (the owner's rows, a store's files), so another key's id finds nothing and pages nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar

from service.errors import NulCharacterError
from service.storage.database import Connection

Row = TypeVar("Row")
Order = Literal["asc", "desc"]


@dataclasses.dataclass(frozen=True)
class Page(Generic[Row]):
    """A page of a list: its ``rows`` (at most the limit) and whether more follow."""

    rows: list[Row]
    has_more: bool

    def cursors(self, key: str = "id") -> dict[str, Any]:
        """The list object's paging fields (``first_id``, ``last_id``, ``has_more``), each row's id its attribute
        ``key``."""
        return {
            "first_id": getattr(self.rows[0], key) if self.rows else None,
            "last_id": getattr(self.rows[-1], key) if self.rows else None,
            "has_more": self.has_more,
        }


def page(
    db: Connection,
    table: str,
    scope: str,
    args: tuple[Any, ...],
    convert: Callable[[Any], Row],
    *,
    limit: int,
    after: str | None = None,
    before: str | None = None,
    order: Order = "desc",
    cursor: str = "id",
    where: str = "",
    where_args: tuple[Any, ...] = (),
) -> Page[Row]:
    """The rows of ``table`` in ``scope`` (SQL conditions, their parameters ``args``: the owner's rows, a store's
    files) that also meet ``where`` (its parameters ``where_args``: a status, a purpose), ordered by ``seq``
    (``order``), those after the row whose ``cursor`` column is ``after`` and before the one that is ``before``
    (each looked up in ``scope``: an id it does not hold gives an empty page), at most ``limit``, each row
    ``convert``-ed.

    Raises:
        NulCharacterError: a cursor that holds a NUL character (no id does).
    """
    for name, value in (("after", after), ("before", before)):
        if value is not None and "\x00" in value:
            raise NulCharacterError(name)
    sql = f"SELECT * FROM {table} WHERE {scope}"
    params: list[Any] = list(args)
    if where:
        sql += f" AND {where}"
        params += where_args
    for name, value in (("after", after), ("before", before)):
        if value is None:
            continue
        sign = "<" if (name == "after") == (order == "desc") else ">"
        sql += f" AND seq {sign} (SELECT seq FROM {table} WHERE {cursor} = ? AND {scope})"
        params += [value, *args]
    sql += f" ORDER BY seq {'DESC' if order == 'desc' else 'ASC'} LIMIT ?"
    params.append(limit + 1)
    rows = [convert(row) for row in db.execute(sql, params)]
    return Page(rows[:limit], len(rows) > limit)
