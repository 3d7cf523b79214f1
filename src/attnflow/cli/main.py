"""The run-folder commands: ``attnflow run``, ``show`` and ``plot``."""

from __future__ import annotations

import contextlib
import math
import shlex
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnflow.cli.app import (
    FILE_OUT_FLAGS,
    RUN_FLAGS,
    UserError,
    app,
    confirm_heavy,
    guarded,
    progress_bar,
    say,
    warn,
)
from attnflow.cli.threads import run_pairs, threaded


@app.command()
@guarded(flags=RUN_FLAGS)
def run(
    config: Optional[Path] = typer.Argument(None, help="YAML config file (see docs/config.md)."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Run folder to write (must not exist unless --force)."
    ),
    preset: Optional[str] = typer.Option(
        None, "--preset", "-p", help="Embedded config: ou, oscillating or autonomous."
    ),
    seed: Optional[int] = typer.Option(None, "--seed", help="Override the config's seed."),
    set_: list[str] = typer.Option([], "--set", help="Override a field, e.g. --set integration.t_end=5 (repeatable)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing run folder."),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Write figures into the run folder."),
    resume: Optional[Path] = typer.Option(
        None, "--resume", help="Continue an interrupted run folder from its last checkpoint."
    ),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", min=1, help="Checkpoint every K steps."),
    checkpoint_seconds: float = typer.Option(
        60.0, "--checkpoint-seconds", min=0.0, help="Checkpoint every M seconds (0: off)."
    ),
    yes: bool = typer.Option(
        False,
        "--yes",
        "-y",
        help="Start even when the pre-flight estimate is large (more than an hour or half the memory).",
    ),
    threads: Optional[int] = typer.Option(
        None,
        "--threads",
        min=1,
        help="torch threads (default: one for small problems, the cores for large ones).",
    ),
) -> None:
    """Simulate a config (or a preset) and write a run folder (checkpointed; see --resume).

    Examples:

      attnflow run --preset ou --out runs/ou

      attnflow run examples/ou.yaml --out runs/ou2 --set heads.count=16 --seed 3

      attnflow run --resume runs/ou2
    """
    # The config and the out folder are checked before the numerical stack loads (issue 43): a
    # misspelt key or a taken folder answers at once; the runner (torch, numba) loads to run.
    from attnflow.config import apply_overrides, load_config, preset_config

    every: dict[str, Any] = {
        "every_steps": checkpoint_every,
        "every_seconds": checkpoint_seconds or None,
        "threads": threads,
    }
    if resume is not None:
        if config is not None or preset is not None or out is not None or set_ or seed is not None:
            raise UserError(
                "--resume DIR continues the run saved in DIR with its own config; drop CONFIG, --preset, --out, --set and --seed."
            )
        from attnflow.kernels.announce import compile_notices
        from attnflow.runs.runner import resume_folder

        with interruptions(resume, replacing=False), progress_bar(f"resume {resume}") as bar, compile_notices(say):
            task = bar.add_task(escape(str(resume)), total=None)
            traj = resume_folder(
                resume, figures=figures, progress=lambda k, n: bar.update(task, completed=k, total=n), **every
            )
        say(f"resumed {resume} from step {traj.provenance.get('resumed_from_step', 0)}; wrote {resume}")
        _summary(resume)
        return
    if out is None:
        raise UserError("give the run folder to write with --out DIR (or continue one with --resume DIR).")
    if (config is None) == (preset is None):
        raise UserError(
            "give either a CONFIG file or --preset NAME (ou, oscillating, autonomous), not both or neither."
        )
    cfg = load_config(config) if config is not None else preset_config(preset)  # type: ignore[arg-type]
    overrides = list(set_) + ([f"seed={seed}"] if seed is not None else [])
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    from attnflow.runs.folders import check_out

    check_out(out, force)
    from attnflow.runs.runner import run_estimate, run_to_folder

    confirm_heavy(run_estimate(cfg), f"run {cfg.name!r}", yes)
    from attnflow.kernels.announce import compile_notices

    with interruptions(out, replacing=out.exists()), progress_bar(cfg.name) as bar, compile_notices(say):
        task = bar.add_task(escape(cfg.name), total=None)
        traj = run_to_folder(
            cfg,
            out,
            force=force,
            figures=figures,
            progress=lambda k, n: bar.update(task, completed=k, total=n),
            **every,
        )
    say(f"wrote {out}  ({traj.provenance['wall_time_s']:.1f} s, {len(traj.t)} saved times)")
    _summary(out)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C so that the same clean-up runs (locks released,
    a half-written replacement removed)."""


@contextlib.contextmanager
def interruptions(folder: Path, *, replacing: bool) -> Iterator[None]:
    """Turn Ctrl-C (SIGINT) and SIGTERM during a run into one line saying what was saved in ``folder``
    and the command that resumes it, and exit with 130 or 143 (128 + the signal's number).

    ``replacing``: ``folder`` held a run before (``--force``): the unfinished replacement is removed
    and ``folder`` keeps the old run, so there is nothing to resume.
    """

    def on_term(signum: int, frame: Any) -> None:
        raise Terminated()

    main_thread = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    old = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    try:
        yield
    except KeyboardInterrupt as e:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM while we report is not an error
        by, code = ("SIGTERM", 143) if isinstance(e, Terminated) else ("Ctrl-C", 130)
        say(_interrupted_line(folder, by, replacing), "bold yellow", "stopped:")
        raise typer.Exit(code) from None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old)


def _interrupted_line(folder: Path, by: str, replacing: bool) -> str:
    """What an interrupted run left in ``folder`` and how to continue it, in one line."""
    from attnflow.io.checkpoint import CHECKPOINT, load_checkpoint
    from attnflow.io.store import CONFIG

    if replacing:
        return f"{by}: the replacement run was discarded; {str(folder)!r} is left as it was."
    resume = f"attnflow run --resume {shlex.quote(str(folder))}"
    ck = None
    if (folder / CHECKPOINT).is_file():
        try:
            ck = load_checkpoint(folder / CHECKPOINT)
        except (ValueError, OSError):
            ck = None
    if ck is not None:
        of = f" of {ck.n_steps}" if ck.n_steps else ""
        return f"{by}: saved the checkpoint of step {ck.step}{of} (t = {ck.t:.6g}) in {str(folder)!r}; resume with: {resume}"
    if (folder / CONFIG).is_file():
        return f"{by}: saved the config in {str(folder)!r} (no checkpoint yet); restart it with: {resume}"
    return f"{by}: stopped before anything was written; nothing to resume."


#: The diagnostics ``show`` prints (all of them go into ``--json``).
SHOWN = ("energy", "slope", "metric_speed", "mobility_min", "mobility_max", "order_parameter", "clusters", "mean_inner")
NOT_RECORDED = "not recorded"


def _parse_times(times: str | None) -> list[float] | None:
    if times is None:
        return None
    try:
        values = [float(s) for s in times.replace(" ", "").split(",") if s]
    except ValueError:
        raise UserError(f"--times must be comma-separated numbers like 0,2.5,10; got {times!r}.") from None
    if not values or not all(math.isfinite(v) for v in values):
        raise UserError(f"--times needs finite times, e.g. --times 0,5,10; got {times!r}.")
    return values


def summary_record(path: Path, times: list[float] | None = None) -> dict:
    """What ``attnflow show`` reports about a run folder, as plain JSON-ready data.

    Diagnostics at the saved times nearest to ``times`` (default: first and last), the time to
    clustering (:func:`attnflow.io.summary.time_to_cluster`), the EDI residual when the run
    recorded its per-step series (:func:`attnflow.analysis.edi.edi_budget`), the parameters (from
    the dataset's attributes, else the config), the final state and the provenance; ``None`` where
    not recorded. Read from the run's ``summary.json`` when it has one (no torch, no xarray: issue 43),
    else computed from the dataset (:func:`full_summary_record`).
    """
    import warnings

    from attnflow.io.store import DataWarning
    from attnflow.io.summary import read_summary, show_record
    from attnflow.io.trajectory import check_run_metadata

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DataWarning)
        # load()'s checks short of decoding arrays; the digests cover summary.json: a damaged one is named
        provenance, _, _ = check_run_metadata(path)
    summary = read_summary(path)
    if summary is None:
        return full_summary_record(path, times)
    for w in caught:
        if issubclass(w.category, DataWarning):
            warn(str(w.message))
    return show_record(path, summary, provenance, times)


def full_summary_record(path: Path, times: list[float] | None = None) -> dict:
    """:func:`summary_record` computed from the dataset (folders without ``summary.json``)."""
    import warnings

    from attnflow.io.store import DATASET, DataWarning
    from attnflow.io.summary import run_summary, show_record
    from attnflow.io.trajectory import load
    from attnflow.io.zarr_guard import open_store

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DataWarning)
            traj = load(path)
        for w in caught:
            if issubclass(w.category, DataWarning):
                warn(str(w.message))
    except KeyError as e:
        raise UserError(
            f"{str(path)!r} holds no token trajectory (its dataset lacks {e}); it is an experiment's summary: "
            "see its results.json."
        ) from None
    # Read only after load() has checked the folder (links, sizes, strings).
    attrs = dict(open_store(path / DATASET).attrs)
    return show_record(path, run_summary(traj, attrs), traj.provenance, times)


def _fmt(v) -> str:
    if v is None:
        return NOT_RECORDED
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _print_summary(rec: dict) -> None:
    from attnflow.core.text import terminal_text

    out = Console()
    table = Table(title=f"run {escape(terminal_text(rec['path']))}", show_header=True)
    table.add_column("quantity")
    for t in rec["times"]:
        table.add_column(f"t = {t:.4g}", justify="right")
    for name in SHOWN:
        if name in rec["diagnostics"]:
            table.add_row(
                escape(terminal_text(name)), *[escape(terminal_text(_fmt(v))) for v in rec["diagnostics"][name]]
            )
    out.print(table)
    ttc, final = rec["time_to_clustering"], rec["final_clusters"]
    if final is None:
        clustering = None
    elif ttc is None:
        clustering = f"never ({final} clusters of {rec['N']} tokens at the end)"
    else:
        clustering = f"{ttc:g} ({final} clusters from then on)"
    rows = [
        ("model", rec["model"]),
        ("method", rec["method"]),
        ("N, d, H", f"{rec['N']}, {rec['d']}, {rec['H']}"),
        ("dt", rec["dt"]),
        ("t", f"{rec['t_start']:g} .. {rec['t_end']:g} ({rec['saved_times']} saved times)"),
        ("weights", rec["weights"]),
        ("beta", rec["beta"]),
        ("cluster_eps", rec["cluster_eps"]),
        ("seed", rec["seed"]),
        ("time to clustering", clustering),
        ("ended at", rec["ended_at"]["text"] if rec.get("ended_at") else None),
    ]
    if rec["edi"] is not None:
        e = rec["edi"]
        rel = e["relative_residual"]
        rel_text = "no dissipation" if rel is None else f"relative {rel:.3e}"
        rows.append(("EDI residual", f"{e['residual']:.3e} ({rel_text})"))
    rows += [
        ("wall time (s)", rec["wall_time_s"]),
        ("attnflow", rec["attnflow_version"]),
        ("git commit", rec["git_commit"]),
    ]
    info = Table(show_header=False, box=None)
    for k, v in rows:
        info.add_row(escape(terminal_text(k)), escape(terminal_text(_fmt(v))))
    out.print(info)


def _summary(path: Path) -> None:
    _print_summary(summary_record(path))


@app.command()
@guarded
def show(
    run_dir: Path = typer.Argument(..., help="A run folder written by 'attnflow run'."),
    times: Optional[str] = typer.Option(
        None, "--times", help="Comma-separated times to show (the nearest saved ones); default first and last."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON (for scripts) instead of tables."),
) -> None:
    """Print a summary of a run folder: diagnostics, time to clustering, EDI residual, parameters.

    Examples:

      attnflow show runs/ou

      attnflow show runs/ou --times 0,1,2,5,10

      attnflow show runs/ou --json
    """
    import json

    from attnflow.io.safety import scan_folder
    from attnflow.io.store import folder_kind, is_complete
    from attnflow.runs.folders import folder_status

    wanted = _parse_times(times)
    if folder_kind(run_dir) == "missing":
        raise UserError(f"no run folder at {str(run_dir)!r}.")
    if run_dir.is_dir():
        scan_folder(run_dir)  # a link, sparse or oversized file is named before anything is read
    if not is_complete(run_dir):
        raise UserError(folder_status(run_dir))
    rec = summary_record(run_dir, wanted)
    if json_out:
        print(json.dumps(rec, indent=2, default=str))
    else:
        _print_summary(rec)
        if (run_dir / "hf_comparison.zarr").is_dir():  # a folder of 'attnflow hf run': its comparison too
            from attnflow.cli.hf import print_hf_summary

            print_hf_summary(run_dir)


@app.command()
@guarded(flags=FILE_OUT_FLAGS)
@threaded(lambda kw: run_pairs(kw.get("run_dir")))
def plot(
    run_dir: Path = typer.Argument(..., help="A run folder written by 'attnflow run'."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder for the figures (default RUN/figures)."),
    force: bool = typer.Option(False, "--force", help="Replace figures already in the --out folder."),
) -> None:
    """Draw sphere snapshots (PCA view for d > 3) and energy/slope/cluster curves.

    Example:

      attnflow plot runs/ou --out figs/
    """
    from attnflow.io.safety import refuse_link
    from attnflow.io.store import FIGURES, check_file_out
    from attnflow.io.trajectory import load
    from attnflow.viz.plotting import FIGURE_FILES, plot_run

    traj = load(run_dir)
    where = out or run_dir / FIGURES
    refuse_link(where, "figures folder")
    for name in FIGURE_FILES:  # one file kind: figures; only ours are replaced (RUN/figures belongs to the run)
        check_file_out(where / name, "figure", force=force, owned=out is None)
    paths = plot_run(traj, where)
    if (run_dir / "hf_comparison.zarr").is_dir():  # a folder of 'attnflow hf run': its figures too
        from attnflow.hf.views import plot_hf

        paths = [*paths, *plot_hf(run_dir, out or run_dir / FIGURES)]
    for p in paths:
        say(f"wrote {p}")
