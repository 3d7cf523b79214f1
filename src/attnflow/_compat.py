"""Module paths of attnflow 0.1's flat layout (``attnflow.fields``, ``attnflow.simulate``, ...) kept
importable: each old name is an alias of the module that now holds its code."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

#: Old flat module -> the module of the layered tree that holds its code. Names that are now
#: packages re-exporting the old module's contents (``weights``, ``kernels``, ``config``, ``io``,
#: ``sweep``, ``cli``) need no alias.
MODULE_ALIASES: dict[str, str] = {
    "attnflow._arrays": "attnflow.core.arrays",
    "attnflow.geometry": "attnflow.core.geometry",
    "attnflow.heads": "attnflow.core.heads",
    "attnflow.tokens": "attnflow.core.tokens",
    "attnflow.infinite": "attnflow.dynamics.infinite",
    "attnflow.fastsum": "attnflow.kernels.fastsum",
    "attnflow.backends": "attnflow.kernels.dispatch",
    "attnflow.fields": "attnflow.dynamics.fields",
    "attnflow.stability": "attnflow.dynamics.lipschitz",
    "attnflow.integrators": "attnflow.schemes.integrators",
    "attnflow.jko": "attnflow.schemes.jko",
    "attnflow.validation": "attnflow.config.validation",
    "attnflow.diagnostics": "attnflow.analysis.diagnostics",
    "attnflow.edi": "attnflow.analysis.edi",
    "attnflow.limits": "attnflow.analysis.limits",
    "attnflow.distances": "attnflow.analysis.distances",
    "attnflow.simulate": "attnflow.solve.simulation",
    "attnflow.checkpoint": "attnflow.io.checkpoint",
    "attnflow.guards": "attnflow.solve.guards",
    "attnflow.ensemble": "attnflow.solve.ensemble",
    "attnflow.views": "attnflow.viz.views",
    "attnflow.plotting": "attnflow.viz.plotting",
    "attnflow.report": "attnflow.viz.report",
    "attnflow.movie": "attnflow.viz.movie",
    "attnflow.runner": "attnflow.runs.runner",
    "attnflow.sweep_spec": "attnflow.sweep.spec",
    "attnflow.sweep_table": "attnflow.sweep.table",
    "attnflow.phase": "attnflow.sweep.phase",
}


#: Old module paths that are also public functions of ``attnflow`` (``attnflow.simulate``): importing
#: the path makes the import system set ``attnflow.simulate`` to the module, so that module must stay
#: callable as the function was.
_CALLABLE_ALIASES: dict[str, str] = {"attnflow.simulate": "simulate"}


class _CallableModule(ModuleType):
    """A module that calls its function of the same name (see :data:`_CALLABLE_ALIASES`)."""

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self.simulate(*args, **kwargs)


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target
        self.target_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.target_spec = module.__spec__
        if spec.name in _CALLABLE_ALIASES and type(module) is ModuleType:
            module.__class__ = _CallableModule
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The target already ran; the import system stamped the alias's spec on it, so restore its own.
        module.__spec__ = self.target_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULE_ALIASES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(MODULE_ALIASES[fullname]))


def install_module_aliases() -> None:
    """Put the alias finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
