"""The prompt flow of an imported checkpoint (``attnflow hf run``), the gradient-flow projection and
the ``attnflow hf`` commands, on tiny random models saved to a temporary folder (no network)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from typer.testing import CliRunner

from attnflow import Heads, load, simulate
from attnflow.cli.main import app
from attnflow.hf import extract, load_model
from attnflow.hf.flow import load_comparison, real_positions, run_prompt
from attnflow.hf.sphere import nearest_gradient_flow_heads, on_sphere, to_gradient_flow
from attnflow.hf.tiny import save_tiny
from attnflow.weights.processes import Layers

runner = CliRunner()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfflow")
    return {
        "gpt2": save_tiny("gpt2", root / "gpt2", tokenizer=True),
        "llama": save_tiny("llama", root / "llama", seed=4),
        "vit": save_tiny("vit", root / "vit"),
    }


def test_real_positions_are_the_hidden_states_on_the_sphere(ckpt):
    model = load_model(ckpt["gpt2"])
    layers = extract(model)
    ids = torch.tensor([[3, 9, 1, 4, 20, 7]])
    X, r = real_positions(model, layers, ids)
    with torch.no_grad():
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states
        emb = model.wte(ids) + model.wpe(torch.arange(6))[None]
    assert torch.allclose(hs[0], emb, atol=1e-6)
    for l in range(2):  # h_l centred and normalised, as the layer norm sees it
        h = hs[l][0].double()
        c = h - h.mean(-1, keepdim=True)
        np.testing.assert_allclose(X[l], (c / c.norm(dim=-1, keepdim=True)).numpy(), atol=1e-6)
        np.testing.assert_allclose(r[l], float(c.norm(dim=-1).mean()), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(X, axis=-1), 1.0, atol=1e-12)


def test_one_euler_step_is_the_attention_block_of_the_first_layer(ckpt):
    """``x_1 = (x_0 + P_x0 attn_0(LN_0(x_0)) / r_0) / |...|``, with ``attn_0`` and ``LN_0`` the modules."""
    traj, cmp = run_prompt(str(ckpt["gpt2"]), [5, 2, 11, 40, 8], steps_per_layer=1, method="euler")
    model = load_model(ckpt["gpt2"])
    x0 = torch.from_numpy(cmp.real[0])
    with torch.no_grad():
        y = model.h[0].ln_1(100.0 * x0.float())[None]  # LN is scale invariant; x100 makes eps negligible
        n = x0.shape[0]
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]  # the model builds it above the block
        u = model.h[0].attn(y, attention_mask=mask)[0][0].double() / cmp.radius[0]
    step = x0 + u - (u * x0).sum(-1, keepdim=True) * x0
    expect = step / step.norm(dim=-1, keepdim=True)
    np.testing.assert_allclose(traj.x[1], expect.numpy(), atol=2e-5)
    np.testing.assert_allclose(traj.t, [0.0, 1.0, 2.0])


def test_nearest_gradient_flow_head_is_the_symmetrised_average():
    g = np.random.default_rng(0)
    A, V = g.standard_normal((3, 5, 5)), g.standard_normal((3, 5, 5))
    S_heads, dist, asym, gap = nearest_gradient_flow_heads(Heads.from_matrices(A, V))
    M = (A + V) / 2
    S = (M + M.transpose(0, 2, 1)) / 2
    np.testing.assert_allclose(S_heads.A.numpy(), S, atol=1e-14)
    obj = lambda T: np.sum((A - T) ** 2) + np.sum((V - T) ** 2)
    np.testing.assert_allclose(dist, np.sqrt(obj(S) / (np.sum(A**2) + np.sum(V**2))), rtol=1e-12)
    for _ in range(20):  # every other symmetric matrix is farther
        E = g.standard_normal((3, 5, 5))
        assert obj(S + 0.1 * (E + E.transpose(0, 2, 1))) > obj(S)
    np.testing.assert_allclose(asym, np.linalg.norm(A - (A + A.transpose(0, 2, 1)) / 2) / np.linalg.norm(A), rtol=1e-12)
    np.testing.assert_allclose(gap, np.linalg.norm(V - A) / (np.linalg.norm(V) + np.linalg.norm(A)), rtol=1e-12)


def test_gradient_flow_projection_fixes_admissible_heads_and_runs_gf(ckpt):
    S = np.random.default_rng(1).standard_normal((2, 4, 4))
    S = S + S.transpose(0, 2, 1)
    proj = to_gradient_flow(Layers([S, 2 * S], t_end=2.0))
    np.testing.assert_allclose(proj.distance, 0.0, atol=1e-15)
    assert proj.dropped == ()
    layers = extract(load_model(ckpt["llama"]))
    proj = to_gradient_flow(on_sphere(layers))
    assert proj.layers.gradient_flow and proj.layers.L == 2
    assert np.all((proj.distance > 0) & (proj.distance < 1))
    assert proj.dropped == ("causal mask", "rotary embeddings")
    x0 = np.random.default_rng(2).standard_normal((6, 32))
    traj = simulate(x0, proj.layers, model="gf", t_end=2.0, dt=0.25, method="euler")
    assert np.isfinite(traj.x).all()


@pytest.mark.integration
def test_cli_verify_prints_a_table_and_fails_on_a_mismatch(ckpt, monkeypatch):
    res = runner.invoke(app, ["hf", "verify", str(ckpt["llama"]), "--tokens", "7"])
    assert res.exit_code == 0, res.output
    assert "ok" in res.output and "rotary yes" in res.output
    # An impossible tolerance makes every layer a mismatch: exit code 1, not a traceback.
    res = runner.invoke(app, ["hf", "verify", str(ckpt["vit"]), "--tol", "1e-12"])
    assert res.exit_code == 1 and "MISMATCH" in res.output


@pytest.mark.integration
def test_cli_run_writes_a_run_folder_with_the_comparison(ckpt, tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "hf",
            "run",
            str(ckpt["gpt2"]),
            "--text",
            "the cat sat on the mat",
            "--out",
            str(out),
            "--steps-per-layer",
            "4",
        ],
    )
    assert res.exit_code == 0, res.output
    traj = load(out)
    assert traj.x.shape == (3, 6, 32) and traj.model == "mha"
    ds = load_comparison(out)
    assert ds.sizes["layer"] == 3 and ds.sizes["token"] == 6
    np.testing.assert_allclose(ds.cosine_mean[0], 1.0, atol=1e-12)  # the flow starts at the model's embeddings
    np.testing.assert_allclose(ds.sim_x.values, traj.x, atol=0)
    np.testing.assert_allclose(ds.hist_real.sum("bin"), 1.0)
    assert (out / "figures" / "hf_comparison.png").is_file()
    assert ds.attrs["hf_model_type"] == "gpt2" and "cat" in ds.attrs["tokens"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, message",
    [
        (["--ids", "1,2,3"], "already exists"),
        (["--text", "a cat", "--ids", "1,2"], "not both"),
        (["--ids", "1,999"], "must be in"),
    ],
)
def test_cli_run_user_errors(args, message, ckpt, tmp_path):
    out = tmp_path if message == "already exists" else tmp_path / "new"
    res = runner.invoke(app, ["hf", "run", str(ckpt["gpt2"]), *args, "--out", str(out)])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output


@pytest.mark.integration
def test_cli_run_refuses_text_without_tokenizer_and_vision_models(ckpt, tmp_path):
    res = runner.invoke(app, ["hf", "run", str(ckpt["llama"]), "--text", "hello", "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and "--ids" in res.output
    res = runner.invoke(app, ["hf", "run", str(ckpt["vit"]), "--ids", "1,2", "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "ViT" in res.output
    res = runner.invoke(app, ["hf", "verify", str(tmp_path / "nothing-here")])
    assert res.exit_code == 2 and "never downloads" in res.output


@pytest.mark.integration
def test_cli_gf_reports_distances(ckpt):
    res = runner.invoke(app, ["hf", "gf", str(ckpt["gpt2"])])
    assert res.exit_code == 0, res.output
    assert "distance" in res.output and "causal mask" in res.output
