"""Griffe extension for the API reference: Sphinx cross-reference roles become links.

attnflow's docstrings name other objects the reStructuredText way (``:func:`simulate```,
``:class:`~attnflow.io.trajectory.Trajectory```, ``:mod:`.fields```). mkdocstrings renders Markdown,
so this extension (listed under ``extensions`` in ``mkdocs.yml``) rewrites each role into an
autorefs link to the object's canonical path, resolved the way Python would: relative names
(``.fields``) against the package, bare names in the docstring owner's scope (its members and
imports, then its parents') and public names of ``attnflow`` through its lazy export table. A link whose target has no
rendered entry falls back to plain code (autorefs' ``optional`` flag) instead of a broken link.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(func|class|mod|meth|data|attr|exc|obj|const):`(~?)([\w.]+)`")


def _exports() -> dict[str, str]:
    import attnflow

    return dict(attnflow._EXPORTS)


class SphinxRoles(griffe.Extension):
    """Rewrite ``:role:`target``` in every docstring of the package into an autorefs link."""

    def __init__(self) -> None:
        super().__init__()
        self.exports = _exports()
        self.unresolved: list[tuple[str, str]] = []

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.path != "attnflow":
            return
        for obj in self._walk(pkg):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = ROLE.sub(lambda m, o=obj: self._link(o, loader, m), obj.docstring.value)
        if os.environ.get("ATTNFLOW_ROLES_REPORT"):
            for where, target in self.unresolved:
                print(f"unresolved role target {target!r} in {where}", file=sys.stderr)

    def _walk(self, obj: griffe.Object) -> Any:
        yield obj
        for member in obj.members.values():
            if not member.is_alias:
                yield from self._walk(member)

    def _canonical(self, path: str, role: str) -> str:
        """Lazily exported names (``attnflow.simulate``) -> where the code lives."""
        parts = path.split(".")
        if role != "mod" and len(parts) == 2 and parts[0] == "attnflow" and parts[1] in self.exports:
            return f"{self.exports[parts[1]]}.{parts[1]}"
        if len(parts) >= 2 and parts[0] == "attnflow" and parts[1] in self.exports:
            return ".".join([self.exports[parts[1]], *parts[1:]])
        return path

    def _resolve(self, obj: griffe.Object, target: str, role: str) -> str | None:
        module = obj if obj.is_module else obj.module
        if target.startswith("."):
            is_init = module.is_package or module.is_subpackage  # an __init__.py: relative to itself
            base = module.path if is_init else module.parent.path  # type: ignore[union-attr]
            path = base + target
        elif target.split(".")[0] == "attnflow":
            path = target
        else:
            first, _, rest = target.partition(".")
            try:
                path = obj.resolve(first) + ("." + rest if rest else "")
            except Exception:  # griffe.NameResolutionError and friends: not in scope
                if first not in self.exports:
                    return None
                path = f"attnflow.{target}"  # a public name of the package, written short
        return self._canonical(path, role)

    def _link(self, obj: griffe.Object, loader: griffe.GriffeLoader, m: re.Match[str]) -> str:
        role, tilde, target = m.groups()
        title = target.rsplit(".", 1)[-1] if tilde else target.lstrip(".")
        path = self._resolve(obj, target, role)
        found = None
        if path is not None:
            try:
                found = loader.modules_collection[path]
                if found.is_alias:
                    found = found.final_target
            except Exception:  # not loaded, or an alias that leads outside the package
                found = None
        if found is None:
            self.unresolved.append((obj.path, target))
            return f"`{title}`"
        return f'<autoref optional identifier="{found.path}"><code>{title}</code></autoref>'
