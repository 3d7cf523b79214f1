"""``attnflow pde CONFIG --out DIR``: solve the Transformer PDE for the token density and save it."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from attnflow.cli.app import OUT_FLAGS, app, guarded, progress_bar, say
from attnflow.core.files import read_regular


@app.command()
@guarded(flags=OUT_FLAGS)
def pde(
    config: Path = typer.Argument(
        ..., help="A PDE config (YAML): model, d, heads, weights, initial, grid, integration."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder to write (must not exist unless --force)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing attnflow output folder."),
) -> None:
    """Solve d/dt rho + div(rho v[rho]) = 0 for the token density on the circle or S^2 and save it.

    Writes OUT/dataset.zarr (coefficients, density on the grid, energy, slope, mass, the EDI budget;
    CF attributes), config.yaml, figures/, manifest.json and provenance.json. Stops with one sentence
    (exit code 2) once the density concentrates beyond the resolution grid.lmax. Example:

      attnflow pde examples/pde_circle.yaml --out runs/pde
    """
    from attnflow.pde.config import build_pde, load_pde_config
    from attnflow.pde.output import write_pde_folder
    from attnflow.pde.solver import solve_pde
    from attnflow.runs.runner import check_out

    cfg = load_pde_config(config)
    check_out(out, force)
    c0, process, kwargs = build_pde(cfg)
    n_steps = round(cfg.integration.t_end / cfg.integration.dt)
    with progress_bar(f"pde {cfg.name}") as bar:
        task = bar.add_task(escape(cfg.name), total=n_steps)
        sol = solve_pde(c0, process, progress=lambda k, n: bar.update(task, completed=k), **kwargs)
    text = read_regular(config, max_bytes=4 * 1_000_000).decode("utf-8")
    write_pde_folder(sol, out, config_text=text, config=cfg.model_dump(mode="json"), overwrite=force)
    line = f"wrote {out}  ({len(sol.t)} saved times, mass drift {sol.mass_error:.1e}"
    if cfg.model == "gf" and len(sol.steps["t"]):
        line += f", EDI residual {sol.edi_residual()[-1]:.2e} of dissipation {sol.edi_scale():.3g}"
    say(line + ")")
