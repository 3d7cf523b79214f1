"""``report.md`` and ``report.html`` for ``attnflow reproduce all``, and the README block."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

from attnflow.core.errors import InputError
from attnflow.core.text import html_text
from attnflow.experiments.common import MIN_MARGIN, ExperimentResult
from attnflow.io.safety import read_regular

KEY_FIGURES = [
    ("oscillating", "snapshots"),
    ("heads", "heads"),
    ("edi", "edi"),
    ("stability-weights", "stability_weights"),
]
README_BEGIN = "<!-- reproduce:begin (written by attnflow reproduce all --readme README.md; do not edit by hand) -->"
README_END = "<!-- reproduce:end -->"


def _rows(results: list[ExperimentResult]):
    for r in results:
        for p in r.predictions:
            yield r, p


def markdown_table(results: list[ExperimentResult]) -> str:
    lines = [
        "| experiment | prediction (docs/model.md) | measured | criterion | model | negative control | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r, p in _rows(results):
        esc = lambda s: s.replace("|", "\\|")
        verdict = p.verdict_text if p.ok else f"**{p.verdict_text}**"
        model = p.model + (f" ({p.model_reason})" if p.model_reason else "")
        lines.append(
            f"| {r.name} | {esc(p.statement)} | {esc(p.measured)} | {esc(p.criterion)} | {esc(model)} | "
            f"{esc(p.control_text)} | {verdict} |"
        )
    return "\n".join(lines)


def write_reproduce_report(
    results: list[ExperimentResult], out: Path, *, quick: bool, seed: int, created: str, single: bool = False
) -> None:
    """``report.md`` (and, for ``all``, ``report.html``) in ``out``; ``single``: ``out`` is the experiment's folder."""
    total = sum(r.seconds for r in results)
    n_pass = sum(p.ok for _, p in _rows(results))
    n_all = sum(1 for _ in _rows(results))
    n_ctrl = sum(p.control_rejected for _, p in _rows(results))
    title = results[0].name if single else "all"
    head = (
        f"# attnflow reproduce {title}{' --quick' if quick else ''}\n\n"
        f"Seed {seed}, {created}, {total:.0f} s in all. **{n_pass}/{n_all} predictions PASS; "
        f"{n_ctrl}/{n_all} negative controls rejected.** A PASS (and a control's rejection) needs a margin of at "
        f"least {MIN_MARGIN:g} from its threshold, in the criterion's own scale.\n\n"
    )
    md = [head, markdown_table(results), "\n\n## Time per experiment\n\n| experiment | seconds |\n|---|---|"]
    md += [f"| {r.name} | {r.seconds:.1f} |" for r in results]
    failed = [(r, p) for r, p in _rows(results) if not p.ok]
    if failed:
        md.append("\n\n## Closing note: what failed, and the physics\n")
        md += [
            f"- **{r.name}**, {p.statement} ({p.verdict_text}): {p.explanation or 'no explanation recorded.'}"
            for r, p in failed
        ]
    for r in results:
        md.append(f"\n\n## {r.name}\n")
        prefix = "" if single else f"{r.name}/"
        md += [f"![{r.name} {stem}]({prefix}figures/{stem}.png)\n" for stem in r.figures]
        md += [f"\n_Note: {n}_\n" for n in r.notes]
    (out / "report.md").write_text("\n".join(md) + "\n")
    if single:
        return

    rows = "".join(
        f"<tr><td>{html_text(r.name)}</td><td>{html_text(p.statement)}</td><td>{html_text(p.measured)}</td>"
        f"<td>{html_text(p.criterion)}</td><td>{html_text(p.control_text)}</td>"
        f"<td class='{'pass' if p.ok else 'fail'}'>{html_text(p.verdict_text)}</td></tr>"
        for r, p in _rows(results)
    )
    figs = []
    for r in results:
        figs.append(f"<h2>{html_text(r.name)} ({r.seconds:.1f} s)</h2>")
        for stem in r.figures:
            png = out / r.name / "figures" / f"{stem}.png"
            data = base64.b64encode(read_regular(png, out)).decode() if png.is_file() else ""
            figs.append(f"<img alt='{html_text(r.name)} {stem}' src='data:image/png;base64,{data}'>")
        figs += [f"<p><em>Note: {html_text(n)}</em></p>" for n in r.notes]
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>attnflow reproduce</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;font-size:14px}}.pass{{color:#070;font-weight:bold}}
.fail{{color:#b00;font-weight:bold}}img{{max-width:100%}}</style></head><body>
<h1>attnflow reproduce all{" --quick" if quick else ""}</h1><p>Seed {seed}, {html_text(created)}, {total:.0f} s in all.
<b>{n_pass}/{n_all} predictions PASS.</b></p>
<table><tr><th>experiment</th><th>prediction</th><th>measured</th><th>criterion</th><th>negative control</th><th></th></tr>{rows}</table>
{"".join(figs)}</body></html>"""
    (out / "report.html").write_text(page)


def update_readme(readme: Path, results: list[ExperimentResult], out: Path, *, quick: bool) -> None:
    """Replace the block between the reproduce markers in ``readme`` with the table and key figures."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise InputError(f"{readme} has no reproduce block (the lines {README_BEGIN!r} ... {README_END!r})")
    # Image links must be relative to the README; a relative --out is taken as relative to its folder.
    rel = Path(os.path.relpath(out, readme.parent.resolve())) if out.is_absolute() else out
    figs = "\n".join(
        f"![{name} {stem}]({(rel / name / 'figures' / f'{stem}.png').as_posix()})"
        for name, stem in KEY_FIGURES
        if any(r.name == name for r in results)
    )
    times = ", ".join(f"{r.name} {r.seconds:.0f} s" for r in results)
    block = (
        f"{README_BEGIN}\n`attnflow reproduce all{' --quick' if quick else ''} --out {rel.as_posix()}` "
        f"({times}):\n\n{markdown_table(results)}\n\n{figs}\n{README_END}"
    )
    pattern = re.compile(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), re.S)
    readme.write_text(pattern.sub(lambda m: block, text))
