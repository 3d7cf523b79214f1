"""The tutorial's claims are what its runs print.

The Python snippet of section 4 is executed as written and every number its comments state is
compared with what it computes (fast). The run of section 2 (``examples/ou.yaml``, about 25 s of
CPU) is checked against every number the text states about it, including the slope's behaviour
(``slow``: it goes through the CLI and takes a minute on a loaded machine).
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"


def section(title_start: str) -> str:
    text = TUTORIAL.read_text()
    start = text.index(f"## {title_start}")
    end = text.find("\n## ", start + 3)
    return text[start : end if end > 0 else None]


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def numbers(s: str) -> list[float]:
    return [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", s)]


def stated(text: str, pattern: str) -> list[float]:
    """The numbers of the one sentence fragment of the tutorial that matches ``pattern``."""
    m = re.search(pattern, text, re.S)
    assert m, f"the tutorial no longer says {pattern!r}"
    return [float(g) for g in m.groups()]


def test_python_snippet_prints_what_its_comments_say(tmp_path, monkeypatch):
    (code,) = code_blocks(section("4."), "python")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(TUTORIAL), "exec"), {"__name__": "tutorial"})
    printed = out.getvalue().splitlines()
    claims = [line.split("#", 1)[1].split(":")[0] for line in code.splitlines() if line.startswith("print(")]
    assert len(printed) == len(claims) == 2
    for got, claim in zip(printed, claims):
        assert numbers(got) == numbers(claim), (got, claim)
    assert (tmp_path / "runs" / "quick" / "report.html").is_file()
    assert (tmp_path / "runs" / "quick" / "dataset.zarr").is_dir()


def test_the_checker_rejects_a_wrong_claim():
    # negative control: the same comparison fails when the comment states another number
    assert numbers("[ -3.563 -14.88 ]") != numbers("[ -3.563 -14.9 ]")
    with pytest.raises(AssertionError, match="no longer says"):
        stated("the energy falls from 1 to 2", r"the slope stays at a floor of ([\d.]+)")


@pytest.mark.integration
@pytest.mark.slow
def test_first_run_matches_the_text(tmp_path):
    text = section("2.")
    (cmd,) = code_blocks(text, "bash")
    assert cmd.strip() == "attnflow run examples/ou.yaml --out runs/first"
    out = tmp_path / "ou"
    res = subprocess.run(
        [sys.executable, "-m", "attnflow", "run", str(ROOT / "examples" / "ou.yaml"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    import attnflow

    traj = attnflow.load(out)
    t, F, c, s = traj.t, traj.diagnostics["energy"], traj.diagnostics["clusters"], traj.diagnostics["slope"]

    f0, f1 = stated(text, r"falls from (-[\d.]+) to (-[\d.]+)")
    assert (round(F[0], 2), round(F[-1], 2)) == (f0, f1)
    c0, c1, t_c = stated(text, r"the (\d+) clusters of the initial cloud.*?merge into (\d+) by \$t = ([\d.]+)\$")
    assert (c[0], c[-1]) == (c0, c1)
    assert t[np.argmax(c <= c1)] == pytest.approx(t_c) and np.all(c[t >= t_c] == c1)
    peak, t_peak = stated(text, r"climbs to ([\d.]+) at\s+\$t = ([\d.]+)\$")
    assert (round(s.max(), 2), round(t[np.argmax(s)], 2)) == (peak, t_peak)
    lo, hi = stated(text, r"between ([\d.]+) and ([\d.]+) over the second half")
    late = t >= t[-1] / 2
    assert (round(s[late].min(), 2), round(s[late].max(), 2)) == (lo, hi)
    half = stated(text, r"over \$t \\ge ([\d.]+)\$")[0]
    assert half == t[-1] / 2
    m_late, m_early = stated(text, r"over \$t \\ge [\d.]+\$ is ([\d.]+),\s+against ([\d.]+) over the first half")
    assert round(np.mean(s[late] ** 2), 2) == m_late and round(np.mean(s[~late] ** 2), 2) == m_early
    # the claim the old text made ("the slope stays at a floor") is false for this run: it swings
    assert s[late].max() / s[late].min() > 5


@pytest.mark.slow
def test_readme_quick_start_runs(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Quick start")
    (code,) = code_blocks(readme[start : readme.index("\n## ", start + 3)], "python")
    assert len(code.strip().splitlines()) <= 15
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    clusters, slope, residual = numbers(" ".join(out.getvalue().split()))[:3]
    assert clusters >= 1 and slope > 0 and 0 <= residual < 1e-1
    assert (tmp_path / "runs" / "my-ou" / "provenance.json").is_file()
