"""One default per option, in one place (``attnflow.config.defaults``): every public entry point's
default is read from there, checked here by inspecting signatures and fields, with negative controls."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import numpy as np

from attnflow.config import defaults
from attnflow.config.schema import DiagnosticsConfig, IntegrationConfig, RunConfig

SRC = Path(__file__).resolve().parents[2] / "src" / "attnflow"

#: option -> its home value.
HOME = {
    "model": defaults.MODEL,
    "method": defaults.METHOD,
    "rtol": defaults.RTOL,
    "atol": defaults.ATOL,
    "cluster_eps": defaults.CLUSTER_EPS,
}


def _signature_mismatches(fn, options) -> list[str]:
    """``name.option = value`` for each of ``options`` whose default in ``fn``'s signature is not the home's."""
    params = inspect.signature(fn).parameters
    return [
        f"{getattr(fn, '__qualname__', fn)}.{o} = {params[o].default!r}"
        for o in options
        if params[o].default != HOME[o]
    ]


def _entry_points():
    import attnflow as af
    from attnflow.solve.problem import Problem

    return [
        (af.simulate, ("model", "method", "cluster_eps")),
        (af.simulate_ensemble, ("model", "method")),
        (Problem.create, ("model", "cluster_eps")),
    ]


def test_every_entry_points_default_is_the_home():
    from attnflow.solve.controllers import PIController
    from attnflow.solve.problem import Problem
    from attnflow.solve.simulation import ADAPTIVE_OPTIONS

    bad = [m for fn, options in _entry_points() for m in _signature_mismatches(fn, options)]
    fields = {
        "IntegrationConfig.method": IntegrationConfig.model_fields["method"].default,
        "IntegrationConfig.rtol": IntegrationConfig.model_fields["rtol"].default,
        "IntegrationConfig.atol": IntegrationConfig.model_fields["atol"].default,
        "DiagnosticsConfig.cluster_eps": DiagnosticsConfig.model_fields["cluster_eps"].default,
        "RunConfig.model": RunConfig.model_fields["model"].default,
        "PIController.rtol": {f.name: f.default for f in dataclasses.fields(PIController)}["rtol"],
        "PIController.atol": {f.name: f.default for f in dataclasses.fields(PIController)}["atol"],
        "Problem.cluster_eps": {f.name: f.default for f in dataclasses.fields(Problem)}["cluster_eps"],
        "simulate.ADAPTIVE_OPTIONS.rtol": ADAPTIVE_OPTIONS["rtol"],
        "simulate.ADAPTIVE_OPTIONS.atol": ADAPTIVE_OPTIONS["atol"],
    }
    bad += [f"{k} = {v!r}" for k, v in fields.items() if v != HOME[k.rsplit(".", 1)[1]]]
    assert not bad, bad
    # The values themselves (a change here is a change of every default run: say so in the changelog).
    assert HOME == {"model": "gf", "method": "rk4", "rtol": 1e-6, "atol": 1e-9, "cluster_eps": 1e-3}


def test_negative_control_a_different_default_is_caught():
    def simulate_elsewhere(x0, *, model="gf", method="euler", cluster_eps=1e-3):
        return x0

    assert _signature_mismatches(simulate_elsewhere, ("model", "method", "cluster_eps")) == [
        f"{simulate_elsewhere.__qualname__}.method = 'euler'"
    ]


def test_the_effective_adaptive_tolerances_are_the_home():
    """``simulate``'s ``rtol=None`` means the home's tolerances (recorded in the provenance)."""
    import attnflow as af

    x0 = np.eye(3)[[0, 1, 2]] + 0.2
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    tr = af.simulate(x0, np.eye(3)[None], t_end=0.2, dt=0.1, method="dopri5")
    assert (tr.provenance["adaptive"]["rtol"], tr.provenance["adaptive"]["atol"]) == (defaults.RTOL, defaults.ATOL)
    assert tr.method == "dopri5" and af.simulate(x0, np.eye(3)[None], t_end=0.2, dt=0.1).method == defaults.METHOD


#: A default written as a literal where an option is declared (a signature, a field, a CLI option, a
#: dict lookup): the patterns the issue counted. Calls that choose a method on purpose (a benchmark
#: of rk4) are not defaults and are not matched.
LITERALS = re.compile(
    r'\bmethod\s*:\s*[\w\[\] |.]+=\s*"rk4"|\brtol\s*:\s*[\w\[\] |.]+=\s*1e-6\b|\batol\s*:\s*[\w\[\] |.]+=\s*1e-9\b'
    r'|\bcluster_eps\s*:\s*[\w\[\] |.]+=\s*1e-3\b|typer\.Option\(("rk4"|1e-3|1e-6|1e-9)\b|\.get\("method", "rk4"\)'
    r'|\bmethod="rk4", save_every=it\.'  # the relaxation runs' calls, which meant "the default scheme"
)


def _literal_defaults(root: Path) -> list[str]:
    return [
        f"{p.relative_to(root)}:{i}"
        for p in sorted(root.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if LITERALS.search(line)
    ]


def test_no_literal_default_left_in_the_package(tmp_path):
    assert _literal_defaults(SRC) == []
    # Negative control: a planted literal is found.
    (tmp_path / "planted.py").write_text('def f(x, method: str = "rk4", rtol: float = 1e-6):\n    return x\n')
    assert _literal_defaults(tmp_path) == ["planted.py:1"]
