"""``attnflow bench``: time the attention field's backends side by side and write JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from attnflow.cli.app import UserError, app, guarded, say
from attnflow.cli.threads import threaded


def _table(title: str, header: Sequence[str], rows: Iterable[Sequence[str]], left: Sequence[str]) -> Table:
    """A rich table: ``header`` columns (those in ``left`` left-aligned, the rest right-aligned), ``rows``."""
    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="left" if h in left else "right")
    for cells in rows:
        table.add_row(*cells)
    return table


@app.command()
@guarded
@threaded(lambda kw: float("inf"))
def bench(
    quick: bool = typer.Option(
        False,
        "--quick",
        help="Small sizes only (about 10 minutes on a loaded 2-core machine: 6 min measured before the thread table).",
    ),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write the results as JSON to this file."),
    markdown_file: Optional[Path] = typer.Option(None, "--markdown", help="Also write the table as Markdown."),
    loop: bool = typer.Option(
        True, "--loop/--no-loop", help="Also measure simulate's cost per step against its evaluations."
    ),
    profile: bool = typer.Option(
        False,
        "--profile",
        help="Only where the time goes: the simulation loop per step, and one fast-summation evaluation part by "
        "part against the machine's GEMM and memory-bandwidth limits.",
    ),
    startup_only: bool = typer.Option(
        False,
        "--startup-only",
        help="Only time the command line's start-up (attnflow --help, --version), the front door's CPU time and report/plot of the preset run.",
    ),
    metastability: Optional[bool] = typer.Option(
        None,
        "--metastability/--no-metastability",
        help="Adaptive steps vs fixed-step rk4 through clustering plateaus (N = 64, beta = 9, t = 1e4; several "
        "minutes). Default: on in the full suite, off with --quick.",
    ),
    only_metastability: bool = typer.Option(
        False, "--only-metastability", help="Run the metastability benchmark alone (skips the field timings)."
    ),
    small: bool = typer.Option(
        True,
        "--small/--no-small",
        help="Small clouds, long times: adaptive steps against SciPy's DOP853 at N = 8 .. 4096, and 100 seeds as "
        "one ensemble against single runs.",
    ),
    only_small: bool = typer.Option(False, "--only-small", help="Run the small-cloud benchmark alone."),
    only_native: bool = typer.Option(
        False,
        "--only-native",
        help="Only small runs at native speed: N = 8 rk4 against a NumPy RK4 loop, N = 32 dop853 against SciPy's "
        "DOP853, as ratios with their bounds and torch-kernel controls (under a minute).",
    ),
    thread_policy: bool = typer.Option(
        True,
        "--thread-policy/--no-thread-policy",
        help="Also time the thread policy against one thread and torch's default, beside a spinning process.",
    ),
    only_thread_policy: bool = typer.Option(
        False,
        "--only-thread-policy",
        help="Run the thread-policy table alone (4 minutes measured with --quick on a loaded 2-core machine).",
    ),
) -> None:
    """Time one field evaluation and a 100-step run: numpy reference vs dense vs fast summation; and
    adaptive steps vs fixed-step rk4 on a metastable clustering run (field evaluations and wall time).

    First it times the command line's start-up: 'attnflow --help' and 'attnflow --version' in
    fresh processes, best of 3.

    Examples:

      attnflow bench --quick

      attnflow bench --startup-only

      attnflow bench --profile      (where the time goes: the loop per step, fast summation per part)

      attnflow bench --json bench.json --markdown bench.md
    """
    from attnflow.bench.startup import (
        REPORT_TARGET_CPU_S,
        cli_startup_seconds,
        draw_cpu_seconds,
        front_door_cpu_seconds,
    )

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
    door = front_door_cpu_seconds(repeats=3)
    ft = Table(title="the front door: CPU seconds in a fresh process (target < 1 s, no torch/numba/matplotlib)")
    for col in ("command", "CPU s", "heavy modules loaded", "exit"):
        ft.add_column(col, justify="left" if col == "command" else "right")
    for label, row in door.items():
        ft.add_row(label, f"{row['cpu_s']:.3f}", ", ".join(row["heavy"]) or "none", str(row["exit"]))
    Console().print(ft)
    say("measuring report and plot of the preset run (made once: about 15 s of CPU) ...")
    draw = draw_cpu_seconds(repeats=3)
    dt = Table(
        title=f"drawing a finished run (preset ou): CPU seconds in a fresh process (report target < {REPORT_TARGET_CPU_S:g} s)"
    )
    for col in ("command", "CPU s", "heavy modules loaded", "may load", "report MB", "load average"):
        dt.add_column(col, justify="left" if col == "command" else "right")
    for label, row in draw.items():
        dt.add_row(
            label,
            f"{row['cpu_s']:.3f}",
            ", ".join(row["heavy"]) or "none",
            ", ".join(row["may_load"]) or "none",
            f"{row['bytes'] / 1e6:.2f}" if "bytes" in row else "",
            "?" if row["load_average"] is None else f"{row['load_average']:.2f}",
        )
    Console().print(dt)
    door = {**door, **draw}
    if startup_only:
        if json_file is not None:
            json_file.write_text(json.dumps({"startup_s": startup, "front_door": door}, indent=2))
            say(f"wrote {json_file}")
        return
    if only_native:
        from attnflow.bench.small import (
            NATIVE_HEADER,
            native_bottom_line,
            native_markdown,
            native_rows,
            native_title,
            run_native,
        )

        say("measuring small runs at native speed ...")
        nat = run_native(quick=quick)
        Console(width=max(Console().width, 170)).print(
            _table(native_title(nat), NATIVE_HEADER, native_rows(nat), left=("case", "reference", "verdict"))
        )
        say(native_bottom_line(nat))
        if json_file is not None:
            json_file.write_text(json.dumps({"startup_s": startup, "native": nat}, indent=2))
            say(f"wrote {json_file}")
        if markdown_file is not None:
            markdown_file.write_text(native_markdown(nat))
            say(f"wrote {markdown_file}")
        return
    if only_small:
        small, loop, metastability, only_metastability, thread_policy = True, False, False, False, False
    if only_thread_policy:
        small = False
    from attnflow.bench.harness import HEADER, markdown, run_benchmarks, table_rows
    from attnflow.bench.loop import LOOP_HEADER, loop_markdown, loop_table_rows, run_loop_benchmarks
    from attnflow.bench.metastability import META_HEADER, meta_markdown, meta_rows, meta_title, run_metastability

    wide = Console(width=max(Console().width, 170))
    result: dict = {"startup_s": startup, "front_door": door}
    text = ""
    measure = lambda s: say(f"measuring {s} ...")
    if only_thread_policy or (thread_policy and not profile and not only_metastability):
        from attnflow.bench.threads import THREADS_HEADER, run_thread_benchmarks, thread_markdown, thread_rows

        trows = run_thread_benchmarks(quick=quick, progress=measure)
        title = "threads: torch's default vs the thread policy vs one thread, beside nothing / a spinning process"
        wide.print(_table(title, THREADS_HEADER, thread_rows(trows), left=("case", "beside")))
        tmd = thread_markdown(trows)
        say(tmd.strip().splitlines()[-1])
        result["threads"] = trows
        text += tmd
    loop_rows = (
        run_loop_benchmarks(quick=quick, progress=measure)
        if (loop or profile) and not only_metastability and not only_thread_policy
        else []
    )
    if loop_rows:
        title = "simulate: cost per step against its field evaluations (explicit Euler)"
        left = ("dtype", "split (evaluations per step)")
        wide.print(_table(title, LOOP_HEADER, loop_table_rows(loop_rows), left=left))
        result["loop"] = loop_rows
        text += loop_markdown(loop_rows)
    if not only_metastability and not profile and not only_small and not only_thread_policy:
        result.update(run_benchmarks(quick=quick, progress=measure))
        title = f"attnflow bench (exp throughput {result['machine']['exp_per_s']:.3g} /s, beta {result['beta']})"
        wide.print(_table(title, HEADER, table_rows(result), left=("backend", "dtype")))
        text = markdown(result) + ("\n" + text if text else "")
    if not only_metastability and not only_small and not only_thread_policy:
        from attnflow.bench.fastsum import (
            FAST_PROFILE_HEADER,
            fast_profile_markdown,
            fast_profile_rows,
            fast_profile_title,
            profile_fast,
        )

        measure("fast summation, part by part")
        prof = profile_fast(N=100_000 if quick else 1_000_000)
        wide.print(_table(fast_profile_title(prof), FAST_PROFILE_HEADER, fast_profile_rows(prof), left=("part",)))
        result["fast_profile"] = prof
        text += ("\n" if text else "") + fast_profile_markdown(prof)
    if only_metastability or (
        not only_thread_policy and not profile and (metastability if metastability is not None else not quick)
    ):
        meta = run_metastability(progress=lambda s: say(f"metastability: {s} ..."))
        result["metastability"] = meta
        wide.print(_table(meta_title(meta), META_HEADER, meta_rows(meta), left=("method",)))
        text += ("\n" if text else "") + meta_markdown(meta)
    if small and not profile and not only_metastability:
        from attnflow.bench.small import (
            ENSEMBLE_HEADER,
            SMALL_HEADER,
            ensemble_rows,
            run_small,
            small_markdown,
            small_rows,
            small_title,
        )

        sm = run_small(quick=quick, progress=measure)
        result["small_clouds"] = sm
        from attnflow.bench.small import NATIVE_HEADER, native_bottom_line, native_rows, native_title

        nat = sm["native"]
        wide.print(_table(native_title(nat), NATIVE_HEADER, native_rows(nat), left=("case", "reference", "verdict")))
        say(native_bottom_line(nat))
        wide.print(_table(small_title(sm), SMALL_HEADER, small_rows(sm), left=("solver",)))
        title = "seeds of N = 32 (dop853, rtol 1e-8) as one ensemble against single runs"
        wide.print(_table(title, ENSEMBLE_HEADER, ensemble_rows(sm), left=("how",)))
        text += ("\n" if text else "") + small_markdown(sm)
    if json_file is not None:
        json_file.write_text(json.dumps(result, indent=2))
        say(f"wrote {json_file}")
    if markdown_file is not None:
        markdown_file.write_text(text)
        say(f"wrote {markdown_file}")
