"""``attnflow bench``: time the attention field's backends side by side and write JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from attnflow.cli.app import UserError, app, console, guarded


@app.command()
@guarded
def bench(
    quick: bool = typer.Option(False, "--quick", help="Small sizes only (about a minute)."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write the results as JSON to this file."),
    markdown_file: Optional[Path] = typer.Option(None, "--markdown", help="Also write the table as Markdown."),
    metastability: Optional[bool] = typer.Option(
        None,
        "--metastability/--no-metastability",
        help="Adaptive steps vs fixed-step rk4 through clustering plateaus (N = 64, beta = 9, t = 1e4; several "
        "minutes). Default: on in the full suite, off with --quick.",
    ),
    only_metastability: bool = typer.Option(
        False, "--only-metastability", help="Run the metastability benchmark alone (skips the field timings)."
    ),
) -> None:
    """Time one field evaluation and a 100-step run: numpy reference vs dense vs fast summation; and
    adaptive steps vs fixed-step rk4 on a metastable clustering run (field evaluations and wall time).

    Examples:

      attnflow bench --quick

      attnflow bench --json bench.json --markdown bench.md
    """
    from attnflow.bench.harness import HEADER, markdown, run_benchmarks, table_rows

    for path in (json_file, markdown_file):
        if path is not None and not path.parent.exists():
            raise UserError(f"the folder of {str(path)!r} does not exist; create it or choose another path.")
    from attnflow.bench.metastability import META_HEADER, meta_markdown, meta_rows, meta_title, run_metastability

    wide = Console(width=max(Console().width, 170))
    result: dict = {}
    text = ""
    if not only_metastability:
        result = run_benchmarks(quick=quick, progress=lambda s: console.print(f"measuring {s} ..."))
        table = Table(
            title=f"attnflow bench (exp throughput {result['machine']['exp_per_s']:.3g} /s, beta {result['beta']})"
        )
        for h in HEADER:
            table.add_column(h, justify="left" if h in ("backend", "dtype") else "right")
        for row in table_rows(result):
            table.add_row(*row)
        wide.print(table)
        text = markdown(result)
    if only_metastability or (metastability if metastability is not None else not quick):
        meta = run_metastability(progress=lambda s: console.print(f"metastability: {s} ..."))
        result["metastability"] = meta
        mt = Table(title=meta_title(meta))
        for h in META_HEADER:
            mt.add_column(h, justify="left" if h == "method" else "right")
        for row in meta_rows(meta):
            mt.add_row(*row)
        wide.print(mt)
        text += ("\n" if text else "") + meta_markdown(meta)
    if json_file is not None:
        json_file.write_text(json.dumps(result, indent=2))
        console.print(f"wrote {json_file}")
    if markdown_file is not None:
        markdown_file.write_text(text)
        console.print(f"wrote {markdown_file}")
