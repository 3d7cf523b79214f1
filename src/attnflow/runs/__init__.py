"""Config -> run folder: :func:`run_config`, :func:`run_to_folder` with checkpoints, ``--resume`` and
folder status (:mod:`.runner`; the folder checks alone in :mod:`.folders`, which loads no torch).
Figures are drawn here, as their own step after the data. Loaded on first use (PEP 562)."""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from attnflow.core.lazy import lazy_exports as _lazy_exports

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["ResumeError", "resume_folder", "run_config", "run_to_folder"], "attnflow.runs.runner"),
    "folder_status": "attnflow.runs.folders",
}

__all__ = ["ResumeError", "folder_status", "resume_folder", "run_config", "run_to_folder"]


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, __all__)


if _TYPE_CHECKING:
    from attnflow.runs.folders import folder_status
    from attnflow.runs.runner import ResumeError, resume_folder, run_config, run_to_folder
