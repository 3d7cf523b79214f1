"""Parameter sweeps on Dask: the sweep file (:mod:`.spec`), running it (:mod:`.runner`), the results
table (:mod:`.table`) and phase diagrams (:mod:`.phase`)."""

from attnflow.sweep.phase import PhaseDiagram, phase_diagram, plot_phase_diagram
from attnflow.sweep.runner import SweepReport, batch_size, require_sweep_extra, run_batch, run_point, run_sweep
from attnflow.sweep.spec import SweepSpec, load_sweep, sweep_points
from attnflow.sweep.table import load_sweep_results

__all__ = [
    "PhaseDiagram",
    "SweepReport",
    "SweepSpec",
    "batch_size",
    "load_sweep",
    "load_sweep_results",
    "phase_diagram",
    "plot_phase_diagram",
    "require_sweep_extra",
    "run_batch",
    "run_point",
    "run_sweep",
    "sweep_points",
]
