"""Loading a package's public names on first use (PEP 562), one home for every package that does.

Light on purpose (standard library only): the packages' ``__init__`` modules import it before
anything else, and the command line's front door imports those packages without torch or numpy
(``tests/cli/test_front_door.py`` checks ``sys.modules``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str,
    exports: dict[str, str],
    public: Iterable[str],
    submodules: Iterable[str] | Mapping[str, str] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``(__getattr__, __dir__)`` of ``package``: a name of ``exports`` (name -> the
    module that defines it) or of ``submodules`` (names of the package's own submodules, or a mapping
    name -> any module's dotted path) is imported at its first access and then kept in the
    package's namespace (later accesses do not come back here); ``dir()`` lists ``public``.

    Use: ``__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)``.
    """
    namespace = sys.modules[package].__dict__
    subs = dict(submodules) if isinstance(submodules, Mapping) else {name: f"{package}.{name}" for name in submodules}
    names = sorted(public)

    def __getattr__(name: str) -> Any:
        if name in subs:
            value: Any = importlib.import_module(subs[name])
        elif name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return list(names)

    return __getattr__, __dir__
