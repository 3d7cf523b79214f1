"""The package's namespace: one path per module (no aliases of an unreleased flat layout), and
``dir(attnflow)`` shows the public API, not the lazy loader's helpers."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

#: Paths of the former flat layout (attnflow 0.1 before the layered tree; never released).
FLAT_PATHS = [
    "attnflow._arrays",
    "attnflow.geometry",
    "attnflow.heads",
    "attnflow.infinite",
    "attnflow.fastsum",
    "attnflow.backends",
    "attnflow.fields",
    "attnflow.stability",
    "attnflow.integrators",
    "attnflow.jko",
    "attnflow.validation",
    "attnflow.diagnostics",
    "attnflow.edi",
    "attnflow.limits",
    "attnflow.simulate",
    "attnflow.checkpoint",
    "attnflow.guards",
    "attnflow.ensemble",
    "attnflow.views",
    "attnflow.plotting",
    "attnflow.report",
    "attnflow.movie",
    "attnflow.runner",
    "attnflow.sweep_spec",
    "attnflow.sweep_table",
    "attnflow.phase",
]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_import_attnflow_simulate_is_an_import_error_and_leaves_the_function_alone():
    r = _python(
        "import attnflow as af\n"
        "try:\n    import attnflow.simulate\nexcept ImportError as e:\n    print('ImportError', type(e).__name__)\n"
        "else:\n    print('imported')\n"
        "import inspect\nprint(inspect.isfunction(af.simulate), af.simulate.__module__)\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ImportError", "ModuleNotFoundError", "True", "attnflow.solve.simulation"]


@pytest.mark.parametrize("old", FLAT_PATHS)
def test_no_flat_layout_alias_is_importable(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_no_import_hook_is_installed():
    import attnflow  # noqa: F401

    assert not [f for f in sys.meta_path if type(f).__module__.startswith("attnflow")]


def test_the_real_paths_import():
    # Negative control of the two tests above: the modules themselves are there.
    for new in (
        "attnflow.dynamics.fields",
        "attnflow.solve.simulation",
        "attnflow.core.heads",
        "attnflow.kernels.fastsum",
    ):
        assert importlib.import_module(new).__name__ == new


def test_dir_lists_the_public_api_not_the_loaders_helpers():
    r = _python("import attnflow as af; af.simulate; af.tokens; print(' '.join(dir(af)))")
    assert r.returncode == 0, r.stderr
    names = set(r.stdout.split())
    import attnflow as af

    assert names == set(af.__all__)
    assert not names & {"Any", "TYPE_CHECKING", "annotations", "importlib", "_importlib"}
    assert {"simulate", "Trajectory", "tokens", "weights", "__version__"} <= names
    for name in af.__all__:  # every name dir shows resolves
        assert getattr(af, name) is not None
