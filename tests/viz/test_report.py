"""The report's content: frames, cluster colours, PCA view, weights' path, config/provenance."""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy.sparse.csgraph import connected_components

from attnflow.viz.report import REPORT, frame_indices, report_figure, write_report
from attnflow.viz.views import cluster_labels, head_norms, interpolate_tokens, pca_basis, view3d
from helpers import small_trajectory


def test_frame_indices_spread_and_keep_ends():
    assert frame_indices(5, 200).tolist() == [0, 1, 2, 3, 4]
    idx = frame_indices(1001, 11)
    assert idx.tolist() == list(range(0, 1001, 100))
    with pytest.raises(ValueError, match="max_frames"):
        frame_indices(10, 1)


def test_cluster_labels_match_count_and_are_stable():
    rng = np.random.default_rng(0)
    centres = np.eye(3)
    x = np.repeat(centres, [5, 3, 4], axis=0) + 1e-5 * rng.standard_normal((12, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    perm = rng.permutation(12)
    lab = cluster_labels(x[perm])
    # three clusters, numbered by their smallest token index: label 0 holds token 0
    assert lab.max() + 1 == 3 == connected_components(x @ x.T > 1 - 1e-3)[0]
    assert lab[0] == 0
    firsts = [np.flatnonzero(lab == c).min() for c in range(3)]
    assert firsts == sorted(firsts)
    # same partition as the ground truth
    truth = np.repeat([0, 1, 2], [5, 3, 4])[perm]
    for c in range(3):
        assert len(set(truth[lab == c])) == 1


def test_pca_view_explained_variance_against_covariance_eigenvalues():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 50, 6)) * np.array([3, 2, 1, 0.5, 0.2, 0.1])
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    v = view3d(x)
    flat = x.reshape(-1, 6)
    ev = np.linalg.eigvalsh(np.cov(flat.T, bias=True))[::-1]
    np.testing.assert_allclose(v.explained, ev[:3] / ev.sum(), rtol=1e-10)
    assert not v.on_sphere and v.xyz.shape == (4, 50, 3)
    assert v.axis_titles[0] == f"PC1 ({100 * ev[0] / ev.sum():.1f}%)"
    basis, _ = pca_basis(x)
    np.testing.assert_allclose(basis @ basis.T, np.eye(3), atol=1e-12)


def test_interpolation_hits_saved_states_and_stays_on_sphere():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 10, 3))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    t = np.array([0.0, 1.0, 3.0])
    y = interpolate_tokens(x, t, np.array([0.0, 1.0, 3.0, 2.0]))
    np.testing.assert_allclose(y[:3], x, atol=1e-14)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), 1.0, atol=1e-14)
    mid = (x[1] + x[2]) / np.linalg.norm(x[1] + x[2], axis=-1, keepdims=True)
    np.testing.assert_allclose(y[3], mid, atol=1e-14)


def test_report_figure_frames_follow_the_trajectory(traj3):
    fig = report_figure(traj3, max_frames=8)
    idx = frame_indices(len(traj3.t), 8)
    assert [f.name for f in fig.frames] == [str(k) for k in idx]
    steps = fig.layout.sliders[0].steps
    assert len(steps) == len(idx) and steps[-1].label == f"{traj3.t[-1]:.3g}"
    last = fig.frames[-1]
    tok = last.data[0]
    np.testing.assert_allclose(np.c_[tok.x, tok.y, tok.z], traj3.x[-1], atol=1e-6)  # float32 on the page
    # colours are cluster labels: their count is the run's own cluster diagnostic
    assert len(np.unique(tok.customdata)) == int(traj3.diagnostics["clusters"][-1])
    # every curve panel's time marker sits at the frame's time
    for marker in last.data[1:]:
        assert tuple(marker.x) == (traj3.t[-1], traj3.t[-1])
    # the weights' path: one curve per head with ||A_h(t)||_F
    heads = [tr for tr in fig.data if (tr.name or "").startswith("head ")]
    assert len(heads) == traj3.H
    np.testing.assert_allclose(heads[1].y, np.linalg.norm(traj3.A[:, 1], axis=(1, 2)))
    np.testing.assert_allclose(head_norms(traj3)["A"][:, 0], heads[0].y)


def test_write_report_is_self_contained_and_carries_config(run_dir3):
    path = write_report(run_dir3)
    assert path == run_dir3 / REPORT
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    # plotly.js is inlined; nothing is fetched from the network
    assert "Plotly" in page and len(page) > 3_000_000
    assert not re.search(r"<script[^>]+src=", page)
    assert "cluster_eps: 0.001" in page  # the config, as YAML
    assert "git_commit" in page and "wall_time_s" in page  # the provenance
    assert "Play" in page


def test_report_for_d_greater_than_3_shows_pca(tmp_path):
    traj = small_trajectory(n=40, d=5, H=2, t_end=0.4, dt=0.1)
    page = write_report(traj, tmp_path / "r.html").read_text()
    var = view3d(traj.x).explained
    assert "top three principal directions" in page
    assert f"PC1 ({100 * var[0]:.1f}%)" in page
    assert f"{100 * var.sum():.1f}% of the variance" in page


def test_write_report_needs_a_path_for_a_trajectory(traj3):
    with pytest.raises(ValueError, match="needs out=PATH"):
        write_report(traj3)


def test_scene_axes_are_fixed_over_all_frames():
    traj = small_trajectory(n=30, d=6, H=2, t_end=0.3, dt=0.1)
    fig = report_figure(traj)
    xyz = view3d(traj.x).xyz
    for i, axis in enumerate(("xaxis", "yaxis", "zaxis")):
        lo, hi = fig.layout.scene[axis].range
        assert lo < xyz[..., i].min() and hi > xyz[..., i].max()


def test_cluster_labels_of_a_large_cloud_use_the_grid_and_agree_with_dense(monkeypatch):
    import attnflow.viz.views as views
    from attnflow import tokens

    rng = np.random.default_rng(3)
    # a mix: tight clusters, looser clusters with spread near the threshold, and scattered tokens
    x = np.concatenate(
        [
            tokens.vmf_mixture(900, 3, k=4, kappa=4e5, seed=1),
            tokens.vmf_mixture(600, 3, k=3, kappa=2e3, seed=2),
            tokens.uniform(300, 3, seed=3),
        ]
    )[rng.permutation(1800)]
    dense = cluster_labels(x)  # 1800 <= GRAM_BLOCK_TOKENS: the one-matrix path
    monkeypatch.setattr(views, "GRAM_BLOCK_TOKENS", 100)
    grid = cluster_labels(x)
    assert 10 < dense.max() + 1 < 1800  # neither trivial extreme
    np.testing.assert_array_equal(grid, dense)


def test_report_draws_a_subset_of_a_large_cloud_with_whole_cloud_clusters(traj3):
    from attnflow.viz.report import token_subset

    fig = report_figure(traj3, max_frames=4, max_tokens=10)
    shown = token_subset(traj3.N, 10)
    assert len(shown) == 10 < traj3.N and np.all(np.diff(shown) > 0)
    last = fig.frames[-1]
    np.testing.assert_allclose(np.c_[last.data[0].x, last.data[0].y, last.data[0].z], traj3.x[-1][shown], atol=1e-6)
    # the colours are the whole cloud's labels, restricted; the title counts the whole cloud's clusters
    np.testing.assert_array_equal(np.asarray(last.data[0].customdata).ravel(), cluster_labels(traj3.x[-1])[shown])
    assert f"clusters = {int(traj3.diagnostics['clusters'][-1])}" in last.layout.title.text
    assert f"10 of {traj3.N} tokens drawn" in last.layout.title.text
    assert np.array_equal(token_subset(5, 10), np.arange(5))
    with pytest.raises(ValueError, match="max_tokens"):
        token_subset(5, 0)


def test_the_page_holds_plotly_js_and_each_array_once(traj3):
    """Issue 43: plotly.js is inlined once, and an array used by several traces or frames (the token
    colours of every frame, the time axis of every curve) is written once and referenced."""
    import json

    from attnflow.viz.report import pack_figure, report_html, report_spec

    spec = report_spec(traj3, max_frames=8)
    shared, fig = pack_figure(spec)
    colour_refs = {json.dumps(f["data"][0]["marker"]["color"]) for f in fig["frames"]}
    colour_refs.add(json.dumps(next(d for d in fig["data"] if d["name"] == "tokens")["marker"]["color"]))
    assert len(colour_refs) == 1 and '"$ref"' in colour_refs.pop()  # one entry for all 9 uses
    time_refs = {json.dumps(d["x"]) for d in fig["data"] if d["name"].startswith("head ")}
    assert len(time_refs) == 1 and len(fig["frames"]) == 8
    entries = [json.dumps(e, sort_keys=True) for e in shared]
    assert len(entries) == len(set(entries))  # nothing shared twice
    page = report_html(traj3, max_frames=8, ended="a state")
    assert page.count("plotly.js v") == 1 and page.count("Plotly.newPlot(") == 1
    colours = json.dumps(spec["frames"][0]["data"][0]["marker"]["color"], separators=(",", ":"))
    assert page.count(colours) == 1
    # negative control: without sharing, the colours are written once per frame and for the first trace
    _, unshared = pack_figure(spec, min_length=10**9)
    text = json.dumps(unshared, separators=(",", ":"))
    assert text.count(colours) == len(spec["frames"]) + 1
