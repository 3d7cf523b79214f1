"""Config -> run folder: :func:`run_config`, :func:`run_to_folder` with checkpoints, ``--resume`` and
folder status (:mod:`.runner`). Figures are drawn here, as their own step after the data."""

from attnflow.runs.runner import ResumeError, folder_status, resume_folder, run_config, run_to_folder

__all__ = ["ResumeError", "folder_status", "resume_folder", "run_config", "run_to_folder"]
