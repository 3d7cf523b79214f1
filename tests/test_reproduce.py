"""attnflow reproduce: the quick suite passes every prediction; the Lipschitz bound is a bound."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attnflow.cli.main import app
from attnflow.dynamics.lipschitz import lipschitz_bound
from attnflow.experiments.report import README_BEGIN, README_END
from conftest import random_sym, random_tokens


@pytest.mark.parametrize("model", ["gf", "mha"])
def test_lipschitz_bound_dominates_the_jacobian(rng, model):
    """L bounds the a-weighted operator norm of the particle field's Jacobian (autograd) at random states."""
    import attnflow as af

    N, d, H = 12, 3, 3
    for _ in range(5):
        A = random_sym(rng, H, d, 0.8) if model == "gf" else rng.standard_normal((H, d, d)) * 0.5
        V = None if model == "gf" else rng.standard_normal((H, d, d)) * 0.5
        x = torch.from_numpy(random_tokens(rng, N, d))
        f = lambda y, A=A, V=V: af.velocity(
            y.reshape(N, d), torch.from_numpy(A), None if V is None else torch.from_numpy(V), model=model
        ).reshape(-1)
        J = torch.autograd.functional.jacobian(f, x.reshape(-1)).numpy()
        # Uniform masses: ||.||_a is a multiple of the Euclidean norm, so the operator norms agree.
        assert np.linalg.norm(J, 2) <= lipschitz_bound(A, V, model=model)


def test_reproduce_all_quick_passes(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{README_BEGIN}\nold\n{README_END}\noutro\n")
    out = tmp_path / "rep"
    r = CliRunner().invoke(app, ["reproduce", "all", "--quick", "--out", str(out), "--readme", str(readme)])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    assert res["passed"] is True
    h = json.loads((out / "heads" / "results.json").read_text())["heads"]
    assert h["ci"][0] < h["exponent"] < h["ci"][1] and -1.6 < h["exponent"] < -0.4
    for name in ("ou", "oscillating", "heads", "edi", "stability-input", "stability-weights"):
        folder = out / name
        assert json.loads((folder / "provenance.json").read_text())["complete"] is True
        assert (folder / "configs.yaml").is_file() and (folder / "dataset.zarr").is_dir()
        assert list((folder / "figures").glob("*.png")) and list((folder / "figures").glob("*.pdf"))
    report = (out / "report.md").read_text()
    assert "FAIL" not in report and report.count("PASS") >= 10
    assert (out / "report.html").read_text().count("data:image/png;base64,") >= 6
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "\nold\n" not in text and "| heads |" in text
    # The ou folder is a core run folder: attnflow.load reads its trajectory.
    import attnflow as af

    assert af.load(out / "ou").model == "gf"


def test_reproduce_rejects_unknown_names(tmp_path):
    r = CliRunner().invoke(app, ["reproduce", "nope", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "unknown experiment" in r.output
