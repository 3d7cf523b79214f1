"""Data details (issue 31, item 12): CF ``Conventions``, integer cluster counts everywhere, the
head weights' long name, one figure resolution, and what ``.gitignore`` keeps out of the clone."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

import attnflow as af
from attnflow import heads, tokens
from attnflow.core.figures import FIGURE_DPI

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    traj = af.simulate(
        tokens.uniform(10, 3, seed=0), heads.identity_heads(2, 3, beta=4.0), t_end=0.1, dt=0.02, save_every=1
    )
    out = tmp_path_factory.mktemp("dd") / "run"
    traj.save(out)
    return out


def test_conventions_attribute(run_dir: Path) -> None:
    ds = xr.open_zarr(run_dir / "dataset.zarr")
    assert ds.attrs["Conventions"] == "CF-1.10"
    assert af.load(run_dir).to_xarray().attrs["Conventions"] == "CF-1.10"


@pytest.mark.integration
def test_clusters_are_integers_in_memory_on_disk_and_in_show_json(run_dir: Path) -> None:
    traj = af.load(run_dir)
    assert traj.diagnostics["clusters"].dtype == np.int64
    assert np.issubdtype(xr.open_zarr(run_dir / "dataset.zarr")["clusters"].dtype, np.integer)
    sim = af.simulate(tokens.uniform(6, 3, seed=1), heads.identity_heads(1, 3, beta=1.0), t_end=0.04, dt=0.02)
    assert sim.diagnostics["clusters"].dtype == np.int64
    from attnflow.cli import app

    res = CliRunner().invoke(app, ["show", str(run_dir), "--json"])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout[res.stdout.index("{") :])
    assert all(isinstance(v, int) for v in rec["diagnostics"]["clusters"]), rec["diagnostics"]["clusters"]
    assert all(isinstance(v, float) for v in rec["diagnostics"]["energy"])  # control: energies stay floats
    # a missing count (NaN) keeps the array float rather than inventing a number
    t = af.Trajectory(t=np.zeros(2), x=np.zeros((2, 1, 3)), A=np.zeros((2, 1, 3, 3)), V=None,
                      diagnostics={"clusters": np.array([1.0, np.nan])}, token_weights=np.ones(1),
                      head_weights=np.ones(1), model="gf", method="rk4", dt=0.1)  # fmt: skip
    assert t.diagnostics["clusters"].dtype == np.float64


def test_head_weights_long_name(run_dir: Path) -> None:
    attrs = xr.open_zarr(run_dir / "dataset.zarr")["head_weights"].attrs
    assert attrs["long_name"] == "head weight w_h" and "mass" not in attrs["long_name"]


def test_one_figure_resolution(run_dir: Path) -> None:
    from PIL import Image

    pngs = sorted((run_dir / "figures").glob("*.png"))
    assert pngs
    for p in pngs:
        dpi = Image.open(p).info["dpi"]
        assert round(dpi[0]) == FIGURE_DPI, (p.name, dpi)
    # every savefig in the package passes FIGURE_DPI (the movie sets its pixel size instead)
    literal = re.compile(r"savefig\([^)]*dpi=\d+|dpi: int = \d+")
    offenders = [str(f) for f in (ROOT / "src").rglob("*.py") if literal.search(f.read_text())]
    assert offenders == []
    assert literal.search("fig.savefig(path, dpi=90)")  # control


@pytest.mark.integration
def test_gitignore_covers_what_the_documented_commands_write() -> None:
    paths = ["runs/ou/dataset.zarr", "models/all-MiniLM-L6-v2/config.json", "ou.mp4", "runs/first.mp4"]
    res = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True)
    assert sorted(res.stdout.split()) == sorted(paths)
    # control: source files are not ignored, not even a new module of the `runs` package
    for path in ("src/attnflow/__init__.py", "src/attnflow/runs/new_module.py"):
        control = subprocess.run(["git", "check-ignore", path], cwd=ROOT, capture_output=True)
        assert control.returncode == 1, path
