"""The PDE energy figure draws its few saved times as points, never joined by straight lines, and a gf
run's dense per-step energy through them (issue 43)."""

import matplotlib
import numpy as np

from attnflow.pde.basis import make_basis
from attnflow.pde.output import plot_solution
from attnflow.pde.solver import perturbed_uniform, solve_pde

matplotlib.use("Agg")


def _energy_axes(monkeypatch, sol, tmp_path):
    from matplotlib.figure import Figure

    seen = {}
    real = Figure.savefig

    def capture(self, fname, *a, **k):
        if str(fname).endswith("energy.png"):
            seen["lines"] = [(ln.get_label(), ln.get_linestyle(), ln.get_marker(), ln.get_xdata(), ln.get_ydata())
                             for ln in self.axes[0].get_lines()]  # fmt: skip
        return real(self, fname, *a, **k)

    monkeypatch.setattr(Figure, "savefig", capture)
    plot_solution(sol, tmp_path)
    return {label: (style, marker, np.asarray(x), np.asarray(y)) for label, style, marker, x, y in seen["lines"]}


def test_saved_times_are_points_and_the_dense_curve_passes_through_them(monkeypatch, tmp_path):
    b = make_basis(24, 2)
    c0 = perturbed_uniform(b, 0.2, degrees=(1, 3), seed=1)
    sol = solve_pde(c0, np.stack([2.0 * np.eye(2)]), t_end=0.6, dt=0.02, basis=b, save_every=5)
    lines = _energy_axes(monkeypatch, sol, tmp_path)
    style, marker, t, f = lines["saved times"]
    assert style == "None" and marker == "o" and len(t) == len(sol.t)
    _, dmarker, dt_, df = lines["every step"]
    assert len(dt_) == len(sol.steps["t"]) + 1 > len(t)  # 31 points against 7 saved
    # the dense curve (F(0) plus the per-step changes) meets the saved energies at the saved times
    at = np.searchsorted(dt_, sol.t)
    assert np.allclose(dt_[at], sol.t) and np.max(np.abs(df[at] - sol.energy)) <= 1e-12 * np.max(np.abs(sol.energy))
    # control: straight chords between saved points miss the dense curve between them (it is curved)
    chords = np.interp(dt_, sol.t, sol.energy)
    assert np.max(np.abs(chords - df)) > 1e3 * 1e-12 * np.max(np.abs(sol.energy))
