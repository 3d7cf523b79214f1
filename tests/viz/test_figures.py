"""Figures a paper could use: one colouring rule (final cluster), distinct colours for many clusters,
markers sized by mass, labelled axes and legends, gf's slope = speed drawn once, PDF beside PNG,
the report's EDI budget, a movie of at least 8 s by default."""

from __future__ import annotations

import imageio_ffmpeg
import matplotlib
import numpy as np
import pytest
from typer.testing import CliRunner

import attnflow as af
from attnflow.core import tokens
from attnflow.core.heads import identity_heads
from attnflow.io.trajectory import Trajectory
from attnflow.viz.movie import render_movie
from attnflow.viz.plotting import diagnostics_figure, plot_run, snapshots_figure
from attnflow.viz.report import report_figure
from attnflow.viz.views import (
    PALETTE,
    cluster_colouring,
    distinct_colours,
    marker_area,
    merged_markers,
    speed_equals_slope,
)

matplotlib.use("Agg")


def _traj(x: np.ndarray, model: str = "mha", t: np.ndarray | None = None) -> Trajectory:
    S, N, d = x.shape
    nan = np.full(S, np.nan)
    return Trajectory(
        t=np.arange(S, dtype=float) if t is None else t,
        x=x,
        A=np.zeros((S, 1, d, d)),
        V=None,
        diagnostics={"clusters": np.full(S, 1.0), "slope": nan, "metric_speed": nan},
        token_weights=np.full(N, 1 / N),
        head_weights=np.ones(1),
        model=model,
        method="euler",
        dt=1.0,
    )


@pytest.fixture(scope="module")
def gf_run():
    return af.simulate(tokens.uniform(40, 3, seed=1), identity_heads(2, 3, beta=4.0), model="gf", t_end=2.0, dt=0.05,
                       save_every=8)  # fmt: skip


@pytest.fixture(scope="module")
def mha_run():
    return af.simulate(tokens.uniform(40, 3, seed=1), identity_heads(2, 3, beta=4.0), model="mha", t_end=2.0,
                       dt=0.05, save_every=8)  # fmt: skip


def test_distinct_colours_never_repeat():
    c = distinct_colours(235)
    assert len(set(c)) == 235
    assert c[:10] == list(PALETTE)
    assert distinct_colours(3) == list(PALETTE[:3])


def test_colouring_is_by_final_cluster_heaviest_first():
    # final state: 3 tokens at the north pole, 2 at the south pole, 1 on the equator
    x1 = np.array([[0, 0, 1.0]] * 3 + [[0, 0, -1.0]] * 2 + [[1.0, 0, 0]])
    x0 = np.random.default_rng(0).standard_normal((6, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    col = cluster_colouring(_traj(np.stack([x0, x1])))
    np.testing.assert_array_equal(col.final, [0, 0, 0, 1, 1, 2])
    np.testing.assert_allclose(col.mass, [0.5, 1 / 3, 1 / 6])
    assert col.token_colours[:3] == [PALETTE[0]] * 3 and col.token_colours[5] == PALETTE[2]


def test_marker_area_grows_with_the_square_root_of_the_mass():
    rep, mass = merged_markers(np.array([0, 0, 0, 0, 1]), np.full(5, 0.2))
    np.testing.assert_array_equal(rep, [0, 4])
    np.testing.assert_allclose(mass, [0.8, 0.2])
    np.testing.assert_allclose(marker_area(mass, 5, 9.0), [18.0, 9.0])  # 4 tokens: sqrt(4) = 2 times a lone one


def test_speed_equals_slope_for_gf_only(gf_run, mha_run):
    assert speed_equals_slope(gf_run)
    assert not speed_equals_slope(mha_run)  # negative control: mha's speed is not its slope
    broken = Trajectory(**{**gf_run.__dict__, "diagnostics": {**gf_run.diagnostics}})
    broken.diagnostics["metric_speed"] = gf_run.diagnostics["metric_speed"] * 1.01
    assert not speed_equals_slope(broken)


def test_diagnostics_panels_are_labelled_and_gf_draws_slope_once(gf_run, mha_run):
    for traj, n_curves in ((gf_run, 1), (mha_run, 2)):
        fig = diagnostics_figure(traj)
        for ax in fig.axes:
            assert ax.get_ylabel() and ax.get_xlabel() and ax.get_legend() is not None
        assert len(fig.axes[1].get_lines()) == n_curves
        labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
        assert (len(labels) == 1 and "=" in labels[0]) if n_curves == 1 else len(labels) == 2
        matplotlib.pyplot.close(fig)


def test_snapshots_use_final_colours_and_a_key(gf_run):
    fig = snapshots_figure(gf_run)
    col = cluster_colouring(gf_run)
    assert fig.legends, "no legend of clusters and sizes"
    # the last panel: one marker per final cluster, in the final clusters' colours (near side: full colour)
    last = fig.axes[len(fig.axes) - 1] if len(col.colours) <= 8 else fig.axes[-2]
    drawn = np.concatenate([c.get_facecolors()[:, :3] for c in last.collections if len(c.get_offsets())])
    assert len(drawn) == len(col.mass)
    matplotlib.pyplot.close(fig)


def test_many_final_clusters_get_a_colourbar():
    x = np.random.default_rng(2).standard_normal((2, 30, 3))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    fig = snapshots_figure(_traj(x), count=2)
    assert any(ax.get_ylabel().startswith("final cluster") for ax in fig.axes)  # a colourbar, 30 colours
    matplotlib.pyplot.close(fig)


def test_plot_run_writes_png_and_pdf(gf_run, tmp_path):
    paths = plot_run(gf_run, tmp_path)
    assert sorted(p.name for p in paths) == ["diagnostics.pdf", "diagnostics.png", "snapshots.pdf", "snapshots.png"]
    for p in paths:
        head = p.read_bytes()[:5]
        assert head == (b"%PDF-" if p.suffix == ".pdf" else b"\x89PNG\r")


def test_report_colours_by_final_cluster_sizes_by_mass_and_shows_the_edi(gf_run, mha_run):
    fig = report_figure(gf_run, max_frames=5)
    col = cluster_colouring(gf_run)
    first, last = fig.frames[0].data[0], fig.frames[-1].data[0]
    assert list(first.marker.color) == list(last.marker.color) == col.token_colours  # fixed over time
    sizes = np.asarray(last.marker.size, dtype=float)
    lab_mass = col.mass[col.final] if len(col.mass) else None
    np.testing.assert_allclose(sizes, 4.0 * (lab_mass * gf_run.N) ** 0.25, rtol=1e-3)
    names = {tr.name for tr in fig.data}
    assert "residual" in names and "metric speed |μ′|" not in names
    titles = [a.text for a in fig.layout.annotations]
    assert any(t.startswith("energy-dissipation budget") for t in titles)
    fig2 = report_figure(mha_run, max_frames=5)
    assert "residual" not in {tr.name for tr in fig2.data}  # no EDI series for mha
    assert "metric speed |μ′|" in {tr.name for tr in fig2.data}


def _frames(path):
    gen = imageio_ffmpeg.read_frames(str(path))
    meta = next(gen)
    w, h = meta["size"]
    return meta, np.stack([np.frombuffer(f, np.uint8).reshape(h, w, 3) for f in gen])


def test_movie_markers_grow_with_mass(tmp_path):
    """49 merged tokens left of the pole and a lone token right of it: the merged marker has sqrt(49)
    = 7 times the area (negative control: the lone token's own area)."""
    left, right = np.array([0, -0.6, 0.8]), np.array([0, 0.6, 0.8])
    x = np.stack([np.array([left] * 49 + [right])] * 2)
    meta, fr = _frames(render_movie(_traj(x), tmp_path / "m.mp4", resolution=(320, 240), elevation=0.0,
                                    azimuth=0.0, point_size=30.0))  # fmt: skip
    from matplotlib.colors import to_rgb

    def pixels(colour: str) -> int:  # pixels near a cluster's colour (the wireframe is grey)
        return int((np.abs(fr[0].astype(int) - 255 * np.array(to_rgb(colour))).sum(-1) < 60).sum())

    merged, lone = pixels(PALETTE[0]), pixels(PALETTE[1])  # heaviest final cluster first
    assert lone > 10
    assert 4.0 < merged / lone < 10.0


@pytest.mark.integration
def test_movie_default_length_and_the_cli_default(tmp_path, run_dir3):
    x = np.stack([tokens.uniform(10, 3, seed=0)] * 3)
    path = render_movie(_traj(x), tmp_path / "a.gif", resolution=(64, 64), fps=5, min_seconds=2.0)
    from PIL import Image

    with Image.open(path) as im:
        assert im.n_frames == 10  # 2 s at 5 fps, more than the 3 saved times
    from attnflow.cli import app

    r = CliRunner().invoke(app, ["movie", str(run_dir3), "--out", str(tmp_path / "c.gif"), "--resolution",
                                 "64x64", "--fps", "2"])  # fmt: skip
    assert r.exit_code == 0, r.output
    with Image.open(tmp_path / "c.gif") as im:
        assert im.n_frames >= 16  # at least 8 s at 2 fps
