"""One default per option, in one place: the config schema, :func:`attnflow.simulate`,
:func:`attnflow.simulate_ensemble`, the step controller and the experiments all read these.

Plain constants (standard library only), so the front door's config reading stays light.
``tests/config/test_defaults.py`` checks every public entry point's default against them.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ATOL", "CLUSTER_EPS", "METHOD", "MODEL", "RTOL"]

#: The dynamics: ``gf`` (the gradient flow), ``mha`` or ``usa``.
MODEL: Final = "gf"
#: The stepper: classical Runge-Kutta of order 4 (fixed steps).
METHOD: Final = "rk4"
#: Error control of the adaptive methods (``bosh3``, ``dopri5``, ``dop853``): the error norm's
#: relative and absolute tolerances.
RTOL: Final = 1e-6
ATOL: Final = 1e-9
#: Tokens with ``<x_i, x_j> > 1 - eps`` share a cluster in the diagnostics.
CLUSTER_EPS: Final = 1e-3
