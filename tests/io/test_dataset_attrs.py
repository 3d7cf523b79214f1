"""Every dataset attnflow writes describes itself: each variable and coordinate has ``long_name``,
``units`` and ``description``; runs keep their parameters in ``ds.attrs``; old folders still load."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

import attnflow as af
from attnflow.config import apply_overrides, preset_config
from attnflow.core import tokens
from attnflow.core.heads import identity_heads
from attnflow.io.metadata import REQUIRED_ATTRS, missing_attrs
from attnflow.io.store import CONFIG, DATASET, write_dataset
from attnflow.runs import run_config
from helpers import skip_without_sweep_extra

pd = pytest.importorskip("pandas")  # the sweep extra (xarray needs it too)

SMALL = ["tokens.n=12", "heads.count=2", "integration.t_end=0.2", "integration.dt=0.02", "integration.save_every=5"]


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    cfg = apply_overrides(preset_config("ou"), SMALL)
    traj = run_config(cfg)
    path = tmp_path_factory.mktemp("attrs") / "run"
    traj.save(path, figures=False)
    return traj, path


def test_missing_attrs_flags_a_bare_variable():
    """Negative control: one variable without attributes is reported, by name."""
    ds = xr.Dataset({"a": ("n", np.zeros(2), {"long_name": "a", "units": "1", "description": "a"}), "b": ("n", [1, 2])})
    ds["n"] = ("n", [0, 1], {"long_name": "n", "units": "1", "description": "index"})
    assert missing_attrs(ds) == ["b"]
    ds["b"].attrs.update(long_name="b", units="1")  # a description is required too
    assert missing_attrs(ds) == ["b"]
    ds["b"].attrs["description"] = "b"
    assert missing_attrs(ds) == []


def test_run_dataset_describes_every_variable(saved_run):
    traj, path = saved_run
    ds = xr.open_zarr(path / DATASET)
    assert missing_attrs(ds) == []
    for name in ("time", "token", "dim", "head", "step"):
        assert name in ds.coords
    np.testing.assert_array_equal(ds["token"].values, np.arange(12))
    assert ds["step_time"].dims == ("step",) and "step_time" in ds.coords
    np.testing.assert_array_equal(ds["step_time"].values, traj.steps["step_time"])
    assert ds["clusters"].dtype.kind == "i"
    np.testing.assert_array_equal(ds["clusters"].values, traj.diagnostics["clusters"])
    assert ds["energy"].attrs["description"] == af.analysis.diagnostics.DIAGNOSTICS["energy"]
    assert ds["step_slope_action"].attrs["description"] == af.analysis.edi.STEP_SERIES["step_slope_action"]
    a = ds.attrs
    assert (a["cluster_eps"], a["weights_process"], a["beta"], a["N"], a["d"], a["H"]) == (1e-3, "ou", 4.0, 12, 3, 2)
    assert json.loads(a["config"]) == traj.config
    assert json.loads(a["provenance"])["complete"] is True
    for key, value in a.items():  # zarr- and netCDF-safe: numbers and strings only
        assert isinstance(value, (int, float, str)), key


def test_run_round_trips_and_save_writes_the_config(saved_run):
    traj, path = saved_run
    assert (path / CONFIG).is_file()  # traj.save from Python, for a run made from a config
    back = af.load(path)
    assert back.config == traj.config
    for k, v in traj.diagnostics.items():
        np.testing.assert_array_equal(back.diagnostics[k], v)
        # counts are integers (issue 31), the other diagnostics floats
        assert back.diagnostics[k].dtype == (np.int64 if k == "clusters" else np.float64)
    assert list(back.steps) == list(traj.steps)
    for k, v in traj.steps.items():
        np.testing.assert_array_equal(back.steps[k], v)
    np.testing.assert_array_equal(back.x, traj.x)


def test_python_run_without_config_is_described(tmp_path):
    x0 = tokens.uniform(6, 3, seed=0)
    traj = af.simulate(x0, identity_heads(2, 3, beta=1.0), model="gf", t_end=0.1, dt=0.05, cluster_eps=0.01)
    traj.save(tmp_path / "py", figures=False)
    assert not (tmp_path / "py" / CONFIG).exists()
    ds = xr.open_zarr(tmp_path / "py" / DATASET)
    assert missing_attrs(ds) == []
    assert "config" not in ds.attrs and ds.attrs["N"] == 6
    assert af.load(tmp_path / "py").config is None


def test_old_run_folders_still_load(saved_run, tmp_path):
    """A folder of the previous format: no attributes, float clusters, step_time a data variable."""
    traj, path = saved_run
    import shutil

    old = tmp_path / "old"
    shutil.copytree(path, old)
    ds = xr.open_zarr(path / DATASET).load()
    bare = xr.Dataset(
        {k: (v.dims, v.values.astype(np.float64) if k == "clusters" else v.values) for k, v in ds.data_vars.items()}
        | {"step_time": (("step",), ds["step_time"].values)},
        coords={"time": ds["time"].values},
        attrs={k: ds.attrs[k] for k in ("model", "method", "dt", "seed", "steps_weights_rule", "steps_quadrature")},
    )
    shutil.rmtree(old / DATASET)
    write_dataset(bare, old / DATASET)
    (old / "manifest.json").unlink()  # the previous format had no manifest of digests either
    with pytest.warns(UserWarning, match="no manifest.json"):
        back = af.load(old)
    for k, v in traj.diagnostics.items():
        np.testing.assert_array_equal(back.diagnostics[k], v)
    assert list(back.steps) == list(traj.steps)
    np.testing.assert_array_equal(back.steps["step_time"], traj.steps["step_time"])


def test_sweep_tables_describe_every_column(tmp_path):
    skip_without_sweep_extra()
    from attnflow.sweep.runner import run_batch
    from attnflow.sweep.spec import parse_sweep, sweep_points
    from attnflow.sweep.table import POINTS, RESULTS, TIMESERIES, assemble

    spec = parse_sweep(
        {
            "base": "ou",
            "set": {"tokens.n": 6, "heads.count": 2, "integration.t_end": 0.2, "integration.dt": 0.05},
            "grid": {"product": {"heads.beta": [1.0, 2.0]}},
        }
    )
    pts = sweep_points(spec)
    (tmp_path / POINTS).mkdir()
    run_batch(
        [{"id": p.id, "index": p.index, "params": p.params, "seed": p.seed, "config": p.config} for p in pts],
        str(tmp_path),
    )
    assemble(tmp_path, pts)
    for name in (TIMESERIES, RESULTS):
        frame = pd.read_parquet(tmp_path / name)
        cols = frame.attrs["columns"]
        bare = [c for c in frame.columns if any(not cols.get(c, {}).get(a) for a in REQUIRED_ATTRS)]
        assert bare == [], name
    ts = pd.read_parquet(tmp_path / TIMESERIES)
    assert ts.attrs["columns"]["heads.beta"]["description"] == "swept parameter heads.beta of the run config"


def test_hf_comparison_describes_every_variable(tmp_path):
    from attnflow.hf.flow import Comparison

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5, 4))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    cmp = Comparison(real=x, sim=x[::-1].copy(), ids=np.arange(5), radius=np.ones(2), cluster_eps=1e-3)
    write_dataset(cmp.to_xarray(), tmp_path / "c.zarr")
    ds = xr.open_zarr(tmp_path / "c.zarr")
    assert missing_attrs(ds) == []
    assert ds["clusters_real"].dtype.kind == "i"
    for name in ("layer", "block", "token", "dim", "bin"):
        assert name in ds.coords


@pytest.mark.slow
def test_reproduce_datasets_describe_every_variable(tmp_path):
    """The datasets of `attnflow reproduce all --quick` (about 3 minutes)."""
    from attnflow.experiments import reproduce

    reproduce("all", out=tmp_path, quick=True)
    folders = sorted(p.parent for p in tmp_path.glob("*/dataset.zarr"))
    assert len(folders) == 6
    for folder in folders:
        assert missing_attrs(xr.open_zarr(folder / DATASET)) == [], folder.name
