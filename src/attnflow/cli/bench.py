"""``attnflow bench``: time the attention field's backends side by side and write JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from attnflow.cli.app import UserError, app, guarded, say


@app.command()
@guarded
def bench(
    quick: bool = typer.Option(False, "--quick", help="Small sizes only (about a minute)."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write the results as JSON to this file."),
    markdown_file: Optional[Path] = typer.Option(None, "--markdown", help="Also write the table as Markdown."),
    loop: bool = typer.Option(
        True, "--loop/--no-loop", help="Also measure simulate's cost per step against its evaluations."
    ),
    profile: bool = typer.Option(False, "--profile", help="Only the simulation loop: where each step's time goes."),
    startup_only: bool = typer.Option(
        False, "--startup-only", help="Only time the command line's start-up (attnflow --help, --version)."
    ),
) -> None:
    """Time one field evaluation and a 100-step run: numpy reference vs dense vs fast summation.

    First it times the command line's start-up: 'attnflow --help' and 'attnflow --version' in
    fresh processes, best of 3.

    Examples:

      attnflow bench --quick

      attnflow bench --startup-only

      attnflow bench --json bench.json --markdown bench.md
    """
    from attnflow.bench.startup import cli_startup_seconds

    for path in (json_file, markdown_file):
        if path is not None and not path.parent.exists():
            raise UserError(f"the folder of {str(path)!r} does not exist; create it or choose another path.")
    startup = cli_startup_seconds(repeats=3)
    st = Table(title="command-line start-up (fresh process, best of 3)")
    st.add_column("command")
    st.add_column("seconds", justify="right")
    for label, seconds in startup.items():
        st.add_row(label, f"{seconds:.3f}")
    Console().print(st)
    if startup_only:
        if json_file is not None:
            json_file.write_text(json.dumps({"startup_s": startup}, indent=2))
            say(f"wrote {json_file}")
        return
    from attnflow.bench.harness import HEADER, markdown, run_benchmarks, table_rows
    from attnflow.bench.loop import LOOP_HEADER, loop_markdown, loop_table_rows, run_loop_benchmarks

    loop_rows = (
        run_loop_benchmarks(quick=quick, progress=lambda s: say(f"measuring {s} ...")) if loop or profile else []
    )
    if loop_rows:
        loop_table = Table(title="simulate: cost per step against its field evaluations (explicit Euler)")
        for h in LOOP_HEADER:
            loop_table.add_column(h, justify="left" if h in ("dtype", "split (evaluations per step)") else "right")
        for row in loop_table_rows(loop_rows):
            loop_table.add_row(*row)
        Console(width=max(Console().width, 170)).print(loop_table)
    if profile:
        if json_file is not None:
            json_file.write_text(json.dumps({"loop": loop_rows, "startup_s": startup}, indent=2))
            say(f"wrote {json_file}")
        if markdown_file is not None:
            markdown_file.write_text(loop_markdown(loop_rows))
            say(f"wrote {markdown_file}")
        return
    result = run_benchmarks(quick=quick, progress=lambda s: say(f"measuring {s} ..."))
    result["startup_s"] = startup
    result["loop"] = loop_rows
    table = Table(
        title=f"attnflow bench (exp throughput {result['machine']['exp_per_s']:.3g} /s, beta {result['beta']})"
    )
    for h in HEADER:
        table.add_column(h, justify="left" if h in ("backend", "dtype") else "right")
    for cells in table_rows(result):
        table.add_row(*cells)
    Console(width=max(Console().width, 170)).print(table)
    if json_file is not None:
        json_file.write_text(json.dumps(result, indent=2))
        say(f"wrote {json_file}")
    if markdown_file is not None:
        markdown_file.write_text(markdown(result) + ("\n" + loop_markdown(loop_rows) if loop_rows else ""))
        say(f"wrote {markdown_file}")
