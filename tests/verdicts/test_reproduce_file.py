"""``attnflow reproduce FILE.py``: a claim written in one file runs like a built-in, PASS and FAIL with margins."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnflow.cli.main import app

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

CONJECTURE = textwrap.dedent(
    '''
    import numpy as np
    from attnflow.verdicts import Estimate, Prediction, Space, Uniform, Within, Below, experiment

    @experiment("sample-mean", space=Space(mu=Uniform(1.0, 2.0), sigma=Uniform(0.5, 1.0)), seeds=1)
    def claim(params, seed):
        """The sample mean of N(mu, sigma^2) draws estimates mu; a shifted law's does not."""
        rng = np.random.default_rng(seed)
        mu, sigma, n = params["mu"], params["sigma"], 4000
        x = rng.normal(mu, sigma, n)
        y = rng.normal(mu + 1.0, sigma, n)  # the control: a law whose mean is not mu
        est = lambda v: Estimate(float(v.mean()), float(v.std(ddof=1) / np.sqrt(n)))
        return [
            Prediction("the sample mean is mu", est(x), est(y), Within(mu, 0.2)),
            # False: the mean is mu, not below mu - 0.5 (this one must FAIL)
            Prediction("the sample mean is below mu - 0.5", est(x), est(y), Below(mu - 0.5)),
        ]
    '''
)


def test_a_true_and_a_false_claim_in_one_file(tmp_path):
    f = tmp_path / "my_claim.py"
    f.write_text(CONJECTURE)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["reproduce", str(f), "--random-sets", "4", "--seed", "3", "--out", str(out)])
    assert r.exit_code == 1, r.output  # one claim is false: the command says so
    data = json.loads((out / "random_sets.json").read_text())
    rows = data["predictions"]
    assert (
        rows["sample-mean #1: the sample mean is mu"]["passed"]
        == rows["sample-mean #1: the sample mean is mu"]["runs"]
        == 4
    )
    assert rows["sample-mean #1: the sample mean is mu"]["min_margin"] > 5  # (0.2 - |err|) / stderr, stderr ~ 0.012
    assert rows["sample-mean #2: the sample mean is below mu - 0.5"]["passed"] == 0
    assert data["ranges"] == {"sample-mean": {"mu": "U[1, 2]", "sigma": "U[0.5, 1]"}}
    sets = data["sets"]
    assert len(sets) == 4 and len({json.dumps(s["experiments"]["sample-mean"]["overrides"]) for s in sets}) == 4
    for s in sets:
        v = s["experiments"]["sample-mean"]
        assert v["verdicts"][0].startswith("PASS (margin") and v["verdicts"][1].startswith("FAIL (margin")
        assert "FAIL (rejected" in v["controls"][0]  # the shifted law fails Within: the control is rejected
        assert s["failures"] and "measured:" in s["failures"][0]["why"]
    assert "PASS (margin" in r.output and "FAIL (margin" in r.output
    assert (out / "report.md").is_file() and (out / "manifest.json").is_file()


def test_a_file_run_at_its_default_set_writes_a_built_ins_folder(tmp_path):
    f = tmp_path / "my_claim.py"
    f.write_text(CONJECTURE.replace("Below(mu - 0.5)", "Below(mu + 0.5)"))  # both claims true now
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["reproduce", str(f), "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    assert res["passed"] is True and [p["verdict"] for p in res["predictions"]] == ["PASS", "PASS"]
    assert res["sample-mean"]["parameters"] == {"mu": 1.5, "sigma": 0.75}
    assert all(p["control_rejected"] for p in res["predictions"])
    for name in ("report.md", "manifest.json", "provenance.json", "figures/verdicts.png"):
        assert (out / name).is_file(), name


@pytest.mark.parametrize(
    "text, needle",
    [
        (None, "no such file"),
        ("x = 1\n", "defines no experiment"),
        (
            CONJECTURE.replace("rng = np.random", "raise ValueError('boom')\n    rng = np.random"),
            "raised ValueError: boom",
        ),
        ("import nonexistent_module_xyz\n", "loading it raised ModuleNotFoundError"),
    ],
)
def test_bad_files_are_one_error_line_and_exit_2(tmp_path, text, needle):
    f = tmp_path / "c.py"
    if text is not None:
        f.write_text(text)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["reproduce", str(f), "--random-sets", "1", "--out", str(out)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines[0].startswith("error:") and needle in " ".join(lines), r.output
    assert "Traceback" not in r.output


def test_the_worked_example_passes(tmp_path):
    """docs/reproduce.md's worked example, as shipped in examples/: every prediction PASS, every control rejected."""
    f = tmp_path / "conjecture_sphere_mean.py"
    shutil.copy(ROOT / "examples" / "conjecture_sphere_mean.py", f)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["reproduce", str(f), "--random-sets", "2", "--seed", "0", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "random_sets.json").read_text())
    assert data["passed"] and all(row["passed"] == row["runs"] == 2 for row in data["predictions"].values())
