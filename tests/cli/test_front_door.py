"""The front door is light (issue 43): a config error, ``show`` of a folder that is no run, ``--help``
and ``run --help`` import neither torch, numba nor matplotlib, each in a fresh interpreter that runs
the console script's app in-process and then reports ``sys.modules``."""

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
