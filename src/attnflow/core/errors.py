"""attnflow's exceptions: one root, user-input errors and numerical failures under it.

A library user catches :class:`AttnflowError` for anything attnflow raises on purpose.
:class:`InputError` (also a :class:`ValueError`, so ``except ValueError`` keeps working) means the
caller asked for something invalid; :class:`NumericalError` (also a :class:`FloatingPointError`)
means a computation left the range where it is meaningful (a blow-up, a step too small). The
message speaks of parameters as a Python caller names them (``dt``, ``integration.dt``); the
optional ``hint`` is structured (``{"param": "integration.dt", "value": 0.02}``) so that only the
command line turns it into a flag (``--set integration.dt=0.02``).

Anything else escaping attnflow is a bug: the CLI shows its traceback and asks for a report.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["AttnflowError", "FloatRangeError", "Hint", "InputError", "NumericalError", "UnsafeInputError", "hinted"]

_E = TypeVar("_E", bound=BaseException)


class Hint(dict[str, Any]):
    """A structured suggestion: ``param`` (dotted config key or keyword), an optional ``value`` to try."""

    def __init__(self, param: str, value: Any = None, *, text: str | None = None) -> None:
        super().__init__(param=param, value=value, text=text)

    @property
    def param(self) -> str:
        return str(self["param"])

    @property
    def value(self) -> Any:
        return self["value"]


class AttnflowError(Exception):
    """Root of every exception attnflow raises on purpose."""

    def __init__(self, message: str = "", *, hint: Hint | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class InputError(AttnflowError, ValueError):
    """The caller's input is invalid (a parameter, a file, a folder): one sentence says what and why."""


class UnsafeInputError(InputError):
    """Data from outside (a folder, config, model or token file) tried something it may not:
    name code, reach outside its folder, follow a symlink, or exceed a size bound."""


class NumericalError(AttnflowError, FloatingPointError):
    """A numerical failure: blow-up, non-finite state, a step size that underflows."""


class FloatRangeError(NumericalError, OverflowError):
    """A number left the float range (an energy ``F`` or a partition function ``Z`` at extreme
    weights). Also an :class:`OverflowError`, so a step that overflows is rejected like one."""


def hinted(error: _E, hint: Hint) -> _E:
    """``error`` with ``hint`` attached as ``error.hint``: for the built-in exceptions attnflow keeps
    for compatibility (``FileExistsError``, ``FileNotFoundError``), which cannot also be an
    :class:`InputError`. Returns ``error``, so ``raise hinted(FileExistsError(...), Hint(...))``."""
    error.hint = hint  # type: ignore[attr-defined]
    return error
