"""Runs that survive a crash: config -> run folder with checkpoints, resuming, and folder status.

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
import dataclasses
import hashlib
import json
import os
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from attnflow.config import ConfigError, RunConfig, build, load_config
from attnflow.core.caller import AttnflowWarning
from attnflow.core.trajectory import Trajectory
from attnflow.io.checkpoint import CHECKPOINT, Checkpoint, Checkpointer, load_checkpoint, save_checkpoint
from attnflow.io.lock import output_lock, refuse_if_busy
from attnflow.io.safety import atomic_write, scan_folder
from attnflow.io.store import (
    CONFIG,
    DATASET,
    PROVENANCE,
    clean_leftovers,
    folder_kind,
    provenance_record,
    read_provenance,
    read_small_text,
    trajectory_to_dataset,
    what_it_is,
    write_dataset,
)
from attnflow.runs.folders import check_out, folder_status
from attnflow.solve.guards import NumericalInstability, PrecisionWarning, StabilityWarning, trajectory_problem
from attnflow.solve.preflight import Estimate, estimate, preflight
from attnflow.solve.simulation import simulate
from attnflow.viz.plotting import plot_run

__all__ = [
    "run_config",
    "run_to_folder",
    "resume_folder",
    "folder_status",
    "check_out",
    "run_estimate",
    "ResumeError",
]

DEFAULT_CHECKPOINT_SECONDS = 60.0


class ResumeError(ConfigError):
    """A folder that cannot be resumed (finished, never started, stopped by the NaN guard)."""


def run_config(
    cfg: RunConfig, progress: Callable[[int, int], None] | None = None, *, threads: int | None = None
) -> Trajectory:
    """Simulate the run a config describes (no folder written); returns the :class:`Trajectory`.
    ``threads``: torch threads (``None``: :class:`~attnflow.core.threads.ThreadPolicy` chooses)."""
    inputs = build(cfg)
    traj = simulate(inputs.x0, inputs.process, progress=progress, **{**inputs.simulate_kwargs(), "threads": threads})
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
    final: Path | None = None,
    threads: int | None = None,
) -> Trajectory:
    """Simulate with checkpoints in ``out``; write the finished folder at ``final`` (default ``out``)."""
    final = out if final is None else final
    inputs = build(cfg)
    ck = Checkpointer(out / CHECKPOINT, every_steps=every_steps, every_seconds=every_seconds, on_begin=on_begin)
    try:
        traj = simulate(
            inputs.x0, inputs.process, progress=progress, checkpoint=ck, resume=resume,
            **{**inputs.simulate_kwargs(), "threads": threads},
        )  # fmt: skip
        _refuse_garbage(traj, cfg, out)
    except NumericalInstability as e:
        _keep_last_good_state(e, cfg, out)
        kept = "" if final == out else f" {str(final)!r} still holds the old result, untouched."
        where = "checkpoint.npz, and the trajectory so far in dataset.zarr" if e.checkpoint else "dataset.zarr"
        raise NumericalInstability(
            f"{e} The last good state is saved in {str(out)!r} ({where}); the folder is marked incomplete.{kept}",
            step=e.step,
            t=e.t,
            checkpoint=e.checkpoint,
            trajectory=e.trajectory,
        ) from None
    traj.seed = cfg.seed
    from attnflow.io.trajectory import save_trajectory

    save_trajectory(traj, final, overwrite=True, figures=plot_run if figures else None)
    if final != out:
        shutil.rmtree(out, ignore_errors=True)
    return traj


#: The first line of the ``config.yaml`` of a run in progress: the SHA-256 of the text below it, so
#: that ``--resume`` tells a truncated or edited file from a checkpoint of another run.
_SUM_PREFIX = "# attnflow-sha256: "


def _config_text(cfg: RunConfig) -> str:
    body = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    return f"{_SUM_PREFIX}{hashlib.sha256(body.encode()).hexdigest()}\n{body}"


def _check_config_text(path: Path) -> None:
    """Raise :class:`ResumeError` when the checksum line of a run's ``config.yaml`` does not match."""
    try:
        text = read_small_text(path)
    except (OSError, UnicodeDecodeError):
        raise ResumeError(
            f"cannot resume: {str(path)!r} cannot be read as text; the run's config is damaged."
        ) from None
    if not text.startswith(_SUM_PREFIX):
        return  # written by an older attnflow: nothing to check against
    head, _, body = text.partition("\n")
    if hashlib.sha256(body.encode()).hexdigest() != head.removeprefix(_SUM_PREFIX).strip():
        raise ResumeError(
            f"cannot resume: {str(path)!r} is damaged (truncated or edited): it no longer matches the checksum "
            "written with it when the run started."
        )


def _refuse_garbage(traj: Trajectory, cfg: RunConfig, out: Path) -> None:
    """Stop a finished run whose saved states are degenerate (:func:`attnflow.solve.guards.trajectory_problem`)
    as the NaN guard would: the good states before it are kept, the folder marked incomplete."""
    bad = trajectory_problem(traj)
    if bad is None:
        return
    k, why = bad
    if k == 0:
        raise NumericalInstability(f"the initial state is degenerate: {why}.", step=0, t=float(traj.t[0]))
    keep = slice(0, k)
    partial = dataclasses.replace(
        traj,
        t=traj.t[keep],
        x=traj.x[keep],
        A=traj.A[keep],
        V=None if traj.V is None else traj.V[keep],
        diagnostics={n: v[keep] for n, v in traj.diagnostics.items()},
        steps={},
        steps_info={},
    )
    stopped = f"{why} at t={traj.t[k]:.6g}"
    e = NumericalInstability(
        f"{why} at t={traj.t[k]:.6g}; the last good saved state is t={traj.t[k - 1]:.6g}. Lower integration.dt, or "
        "use the implicit method='jko' for stiff cases.",
        step=-1,
        t=float(traj.t[k]),
        checkpoint=None,
        trajectory=partial,
    )
    e.stopped = stopped  # type: ignore[attr-defined]
    raise e


def _keep_last_good_state(e: NumericalInstability, cfg: RunConfig, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if not (out / CONFIG).is_file():
        with atomic_write(out / CONFIG) as fh:
            fh.write(_config_text(cfg))
    if e.checkpoint is not None:
        save_checkpoint(out / CHECKPOINT, e.checkpoint)
    elif e.trajectory is None:
        return
    partial = e.trajectory
    partial.seed = cfg.seed
    write_dataset(trajectory_to_dataset(partial), out / DATASET)
    record = provenance_record(partial)
    stopped = e.checkpoint.stopped if e.checkpoint is not None else getattr(e, "stopped", str(e))
    record.update({"complete": False, "stopped": stopped})
    with atomic_write(out / PROVENANCE) as fh:  # never through a link planted in the folder
        fh.write(json.dumps(record, indent=2, default=str))


def run_estimate(cfg: RunConfig) -> Estimate:
    """The pre-flight estimate of ``cfg`` (:mod:`attnflow.solve.preflight`); refuses what cannot fit."""
    return preflight(estimate(cfg), what=f"run {cfg.name!r}")


def run_to_folder(
    cfg: RunConfig,
    out: str | Path,
    *,
    force: bool = False,
    figures: bool = True,
    every_steps: int | None = None,
    every_seconds: float | None = DEFAULT_CHECKPOINT_SECONDS,
    progress: Callable[[int, int], None] | None = None,
    threads: int | None = None,
) -> Trajectory:
    """Simulate ``cfg`` into the run folder ``out``, checkpointing as it goes (``threads``: torch
    threads, ``None``: chosen from the problem size by :class:`~attnflow.core.threads.ThreadPolicy`).

    Nothing is written before the inputs are validated (the folder appears with the first
    checkpoint, at step 0). The output lock (:func:`attnflow.io.lock.output_lock`) is held
    throughout: a second writer of ``out`` is refused. ``force`` replaces an existing attnflow run
    folder (never anything else, see :func:`check_out`), and only once the new run has finished:
    until then the new run lives in a hidden ``.NAME.force-*`` folder beside ``out``.
    """
    out = Path(out)
    check_out(out, force)
    run_estimate(cfg)
    with output_lock(out, what="run folder"):
        # A killed replacement may have left the old run aside (.NAME.old-*): put it back first,
        # then check again, now that no one else can write it (a run put back is a finished run).
        clean_leftovers(out)
        check_out(out, force)
        work = out if not out.exists() else out.parent / f".{out.name}.force-{uuid.uuid4().hex[:8]}"

        def begin() -> None:
            work.mkdir(parents=True)
            with atomic_write(work / CONFIG) as fh:
                fh.write(_config_text(cfg))

        try:
            return _simulate_into(
                cfg,
                work,
                resume=None,
                on_begin=begin,
                every_steps=every_steps,
                every_seconds=every_seconds,
                figures=figures,
                progress=progress,
                final=out,
                threads=threads,
            )
        except NumericalInstability:
            raise
        except BaseException:
            if work != out:  # the old result stays; the half-done replacement goes
                shutil.rmtree(work, ignore_errors=True)
            raise


def resume_folder(
    run_dir: str | Path,
    *,
    figures: bool = True,
    every_steps: int | None = None,
    every_seconds: float | None = DEFAULT_CHECKPOINT_SECONDS,
    progress: Callable[[int, int], None] | None = None,
    threads: int | None = None,
) -> Trajectory:
    """Continue an interrupted ``attnflow run`` in ``run_dir`` from its last checkpoint.

    The result equals, bit for bit on CPU, the run that was never interrupted. Without a
    checkpoint (killed before the first one) the run restarts from its saved config. Holds the
    output lock of ``run_dir``; hidden leftovers of a killed final write are removed.
    """
    run_dir = Path(run_dir)
    name = repr(str(run_dir))
    refuse_if_busy(run_dir, "run folder")
    kind = folder_kind(run_dir)
    if kind == "missing":
        raise ResumeError(f"cannot resume {name}: there is no such run folder.")
    if kind == "run":
        raise ResumeError(f"cannot resume {name}: the run is already complete (see 'attnflow show').")
    if kind == "empty":
        raise ResumeError(f"cannot resume {name}: it is an empty folder, not a run that was started.")
    if kind != "unfinished":
        raise ResumeError(f"cannot resume {name}: it is {what_it_is(run_dir)}, not a run started by 'attnflow run'.")
    with output_lock(run_dir, what="run folder"):
        scan_folder(run_dir)  # a link anywhere in the folder is refused before anything is read or written
        if not (run_dir / CONFIG).is_file():
            raise ResumeError(f"cannot resume {name}: it has no config.yaml, so it was not started by 'attnflow run'.")
        stopped = (read_provenance(run_dir) or {}).get("stopped")
        if stopped:
            raise ResumeError(
                f"cannot resume {name}: the run was stopped by the numerical guard ({stopped}); resuming would hit "
                "the same blow-up. Start a new run with a smaller integration.dt (or method 'jko')."
            )
        _check_config_text(run_dir / CONFIG)
        cfg = load_config(run_dir / CONFIG)
        ck_path = run_dir / CHECKPOINT
        if ck_path.exists() and not ck_path.is_file():
            raise ResumeError(f"cannot resume {name}: {str(ck_path)!r} is not a file, so it is not a checkpoint.")
        ck = load_checkpoint(ck_path) if ck_path.is_file() else None
        if ck is not None and ck.stopped:
            raise ResumeError(
                f"cannot resume {name}: the run was stopped by the numerical guard ({ck.stopped}); resuming "
                "would hit the same blow-up. Start a new run with a smaller integration.dt (or method 'jko')."
            )
        clean_leftovers(run_dir)
        try:
            return _simulate_into(
                cfg,
                run_dir,
                resume=ck,
                on_begin=None,
                every_steps=every_steps,
                every_seconds=every_seconds,
                figures=figures,
                progress=progress,
                threads=threads,
            )
        except ValueError as e:
            if "different run" not in str(e):
                raise
            raise ResumeError(
                f"cannot resume {name}: its checkpoint.npz does not match its config.yaml (tokens, weights, model, "
                "method, dt, t_end, seed or save_every differ). The config was edited after the run started; put it "
                "back, or start a new run."
            ) from None


@contextlib.contextmanager
def reported_warnings(report: Callable[[str], None]) -> Iterator[None]:
    """Route attnflow's own warnings (guards, token normalisation) to ``report``, one line each."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", StabilityWarning)
        warnings.simplefilter("always", PrecisionWarning)
        old = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(
                category, (StabilityWarning, PrecisionWarning, AttnflowWarning)
            ) or f"{os.sep}attnflow{os.sep}" in str(filename):
                report(str(message))
            else:
                old(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        try:
            yield
        finally:
            warnings.showwarning = old
