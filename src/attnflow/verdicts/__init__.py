"""``attnflow.verdicts``: falsifiable claims as objects (docs/reproduce.md, "Writing a conjecture").

* :class:`Space` of :class:`Uniform`, :class:`LogUniform` and :class:`Choice` axes: declared once, drawn
  by seed (``numpy.random.default_rng([seed, k])``) and printed as the documented ranges.
* :class:`Estimate` ``(value, stderr)`` and the criteria :class:`Below`, :class:`Above`, :class:`Within`,
  :class:`Exponent`: each decides PASS / FAIL / UNDECIDED and states its margin in the estimate's own error;
  :func:`fit_exponent` gives an exponent as an :class:`Estimate` carrying its number of points.
* :class:`Prediction` ``(name, measured, control, criterion)``: PASS only when the measurement passes and
  its control fails the same criterion.
* :func:`experiment` registers ``def claim(params, seed) -> list[Prediction]``; ``attnflow reproduce
  FILE.py`` runs the experiments of a file named on the command line.
* :mod:`attnflow.verdicts.stats`: the statistics the experiments share.

This package imports only numpy and scipy: a conjecture file loads without torch.
"""

from attnflow.verdicts.claims import Experiment, Prediction, collecting, experiment, registered
from attnflow.verdicts.criteria import (
    LEVEL,
    MIN_FIT_POINTS,
    Above,
    Below,
    Criterion,
    Estimate,
    Exponent,
    Verdict,
    Within,
    fit_exponent,
)
from attnflow.verdicts.space import Choice, LogUniform, Space, Uniform

__all__ = [
    "LEVEL",
    "MIN_FIT_POINTS",
    "Above",
    "Below",
    "Choice",
    "Criterion",
    "Estimate",
    "Experiment",
    "Exponent",
    "LogUniform",
    "Prediction",
    "Space",
    "Uniform",
    "Verdict",
    "Within",
    "collecting",
    "experiment",
    "fit_exponent",
    "registered",
]
