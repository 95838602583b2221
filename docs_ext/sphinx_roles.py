"""A griffe extension for the manual's Python reference: docstrings' Sphinx roles (``:class:`Encoder```,
``:func:`~embedrank.x.f```, ``:meth:``, ``:mod:``, ``:data:``, ``:attr:``, ``:exc:``) become links to the
objects the reference renders, and plain code where it renders no such object, instead of raw text.

``help()`` and IDEs read the roles as they are written; only the rendered manual changes. mkdocs.yml names
this extension in mkdocstrings' options.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")
REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference"


def rendered_roots() -> list[str]:
    """The paths the reference pages render with their members (``::: path`` not followed by ``members: false``)."""
    roots = []
    for page in sorted(REFERENCE.glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.startswith("::: "):
                options = "\n".join(lines[i + 1 : i + 4])
                if "members: false" not in options:
                    roots.append(line[4:].strip())
    return roots


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring of the package once it is loaded (all names are known then)."""

    def __init__(self) -> None:
        super().__init__()
        self.roots = rendered_roots()

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(lambda m, obj=obj: self._replace(m, obj, pkg), obj.docstring.value)

    def _replace(self, match: re.Match[str], obj: griffe.Object, pkg: griffe.Module) -> str:
        short, name = match[1] == "~", match[2].strip().lstrip(".")
        shown = name.rsplit(".", 1)[-1] if short else name
        target = self._target(name, obj, pkg)
        return f"[`{shown}`][{target}]" if target else f"`{shown}`"

    def _target(self, name: str, obj: griffe.Object, pkg: griffe.Module) -> str | None:
        """The rendered object's path ``name`` refers to from ``obj``, or None."""
        candidates = [name] if name.startswith(pkg.name + ".") or name == pkg.name else []
        head = name.split(".")[0]
        with contextlib.suppress(Exception):  # griffe's NameResolutionError, or a name it cannot place
            candidates.append(obj.resolve(head) + name[len(head) :])
        for path in candidates:
            try:
                found = pkg.modules_collection[path] if path != pkg.name else pkg
            except (KeyError, ValueError):
                continue
            real_obj = found.final_target if found.is_alias else found  # type: ignore[union-attr]
            real = real_obj.path
            public = not any(part.startswith("_") for part in real.split("."))
            # the reference renders a member only with a docstring (mkdocstrings' show_if_no_docstring is off),
            # and a module only where a page names it (not as a submodule of another)
            shown = real in self.roots or (real_obj.docstring is not None and not real_obj.is_module)
            if public and shown and any(real == root or real.startswith(root + ".") for root in self.roots):
                return real
        return None


def _walk(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found += _walk(member)  # type: ignore[arg-type]
    return found
