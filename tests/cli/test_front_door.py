"""The front door is light (issue 43): a config error, ``show`` of a folder that is no run, ``--help``
and ``run --help`` import neither torch, numba nor matplotlib, each in a fresh interpreter that runs
the console script's app in-process and then reports ``sys.modules``."""

from pathlib import Path

import pytest

from attnflow.bench.startup import HEAVY_MODULES, front_door_cases, front_door_probe

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "label",
    ["attnflow --help", "attnflow run --help", "attnflow run CONFIG (misspelt key)", "attnflow show DIR (not a run)"],
)
def test_front_door_imports_nothing_heavy(tmp_path, label):
    args = front_door_cases(str(tmp_path))[label]
    r = front_door_probe(args)
    assert r["heavy"] == [], f"{label} imported {r['heavy']}"
    if "misspelt" in label:
        assert r["exit"] == 2 and "dtt" in r["output"] and "did you mean 'dt'" in r["output"]
    elif "show" in label:
        assert r["exit"] == 2 and "INCOMPLETE" in r["output"]
    else:
        assert r["exit"] == 0 and "Usage: attnflow" in r["output"]
    print(f"{label}: {r['cpu_s']:.2f} s CPU (target < 1 s), heavy modules: none")


def test_front_door_probe_sees_a_heavy_import(tmp_path):
    """Negative control: a real run (a computation) does load torch, and the probe reports it."""
    args = ["run", "--preset", "ou", "--out", str(tmp_path / "run"), "--no-figures"]
    args += ["--set", "tokens.n=4", "--set", "heads.count=1", "--set", "integration.t_end=0.04"]
    r = front_door_probe(args)
    assert r["exit"] == 0, r["output"]
    assert "torch" in r["heavy"]
    assert set(r["heavy"]) <= set(HEAVY_MODULES)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A tiny finished run (gf, rk4, two saved states), written once by the CLI."""
    out = tmp_path_factory.mktemp("front") / "run"
    args = ["run", "--preset", "ou", "--out", str(out), "--no-figures"]
    args += ["--set", "tokens.n=4", "--set", "heads.count=1", "--set", "integration.t_end=0.04"]
    r = front_door_probe(args)
    assert r["exit"] == 0, r["output"]
    return out


def test_show_of_a_finished_run_imports_nothing_heavy(finished_run):
    """``show`` of a finished run reads its summary.json: no torch, numba, matplotlib (nor xarray)."""
    assert (finished_run / "summary.json").is_file()
    assert "summary.json" in (finished_run / "manifest.json").read_text()  # its digest is checked
    r = front_door_probe(["show", str(finished_run)])
    assert r["exit"] == 0, r["output"]
    assert r["heavy"] == [], f"show of a finished run imported {r['heavy']}"
    assert "energy" in r["output"] and "ended at" in r["output"].lower()
    print(f"attnflow show RUN: {r['cpu_s']:.2f} s CPU (target < 1 s; the machine is shared), heavy modules: none")
    assert r["cpu_s"] < 5.0  # generous on a loaded machine; the sys.modules check above is the criterion


def _without_summary(finished_run: Path, old: Path) -> Path:
    """A copy of ``finished_run`` as written before summary.json existed (file and manifest entry gone)."""
    import json
    import shutil

    shutil.copytree(finished_run, old)
    (old / "summary.json").unlink()
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["files"]["summary.json"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    return old


def test_show_without_its_summary_takes_the_heavy_path(finished_run, tmp_path):
    """Negative control: the same run without summary.json (a folder of an older attnflow) is shown
    by computing the summary from the dataset, which imports torch; the numbers are the same."""
    import json

    from attnflow.cli.main import full_summary_record, summary_record

    old = _without_summary(finished_run, tmp_path / "old")
    r = front_door_probe(["show", str(old)])
    assert r["exit"] == 0, r["output"]
    assert "torch" in r["heavy"]
    fast = front_door_probe(["show", "--json", str(finished_run)])
    slow = front_door_probe(["show", "--json", str(old)])
    assert json.loads(fast["output"])["diagnostics"] == json.loads(slow["output"])["diagnostics"]
    for times in (None, [0.0, 0.01, 0.04], [100.0]):
        a, b = summary_record(finished_run, times), full_summary_record(finished_run, times)
        assert json.dumps(a, default=str) == json.dumps(b, default=str)
    print(f"without summary.json: {r['cpu_s']:.2f} s CPU, imported {r['heavy']}")


def test_a_tampered_summary_is_named(finished_run, tmp_path):
    """summary.json is covered by the manifest: an altered one is refused, never printed."""
    bad = tmp_path / "bad"
    import shutil

    shutil.copytree(finished_run, bad)
    text = (bad / "summary.json").read_text().replace('"N": 4', '"N": 5')
    assert '"N": 5' in text
    (bad / "summary.json").write_text(text)
    r = front_door_probe(["show", str(bad)])
    assert r["exit"] != 0 and "summary.json" in r["output"], r["output"]


def test_report_and_plot_of_a_finished_run_load_only_what_they_draw(finished_run, tmp_path):
    """``report`` (HTML) imports neither torch, numba nor matplotlib; ``plot`` only matplotlib (issue 43).
    Negative control: the same run without summary.json classifies its final state for the report,
    which imports torch; the sentence on the page is the same."""
    import re

    from attnflow.bench.startup import DRAW_MAY_LOAD, draw_cases

    cases = draw_cases(str(finished_run))
    rep = front_door_probe(cases["attnflow report RUN"])
    assert rep["exit"] == 0, rep["output"]
    assert rep["heavy"] == list(DRAW_MAY_LOAD["report"]) == [], f"report imported {rep['heavy']}"
    plot = front_door_probe(cases["attnflow plot RUN"])
    assert plot["exit"] == 0, plot["output"]
    assert plot["heavy"] == list(DRAW_MAY_LOAD["plot"]) == ["matplotlib"], f"plot imported {plot['heavy']}"

    old = _without_summary(finished_run, tmp_path / "old")
    slow = front_door_probe(["report", str(old), "--force"])
    assert slow["exit"] == 0, slow["output"]
    assert "torch" in slow["heavy"]
    ended = lambda p: re.search(r"Ended at: ([^<]*)</p>", (p / "report.html").read_text()).group(1)
    assert ended(finished_run) == ended(old) and len(ended(old)) > 10
    print(f"report: {rep['cpu_s']:.2f} s CPU (no torch), {slow['cpu_s']:.2f} s CPU classifying the state with torch")
    assert rep["cpu_s"] < slow["cpu_s"]
