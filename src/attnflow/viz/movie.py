"""Movies of a run: matplotlib frames piped straight into ffmpeg (``imageio-ffmpeg``), no image files.

One 2D figure is built once; each frame projects the tokens with an orthographic camera
(:func:`camera`; mplot3d re-projects every artist and is several times slower), moves the points
(and trails), renders on the Agg canvas and hands the RGB buffer to the encoder. ``.mp4`` is H.264; ``.gif`` uses
ffmpeg's palette filters so that cluster colours survive the 256-colour limit.
"""

from __future__ import annotations

import contextlib
import math
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import imageio_ffmpeg
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba_array

from attnflow.core.errors import Hint, InputError
from attnflow.core.text import plain_label
from attnflow.io.lock import output_lock
from attnflow.io.safety import memory_budget, refuse_link
from attnflow.io.trajectory import (
    Trajectory,
    load,
)
from attnflow.viz.views import (
    camera,
    cluster_colouring,
    cluster_labels,
    interpolate_tokens,
    marker_area,
    merged_markers,
    sphere_wireframe,
    view3d,
)

FORMATS = (".mp4", ".gif")
#: Bounds of a movie (checked before any work): frames (about an hour at 30 fps), trails, pixels a
#: frame (8K), frames a second.
MAX_FRAMES = 100_000
MAX_TRAILS = 1_000
MAX_PIXELS = 7680 * 4320
MAX_FPS = 240


@dataclass(frozen=True)
class MovieSettings:
    """How a movie looks: ``frames`` (``None``: one per saved time, at least ``min_seconds * fps``), ``fps``, ``resolution`` (width,
    height in pixels, even), ``trails`` (how many previous frames each token drags behind it),
    ``rotate`` (degrees the camera turns about the vertical axis over the whole movie),
    ``elevation`` and ``azimuth`` of the camera at the start, ``point_size`` the marker area of a
    lone token in points^2 (merged tokens: one marker of area ``point_size * sqrt(N * mass)``),
    ``min_seconds`` the shortest movie when ``frames`` is not given (``attnflow movie``: 8 s)."""

    frames: int | None = None
    fps: int = 30
    resolution: tuple[int, int] = (1280, 720)
    trails: int = 0
    rotate: float = 0.0
    elevation: float = 20.0
    azimuth: float = -60.0
    point_size: float = 16.0
    min_seconds: float = 0.0

    def check(self) -> None:
        """Refuse settings that are meaningless (NaN angles, odd sizes) or unbounded (more than
        :data:`MAX_FRAMES` frames, :data:`MAX_TRAILS` trails, :data:`MAX_PIXELS` pixels a frame), with
        one :class:`~attnflow.core.errors.InputError` naming the option."""
        w, h = self.resolution
        if w < 64 or h < 64 or w % 2 or h % 2:
            raise InputError(f"resolution must be even and at least 64x64 pixels; got {w}x{h}")
        if w * h > MAX_PIXELS:
            raise InputError(
                f"resolution {w}x{h} has {w * h:,} pixels a frame, more than the {MAX_PIXELS:,} of 8K (7680x4320); "
                "choose a smaller one."
            )
        if not 1 <= self.fps <= MAX_FPS:
            raise InputError(f"fps must be an integer from 1 to {MAX_FPS}; got {self.fps}")
        if self.frames is not None and not 1 <= self.frames <= MAX_FRAMES:
            raise InputError(
                f"frames must be an integer from 1 to {MAX_FRAMES:,} (about an hour at 30 fps); got {self.frames}"
            )
        if not (math.isfinite(self.min_seconds) and 0 <= self.min_seconds <= MAX_FRAMES / self.fps):
            raise InputError(
                f"min_seconds must be from 0 to {MAX_FRAMES / self.fps:g} (at {self.fps} fps); got {self.min_seconds}"
            )
        if not 0 <= self.trails <= MAX_TRAILS:
            raise InputError(f"trails must be from 0 to {MAX_TRAILS}; got {self.trails}")
        for name in ("rotate", "elevation", "azimuth", "point_size"):
            v = getattr(self, name)
            if not math.isfinite(v) or abs(v) > 1e6:
                raise InputError(f"{name} must be a finite number of modest size; got {v}")
        if not self.point_size > 0:
            raise InputError(f"point_size must be positive; got {self.point_size}")


def parse_resolution(text: str) -> tuple[int, int]:
    """``"1280x720"`` -> ``(1280, 720)``."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise InputError(f"resolution must look like WIDTHxHEIGHT, e.g. 1280x720; got {text!r}") from None
    return w, h


def _wireframe(n_lat: int = 9, n_lon: int = 12, pts: int = 73) -> list[np.ndarray]:
    """Parallels and meridians of the unit sphere (:func:`attnflow.viz.views.sphere_wireframe`)."""
    return sphere_wireframe(n_lat, n_lon, pts)


def _writer(path: Path, size: tuple[int, int], fps: int):
    if path.suffix.lower() == ".gif":
        return imageio_ffmpeg.write_frames(
            str(path),
            size,
            fps=fps,
            codec="gif",
            pix_fmt_in="rgba",
            pix_fmt_out="pal8",
            quality=None,
            macro_block_size=1,
            output_params=["-vf", "split[a][b];[a]palettegen=reserve_transparent=0[p];[b][p]paletteuse=dither=bayer"],
        )
    return imageio_ffmpeg.write_frames(
        str(path),
        size,
        fps=fps,
        codec="libx264",
        pix_fmt_in="rgba",
        quality=7,
        macro_block_size=2,
        output_params=["-preset", "veryfast", "-movflags", "+faststart"],
    )


def render_movie(
    run: Trajectory | str | os.PathLike,
    out: str | os.PathLike,
    settings: MovieSettings | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    **options,
) -> Path:
    """Render the token flow of ``run`` (a :class:`Trajectory` or a run folder) to ``out`` (.mp4 or .gif).

    Options are the fields of :class:`MovieSettings` (``frames, fps, resolution, trails, rotate,
    elevation, azimuth, point_size``), given as a ``settings`` object or as keywords. With more
    frames than saved times, tokens are interpolated between saved states (display only).
    Tokens have the colour of their final cluster (the run's ``cluster_eps``; the rule of every
    attnflow figure, :func:`attnflow.viz.views.cluster_colouring`); tokens that have merged are one
    marker whose area grows with the cluster's mass; ``d > 3`` is shown in PCA coordinates.
    """
    s = settings or MovieSettings(**options)
    if settings is not None and options:
        raise InputError("give either settings=MovieSettings(...) or keyword options, not both")
    s.check()
    path = Path(out)
    if path.suffix.lower() not in FORMATS:
        raise InputError(f"the movie file must end in .mp4 or .gif; got {str(path)!r}")
    if isinstance(run, Trajectory):
        traj = run
    else:
        traj = load(run)

    n_frames = s.frames or max(len(traj.t), int(np.ceil(s.min_seconds * s.fps)))
    if n_frames > MAX_FRAMES:
        raise InputError(
            f"the run has {len(traj.t):,} saved times, more frames than the {MAX_FRAMES:,} a movie may have; give "
            "frames=N to draw fewer.",
            hint=Hint("frames"),
        )
    need = 8.0 * n_frames * traj.N * 3  # the interpolated positions of every frame, float64
    if need > memory_budget():
        raise InputError(
            f"a movie of {n_frames:,} frames of {traj.N:,} tokens needs {need / 2**30:.1f} GiB for its positions, more "
            "than this process can use; give fewer frames (frames=).",
            hint=Hint("frames"),
        )
    times = np.linspace(traj.t[0], traj.t[-1], n_frames)
    view = view3d(traj.x)
    xyz = interpolate_tokens(view.xyz, traj.t, times, on_sphere=view.on_sphere)
    # clusters (hence colours) of the nearest saved state: labels are a property of saved data
    nearest = np.abs(traj.t[None, :] - times[:, None]).argmin(1)
    col = cluster_colouring(traj)
    a = np.asarray(traj.token_weights, dtype=np.float64)
    label_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    colours = to_rgba_array(col.colours)
    faded = 0.35 * colours + 0.65 * np.array([1.0, 1.0, 1.0, 1.0])
    token_rgba = colours[col.final]

    w, h = s.resolution
    dpi = 100
    fig = plt.figure(figsize=(w / dpi, h / dpi), dpi=dpi)
    canvas = fig.canvas
    assert isinstance(canvas, FigureCanvasAgg)  # the Agg backend, selected above
    ax = fig.add_axes((0.0, 0.0, 1.0, 0.92))
    lim = 1.0 if view.on_sphere else (float(np.linalg.norm(view.xyz, axis=-1).max()) or 1.0)
    ax.set_xlim(-1.08 * lim * w / (0.92 * h), 1.08 * lim * w / (0.92 * h))
    ax.set_ylim(-1.08 * lim, 1.08 * lim)
    ax.set_axis_off()
    wire = _wireframe() if view.on_sphere else None
    if wire is not None:
        ax.add_artist(plt.Circle((0, 0), 1.0, fill=False, lw=0.8, color="0.6", zorder=1))
        front = [ax.plot([], [], lw=0.5, color="0.78", zorder=1)[0] for _ in wire]
        behind = [ax.plot([], [], lw=0.5, color="0.92", zorder=0)[0] for _ in wire]
    else:
        fig.text(0.01, 0.01, "PCA view: " + ", ".join(view.axis_titles), fontsize=9, color="0.3")
    fig.text(
        0.99, 0.01, "colour: final cluster; area grows with mass", fontsize=8, color="0.4", ha="right", va="bottom"
    )
    empty = np.empty((0, 2))
    back_side = ax.scatter(empty[:, 0], empty[:, 1], s=[], lw=0, zorder=2)
    front_side = ax.scatter(empty[:, 0], empty[:, 1], s=[], lw=0, zorder=3)
    trail_dots = [
        ax.scatter(
            empty[:, 0], empty[:, 1], s=0.36 * s.point_size, lw=0, zorder=1.5, alpha=0.08 + 0.45 * (a_ + 1) / s.trails
        )
        for a_ in range(s.trails)
    ]  # a_ = 0 is the oldest
    title = fig.text(0.5, 0.955, "", ha="center", va="center", fontsize=12, family="monospace")

    refuse_link(path, "movie file")
    path.parent.mkdir(parents=True, exist_ok=True)
    refuse_link(path.parent, "folder of the movie")
    lock = contextlib.ExitStack()  # one writer: a second render of the same file is refused
    try:
        lock.enter_context(output_lock(path, what="movie file"))
    except BaseException:
        plt.close(fig)
        raise
    tmp = path.with_name(f".{path.stem}.tmp-{uuid.uuid4().hex[:8]}{path.suffix}")
    writer = _writer(tmp, (w, h), s.fps)
    writer.send(None)  # start ffmpeg
    try:
        for f in range(n_frames):
            k = int(nearest[f])
            if k not in label_cache:
                label_cache[k] = merged_markers(cluster_labels(traj.x[k], col.eps), a)
            rep, mass = label_cache[k]
            azim = s.azimuth + s.rotate * f / max(n_frames - 1, 1)
            P = camera(s.elevation, azim)  # rows: screen right, screen up, towards the viewer
            q = xyz[f][rep] @ P.T  # one marker per current cluster; the far side faded, behind
            near = q[:, 2] >= 0 if view.on_sphere else np.ones(len(q), bool)
            area = marker_area(mass, traj.N, s.point_size)
            c = col.final[rep]
            for dots, side, rgba in ((front_side, near, colours), (back_side, ~near, faded)):
                order = np.argsort(q[side, 2])
                dots.set_offsets(q[side][order, :2])
                dots.set_sizes(area[side][order])
                dots.set_facecolor(rgba[c[side][order]])
            if wire is not None:
                for line, ln_front, ln_behind in zip(wire, front, behind):
                    g = line @ P.T
                    # NaN breaks a polyline: each circle is split into its near and far parts
                    vis = g[:, 2] >= 0
                    ln_front.set_data(np.where(vis, g[:, 0], np.nan), np.where(vis, g[:, 1], np.nan))
                    ln_behind.set_data(np.where(vis, np.nan, g[:, 0]), np.where(vis, np.nan, g[:, 1]))
            for age in range(s.trails):
                g = f - s.trails + age
                if g >= 0:
                    trail_dots[age].set_offsets(xyz[g] @ P[:2].T)
                    trail_dots[age].set_facecolor(token_rgba)
                else:
                    trail_dots[age].set_offsets(empty)
            title.set_text(
                f"{plain_label(traj.model)}  N={traj.N} d={traj.d} H={traj.H}   t = {times[f]:7.3f}   clusters = {len(mass):4d}"
            )
            fig.canvas.draw()
            writer.send(canvas.buffer_rgba())
            if progress is not None:
                progress(f + 1, n_frames)
        writer.close()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        lock.close()
        raise
    finally:
        plt.close(fig)
    with lock:
        refuse_link(path, "movie file")
        os.replace(tmp, path)
    return path
