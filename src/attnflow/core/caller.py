"""Warnings that point at the user's line: the first frame outside the attnflow package."""

from __future__ import annotations

import os
import sys
from types import FrameType

#: The package directory as the interpreter spells module file names (``.../attnflow/``).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def caller_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` issued right here point at the first frame
    outside attnflow (the user's line), however deep inside the package the warning is raised.

    Call it directly in the ``warnings.warn(...)`` argument list: its own frame is not counted.
    """
    frame: FrameType | None = sys._getframe(1)  # the function that calls warnings.warn: stacklevel 1
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


class AttnflowWarning(UserWarning):
    """Base of attnflow's own warnings about what a user gave it (the CLI reports them as one line,
    whichever line they point at)."""
