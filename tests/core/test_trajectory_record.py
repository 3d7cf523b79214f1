"""The Trajectory record sits in core; its disk format stays in io and its conveniences come from the package root."""

from __future__ import annotations

import numpy as np

import attnflow as af
import attnflow.io
from attnflow.config.spec import RunSpec
from attnflow.core.trajectory import Trajectory
from attnflow.io import trajectory as io_trajectory


def test_one_record_under_every_documented_name():
    assert af.Trajectory is Trajectory
    assert io_trajectory.Trajectory is Trajectory
    assert attnflow.io.Trajectory is Trajectory


def test_first_cuts_the_saved_times_and_keeps_the_rest():
    x = np.random.default_rng(0).standard_normal((5, 4, 3))
    tr = Trajectory(
        t=np.arange(5.0), x=x, A=np.ones((5, 2, 3, 3)), V=None,
        diagnostics={"energy": np.arange(5.0), "clusters": np.array([4.0, 3, 2, 1, 1])},
        token_weights=np.full(4, 0.25), head_weights=np.full(2, 0.5), model="gf", method="rk4", dt=0.1,
        steps={"step_time": np.arange(1.0, 10.0)},
    )  # fmt: skip
    head = tr.first(3)
    assert np.array_equal(head.t, [0.0, 1.0, 2.0]) and np.array_equal(head.x, x[:3])
    assert head.A.shape == (3, 2, 3, 3) and head.V is None
    assert np.array_equal(head.diagnostics["clusters"], [4, 3, 2]) and head.diagnostics["clusters"].dtype == np.int64
    assert head.token_weights is tr.token_weights and head.steps is tr.steps
    assert len(tr.t) == 5  # the original is untouched


def test_spec_and_save_go_through_the_layers_above(tmp_path):
    x0 = np.eye(3)[[0, 1, 2, 0]] + 0.1
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    tr = af.simulate(x0, 1.5 * np.eye(3)[None], model="gf", t_end=0.2, dt=0.1)
    assert isinstance(tr.spec, RunSpec) and tr.spec.cluster_eps == 1e-3
    out = tr.save(tmp_path / "run", figures=False)
    back = af.load(out)
    assert type(back) is Trajectory and np.array_equal(back.x, tr.x)
    assert not (out / "figures").exists()
    assert back.to_xarray()["x"].shape == tr.x.shape
