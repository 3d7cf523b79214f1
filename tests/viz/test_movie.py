"""Movies: frame count, size, where a token lands on screen, its cluster colour, trails, rotation, GIF."""

from __future__ import annotations

import imageio_ffmpeg
import numpy as np
import pytest
from matplotlib.colors import to_rgb
from PIL import Image

from attnflow.io.trajectory import Trajectory
from attnflow.viz.movie import MovieSettings, camera, parse_resolution, render_movie
from attnflow.viz.views import PALETTE


def _read_mp4(path) -> tuple[dict, np.ndarray]:
    gen = imageio_ffmpeg.read_frames(str(path))
    meta = next(gen)
    w, h = meta["size"]
    frames = np.stack([np.frombuffer(f, np.uint8).reshape(h, w, 3) for f in gen])
    return meta, frames


def _traj(x: np.ndarray, t: np.ndarray | None = None) -> Trajectory:
    S, N, d = x.shape
    t = np.linspace(0, 1, S) if t is None else t
    zeros = {k: np.zeros(S) for k in ("energy", "slope", "metric_speed", "clusters", "order_parameter")}
    return Trajectory(
        t=t,
        x=x,
        A=np.broadcast_to(np.eye(d), (S, 1, d, d)).copy(),
        V=None,
        diagnostics=zeros,
        token_weights=np.full(N, 1 / N),
        head_weights=np.ones(1),
        model="gf",
        method="euler",
        dt=0.1,
    )


def test_camera_is_a_rotation_with_matplotlibs_angles():
    P = camera(0.0, 0.0)
    np.testing.assert_allclose(P, [[0, 1, 0], [0, 0, 1], [1, 0, 0]], atol=1e-15)  # looking down -x1
    P = camera(35.0, -70.0)
    np.testing.assert_allclose(P @ P.T, np.eye(3), atol=1e-14)
    assert np.linalg.det(P) == pytest.approx(1.0)
    el, az = np.deg2rad(35.0), np.deg2rad(-70.0)
    np.testing.assert_allclose(P[2], [np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], atol=1e-15)
    np.testing.assert_allclose(camera(90.0, 0.0)[2], [0, 0, 1], atol=1e-15)  # from above


def test_a_cluster_at_the_pole_lands_at_the_centre_in_its_colour(tmp_path):
    # two clusters: 30 tokens at the north pole (cluster 0) and 30 at the south pole (cluster 1)
    x = np.zeros((2, 60, 3))
    x[:, :30, 2], x[:, 30:, 2] = 1.0, -1.0
    path = render_movie(_traj(x), tmp_path / "m.mp4", resolution=(320, 240), elevation=90.0, point_size=400.0)
    meta, frames = _read_mp4(path)
    assert frames.shape == (2, 240, 320, 3) and meta["fps"] == 30
    # the axes fill the bottom 92% of the frame: the sphere's centre is at (w/2, h - 0.46 h)
    cy, cx = round(240 - 0.46 * 240), 160
    centre = frames[0, cy - 2 : cy + 3, cx - 2 : cx + 3].reshape(-1, 3).mean(0)
    np.testing.assert_allclose(centre, 255 * np.array(to_rgb(PALETTE[0])), atol=20)  # H.264 is lossy
    far = frames[0, 20:40, 20:40].reshape(-1, 3).mean(0)
    assert far.min() > 230  # the corner is background


def test_frames_interpolate_rotate_and_trail(tmp_path):
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((200, 3))
    x1 = x0 + np.array([0, 0, 3.0])
    x = np.stack([x0, x1]) / np.linalg.norm(np.stack([x0, x1]), axis=-1, keepdims=True)
    traj = _traj(x)
    still = render_movie(traj, tmp_path / "a.mp4", frames=6, resolution=(160, 120))
    _, a = _read_mp4(still)
    assert len(a) == 6
    diff = np.abs(np.diff(a.astype(int), axis=0)).sum(-1)
    assert ((diff > 60).sum(axis=(1, 2)) > 20).all()  # the tokens move every frame
    _, b = _read_mp4(render_movie(traj, tmp_path / "b.mp4", frames=6, resolution=(160, 120), rotate=90.0))
    assert np.abs(a[0].astype(int) - b[0].astype(int)).max() < 40  # same start
    assert (np.abs(a[-1].astype(int) - b[-1].astype(int)).sum(-1) > 60).sum() > 50  # turned camera
    _, c = _read_mp4(render_movie(traj, tmp_path / "c.mp4", frames=6, resolution=(160, 120), trails=3))
    assert np.abs(a[0].astype(int) - c[0].astype(int)).max() < 40  # nothing to trail yet
    inked = lambda f: (f.astype(int).sum(-1) < 600).sum()
    assert inked(c[-1]) > inked(a[-1]) + 20  # trails add ink behind the tokens


def test_gif(tmp_path):
    x = np.random.default_rng(1).standard_normal((3, 50, 5))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    path = render_movie(_traj(x), tmp_path / "m.gif", resolution=(128, 96), fps=10)
    with Image.open(path) as im:
        assert im.format == "GIF" and im.size == (128, 96) and im.n_frames == 3


def test_settings_are_checked(tmp_path, traj3):
    with pytest.raises(ValueError, match="even"):
        render_movie(traj3, tmp_path / "m.mp4", resolution=(321, 240))
    with pytest.raises(ValueError, match=".mp4 or .gif"):
        render_movie(traj3, tmp_path / "m.avi")
    with pytest.raises(ValueError, match="WIDTHxHEIGHT"):
        parse_resolution("1280by720")
    assert parse_resolution("640x480") == (640, 480)
    with pytest.raises(ValueError, match="not both"):
        render_movie(traj3, tmp_path / "m.mp4", MovieSettings(), fps=3)
    assert not list(tmp_path.iterdir())  # nothing half-written
