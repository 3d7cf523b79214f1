"""Config -> run folder: :func:`run_config`, :func:`run_to_folder` with checkpoints, ``--resume`` and
folder status (:mod:`.runner`; the folder checks alone in :mod:`.folders`, which loads no torch).
Figures are drawn here, as their own step after the data. Loaded on first use (PEP 562)."""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["ResumeError", "resume_folder", "run_config", "run_to_folder"], "attnflow.runs.runner"),
    "folder_status": "attnflow.runs.folders",
}

__all__ = ["ResumeError", "folder_status", "resume_folder", "run_config", "run_to_folder"]


def __getattr__(name: str) -> _Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attnflow.runs' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if _TYPE_CHECKING:
    from attnflow.runs.folders import folder_status
    from attnflow.runs.runner import ResumeError, resume_folder, run_config, run_to_folder
