"""``attnflow pde CONFIG --out DIR``: the folder it writes, and the one-sentence refusals (exit 2)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnflow.cli import app

pytestmark = pytest.mark.integration

CIRCLE = """name: t
model: gf
d: 2
heads: {count: 2, preset: identity, beta: 3.0}
weights: {process: oscillating, amplitude: 0.3, omega: 2.0, phase: zero}
initial: {kind: perturbed, eps: 0.2, degrees: [1, 4]}
grid: {lmax: 16}
integration: {t_end: 0.2, dt: 0.02, save_every: 2}
"""


def _run(args):
    return CliRunner().invoke(app, args)


def test_pde_command_writes_a_described_dataset(tmp_path):
    import xarray as xr

    from attnflow.io.metadata import missing_attrs

    cfg = tmp_path / "c.yaml"
    cfg.write_text(CIRCLE)
    out = tmp_path / "out"
    r = _run(["pde", str(cfg), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert {p.name for p in out.iterdir()} == {
        "dataset.zarr",
        "config.yaml",
        "figures",
        "manifest.json",
        "provenance.json",
    }
    ds = xr.open_zarr(out / "dataset.zarr")
    assert missing_attrs(ds) == []
    assert ds.attrs["Conventions"].startswith("CF")
    assert float(abs(ds["mass"] - 1).max()) < 1e-12
    assert ds.sizes["time"] == 6 and (ds["energy"].diff("time") < 0).all()
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["complete"] is True and prov["kind"] == "pde"
    assert {p.name for p in (out / "figures").iterdir()} == {"density.png", "energy.png", "degree_power.png"}
    # an existing folder is refused without --force, replaced with it
    assert _run(["pde", str(cfg), "--out", str(out)]).exit_code == 2
    assert _run(["pde", str(cfg), "--out", str(out), "--force"]).exit_code == 0


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ("grid: {lmax: 100000}", "lmax"),
        ("d: 4", "d"),
        ("integration: {t_end: 1.0, dt: 0.3}", "whole number"),
        ("initial: {kind: perturbed, eps: 2.0}", "eps"),
        ("bogus: 1", "bogus"),
    ],
)
def test_bad_configs_exit_2_with_one_paragraph(tmp_path, patch, needle):
    cfg = tmp_path / "c.yaml"
    key = patch.split(":")[0]
    lines = [ln for ln in CIRCLE.splitlines() if not ln.startswith(key + ":")]
    cfg.write_text("\n".join(lines + [patch]) + "\n")
    r = _run(["pde", str(cfg), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_lost_resolution_is_one_sentence_and_writes_nothing(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CIRCLE.replace("beta: 3.0", "beta: 12.0").replace("t_end: 0.2", "t_end: 2.0"))
    r = _run(["pde", str(cfg), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    text = " ".join(r.output.split())
    assert "no longer resolved" in text and "Traceback" not in text
    assert not (tmp_path / "o").exists()
