"""Runs that survive a crash: config -> run folder with checkpoints, ``--resume``, and folder status.

While a run is in progress its folder holds ``config.yaml`` (the exact config) and
``checkpoint.npz`` (rewritten atomically every K steps and/or M seconds) but no ``provenance.json``,
so :func:`attnflow.io.is_complete` is false and nothing mistakes it for a finished run. At the end
the complete folder is written beside it and renamed into place (:func:`attnflow.io.save_run`).
After a crash or ``kill -9``, :func:`resume_folder` continues from the checkpoint and produces the
trajectory of an uninterrupted run, bit for bit on CPU. A run stopped by the NaN guard keeps its
last good state there as well (``checkpoint.npz`` and a partial ``dataset.zarr``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from attnflow.config import ConfigError, RunConfig, build, load_config
from attnflow.io.checkpoint import CHECKPOINT, Checkpoint, Checkpointer, load_checkpoint, save_checkpoint
from attnflow.io.store import (
    CONFIG,
    DATASET,
    FIGURES,
    PROVENANCE,
    is_complete,
    provenance_record,
    save_run,
    trajectory_to_dataset,
    write_dataset,
)
from attnflow.io.trajectory import Trajectory
from attnflow.solve.guards import NumericalInstability, PrecisionWarning, StabilityWarning
from attnflow.solve.simulate import simulate
from attnflow.viz.plotting import plot_run

__all__ = ["run_config", "run_to_folder", "resume_folder", "folder_status", "ResumeError"]

DEFAULT_CHECKPOINT_SECONDS = 60.0


class ResumeError(ConfigError):
    """A folder that cannot be resumed (finished, never started, stopped by the NaN guard)."""


def run_config(cfg: RunConfig, progress: Callable[[int, int], None] | None = None) -> Trajectory:
    """Simulate the run a config describes (no folder written); returns the :class:`Trajectory`."""
    x0, process, kwargs = build(cfg)
    traj = simulate(x0, process, progress=progress, **kwargs)
    traj.seed = cfg.seed
    return traj


def _simulate_into(
    cfg: RunConfig,
    out: Path,
    *,
    resume: Checkpoint | None,
    on_begin: Callable[[], None] | None,
    every_steps: int | None,
    every_seconds: float | None,
    figures: bool,
    progress: Callable[[int, int], None] | None,
) -> Trajectory:
    x0, process, kwargs = build(cfg)
    ck = Checkpointer(out / CHECKPOINT, every_steps=every_steps, every_seconds=every_seconds, on_begin=on_begin)
    try:
        traj = simulate(x0, process, progress=progress, checkpoint=ck, resume=resume, **kwargs)
    except NumericalInstability as e:
        _keep_last_good_state(e, cfg, out)
        raise NumericalInstability(
            f"{e} The last good state is saved in {str(out)!r} (checkpoint.npz, and the trajectory so far in "
            "dataset.zarr); the folder is marked incomplete.",
            step=e.step,
            t=e.t,
            checkpoint=e.checkpoint,
            trajectory=e.trajectory,
        ) from None
    traj.seed = cfg.seed
    save_run(traj, out, overwrite=True, extra=(lambda tmp: plot_run(traj, tmp / FIGURES)) if figures else None)
    return traj


def _keep_last_good_state(e: NumericalInstability, cfg: RunConfig, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if not (out / CONFIG).is_file():
        (out / CONFIG).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    save_checkpoint(out / CHECKPOINT, e.checkpoint)
    partial = e.trajectory
    partial.seed = cfg.seed
    write_dataset(trajectory_to_dataset(partial), out / DATASET)
    record = provenance_record(partial)
    record.update({"complete": False, "stopped": e.checkpoint.stopped})
    (out / PROVENANCE).write_text(json.dumps(record, indent=2, default=str))


def run_to_folder(
    cfg: RunConfig,
    out: str | Path,
    *,
    force: bool = False,
    figures: bool = True,
    every_steps: int | None = None,
    every_seconds: float | None = DEFAULT_CHECKPOINT_SECONDS,
    progress: Callable[[int, int], None] | None = None,
) -> Trajectory:
    """Simulate ``cfg`` into the run folder ``out``, checkpointing as it goes.

    Nothing is written before the inputs are validated (the folder appears with the first
    checkpoint, at step 0). ``force`` replaces an existing folder at that moment.
    """
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{str(out)!r} already exists; choose another --out or pass --force to replace it.")

    def begin() -> None:
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        out.mkdir(parents=True)
        (out / CONFIG).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))

    return _simulate_into(
        cfg,
        out,
        resume=None,
        on_begin=begin,
        every_steps=every_steps,
        every_seconds=every_seconds,
        figures=figures,
        progress=progress,
    )


def resume_folder(
    run_dir: str | Path,
    *,
    figures: bool = True,
    every_steps: int | None = None,
    every_seconds: float | None = DEFAULT_CHECKPOINT_SECONDS,
    progress: Callable[[int, int], None] | None = None,
) -> Trajectory:
    """Continue an interrupted ``attnflow run`` in ``run_dir`` from its last checkpoint.

    The result equals, bit for bit on CPU, the run that was never interrupted. Without a
    checkpoint (killed before the first one) the run restarts from its saved config.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ResumeError(f"cannot resume {str(run_dir)!r}: there is no such run folder.")
    if is_complete(run_dir):
        raise ResumeError(f"cannot resume {str(run_dir)!r}: the run is already complete (see 'attnflow show').")
    if not (run_dir / CONFIG).is_file():
        raise ResumeError(
            f"cannot resume {str(run_dir)!r}: it has no config.yaml, so it was not started by 'attnflow run'."
        )
    cfg = load_config(run_dir / CONFIG)
    ck = load_checkpoint(run_dir / CHECKPOINT) if (run_dir / CHECKPOINT).is_file() else None
    if ck is not None and ck.stopped:
        raise ResumeError(
            f"cannot resume {str(run_dir)!r}: the run was stopped by the numerical guard ({ck.stopped}); resuming "
            "would hit the same blow-up. Start a new run with a smaller integration.dt (or method 'jko')."
        )
    return _simulate_into(
        cfg,
        run_dir,
        resume=ck,
        on_begin=None,
        every_steps=every_steps,
        every_seconds=every_seconds,
        figures=figures,
        progress=progress,
    )


def folder_status(run_dir: str | Path) -> str:
    """One paragraph saying why ``run_dir`` is not a finished run and what to do about it."""
    p = Path(run_dir)
    name = repr(str(p))
    stopped = None
    if (p / PROVENANCE).is_file():
        with contextlib.suppress(OSError, ValueError):
            stopped = json.loads((p / PROVENANCE).read_text()).get("stopped")
    ck = None
    if (p / CHECKPOINT).is_file():
        with contextlib.suppress(ValueError, OSError):
            ck = load_checkpoint(p / CHECKPOINT)
    if stopped or (ck is not None and ck.stopped):
        return (
            f"{name} is an INCOMPLETE run: it was stopped by the numerical guard ({stopped or ck.stopped}). The last good "
            f"state (t = {ck.t if ck else float('nan'):.6g}) is in checkpoint.npz and dataset.zarr; start a new run with a "
            "smaller integration.dt or method 'jko'."
        )
    if ck is not None:
        when = _dt.datetime.fromtimestamp((p / CHECKPOINT).stat().st_mtime, _dt.UTC).isoformat(timespec="seconds")
        return (
            f"{name} is an INCOMPLETE run: it did not finish. Its last checkpoint is step {ck.step}{f' of {ck.n_steps}' if ck.n_steps else ' (adaptive)'} "
            f"(last saved time t = {ck.t:.6g}, written {when}). Continue it with: attnflow run --resume {p}"
        )
    if (p / CONFIG).is_file():
        return (
            f"{name} is an INCOMPLETE run: it did not finish and has no usable checkpoint. "
            f"'attnflow run --resume {p}' restarts it from its config.yaml."
        )
    return f"{name} is not a complete run folder (no finished provenance.json): the run did not finish."


@contextlib.contextmanager
def reported_warnings(report: Callable[[str], None]) -> Iterator[None]:
    """Route attnflow's own warnings (guards, token normalisation) to ``report``, one line each."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", StabilityWarning)
        warnings.simplefilter("always", PrecisionWarning)
        old = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, (StabilityWarning, PrecisionWarning)) or f"{os.sep}attnflow{os.sep}" in str(
                filename
            ):
                report(str(message))
            else:
                old(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        try:
            yield
        finally:
            warnings.showwarning = old
