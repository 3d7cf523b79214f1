"""Warnings that point at the user's line: the first frame outside the attnflow package (or the
command-line command that made the call)."""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

#: The package directory as the interpreter spells module file names (``.../attnflow/``).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: The command-line layer: a warning raised under a command points at the command's own line, not at
#: typer's frame that called it.
_CLI_DIR = os.path.join(_PACKAGE_DIR, "cli") + os.sep


def caller_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` issued right here point at the first frame
    outside attnflow (the user's line), however deep inside the package the warning is raised; under
    the command line, at the command (``attnflow/cli/...``) that made the call.

    Call it directly in the ``warnings.warn(...)`` argument list: its own frame is not counted.
    """
    frame: FrameType | None = sys._getframe(1)  # the function that calls warnings.warn: stacklevel 1
    level = 1
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(_PACKAGE_DIR) or (level > 1 and name.startswith(_CLI_DIR)):
            break
        frame = frame.f_back
        level += 1
    return level


class AttnflowWarning(UserWarning):
    """Base of attnflow's own warnings about what a user gave it (the CLI reports them as one line,
    whichever line they point at). ``hint``: an optional structured suggestion
    (:class:`attnflow.core.errors.Hint`, a parameter and a value to try) that the CLI renders as a
    flag of the running command."""

    def __init__(self, message: Any = "", *args: Any, hint: Any = None) -> None:
        super().__init__(message, *args)
        self.hint = hint
