"""``attnflow report`` and ``attnflow movie``: look at a run in the browser or as a video."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnflow.cli.app import FILE_OUT_FLAGS, UserError, app, guarded, say
from attnflow.cli.threads import run_pairs, threaded


def _complete_run(run_dir: Path) -> None:
    from attnflow.io.safety import scan_folder
    from attnflow.io.store import folder_kind, is_complete
    from attnflow.runs.folders import folder_status

    if folder_kind(run_dir) == "missing":
        raise UserError(f"no run folder at {str(run_dir)!r}; make one with 'attnflow run --preset ou --out {run_dir}'.")
    if run_dir.is_dir():
        scan_folder(run_dir)  # a link, sparse or oversized file is named before anything is read
    if not is_complete(run_dir):
        raise UserError(folder_status(run_dir))


@app.command()
@guarded(flags=FILE_OUT_FLAGS)
@threaded(lambda kw: run_pairs(kw.get("run_dir")))
def report(
    run_dir: Path = typer.Argument(..., help="A run folder written by 'attnflow run'."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="HTML file to write (default RUN/report.html)."),
    max_frames: int = typer.Option(200, "--max-frames", min=2, help="Most saved times on the slider (evenly spread)."),
    max_tokens: int = typer.Option(
        10_000,
        "--max-tokens",
        min=1,
        help="Most tokens drawn in the 3-D view (a fixed random subset; clusters use all).",
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing report given with --out."),
) -> None:
    """Write an interactive, self-contained HTML report (opens offline in any browser).

    The page shows the tokens on the sphere (PCA view for d > 3) coloured by cluster, with a time slider and a play button; energy, slope, metric speed, clusters and order parameter with the current time marked; the weights' path ||A_h(t)||_F; the config and the provenance.

    Examples:

      attnflow report runs/ou

      attnflow report runs/ou --out ou.html --max-frames 50
    """
    from attnflow.viz.report import write_report

    _complete_run(run_dir)
    path = write_report(run_dir, out, max_frames=max_frames, max_tokens=max_tokens, force=force)
    if (run_dir / "hf_comparison.zarr").is_dir():  # a folder of 'attnflow hf run': its comparison too
        from attnflow.hf.views import add_to_report

        add_to_report(run_dir, path)
    say(f"wrote {path}  ({path.stat().st_size / 1e6:.1f} MB; open it in a browser)")


@app.command()
@guarded(flags=FILE_OUT_FLAGS)
@threaded(lambda kw: run_pairs(kw.get("run_dir")))
def movie(
    run_dir: Path = typer.Argument(..., help="A run folder written by 'attnflow run'."),
    out: Path = typer.Option(..., "--out", "-o", help="Movie file: .mp4 (H.264) or .gif."),
    frames: Optional[int] = typer.Option(
        None,
        "--frames",
        min=1,
        help="Number of frames (default: one per saved time, at least --seconds x --fps; more frames interpolate).",
    ),
    seconds: float = typer.Option(
        8.0, "--seconds", min=0.0, help="Shortest length in seconds when --frames is not given."
    ),
    fps: int = typer.Option(30, "--fps", min=1, help="Frames per second."),
    resolution: str = typer.Option("1280x720", "--resolution", help="WIDTHxHEIGHT in pixels, both even."),
    trails: int = typer.Option(
        0, "--trails", min=0, help="Show each token's positions in the previous N frames, fading."
    ),
    rotate: float = typer.Option(
        0.0, "--rotate", help="Degrees the camera turns about the vertical axis over the movie (360: one turn)."
    ),
    elevation: float = typer.Option(20.0, "--elevation", help="Camera elevation in degrees."),
    point_size: float = typer.Option(
        16.0, "--point-size", min=0.1, help="Marker area of a lone token in points^2 (merged tokens: larger, by mass)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing movie file."),
) -> None:
    """Render the token flow to an .mp4 or .gif (frames go straight into ffmpeg; no image files).

    Tokens have the colour of their final cluster; merged tokens are one marker whose area grows with the cluster's mass; tokens on the far side of the sphere are drawn faded; d > 3 is shown in PCA coordinates. Without --frames the movie lasts at least 8 s (--seconds).

    Examples:

      attnflow movie runs/ou --out ou.mp4

      attnflow movie runs/ou --out ou.mp4 --frames 600 --fps 60 --trails 10 --rotate 360

      attnflow movie runs/ou --out ou.gif --resolution 480x360 --fps 15
    """
    from attnflow.cli.app import progress_bar
    from attnflow.io.store import check_file_out
    from attnflow.viz.movie import MovieSettings, parse_resolution, render_movie

    _complete_run(run_dir)
    if out.suffix.lower() not in (".mp4", ".gif"):
        raise UserError(f"--out must end in .mp4 or .gif; got {str(out)!r}.")
    check_file_out(out, "movie", force=force)
    settings = MovieSettings(
        frames=frames,
        fps=fps,
        resolution=parse_resolution(resolution),
        trails=trails,
        rotate=rotate,
        elevation=elevation,
        point_size=point_size,
        min_seconds=seconds,
    )
    with progress_bar("movie", unit="frames") as bar:
        task = bar.add_task("movie", total=frames)  # counted in frames (see progress_bar's unit)
        path = render_movie(run_dir, out, settings, progress=lambda k, n: bar.update(task, completed=k, total=n))
    say(f"wrote {path}  ({path.stat().st_size / 1e6:.2f} MB)")
