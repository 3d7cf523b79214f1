"""``stability-weights``: continuous dependence on the weights (perturbed OU initialisations, a changed law).

Split from :mod:`attnflow.experiments.stability` (its parameters, reference config and ``W2`` are there):
:func:`_measure_weights` runs the reference and the perturbed runs and returns a frozen :class:`_WeightsRun`;
the figure, the rows and the result are named helpers.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

from attnflow.config import build, parse_config
from attnflow.core.heads import goe_heads
from attnflow.experiments.common import ExperimentResult, Prediction, Progress, fmt, loglog_fit, margin_above
from attnflow.experiments.stability import VARIABLES, StabilityParams, _w2, base_config, stability_params
from attnflow.io.metadata import describe
from attnflow.solve.simulation import simulate
from attnflow.weights.processes import OrnsteinUhlenbeck

#: kind ("noise", "law") -> measure ("dF", "w2") -> one value per eps.
Table = dict[str, dict[str, list[float]]]


@dataclasses.dataclass(frozen=True)
class _WeightsRun:
    """What :func:`_measure_weights` measured: the sup-distances of the perturbed runs to the reference
    (``table``) and to a reference driven by another noise path (``control``)."""

    params: StabilityParams
    rc_dict: dict[str, Any]
    epss: list[float]
    total: int
    table: Table
    control: Table


def _measure_weights(cfg: StabilityParams | Mapping[str, Any], seed: int, progress: Progress | None) -> _WeightsRun:
    """The reference runs (this noise path and another) and every perturbed run, compared with both."""
    params = stability_params(cfg)
    rc_dict = base_config(params, seed)
    rc = parse_config(rc_dict)
    x0, proc, kwargs = build(rc)
    epss = sorted((float(e) for e in params.eps), reverse=True)
    total = 2 + 2 * len(epss)
    if progress:
        progress(0, total, "reference runs")
    ref = simulate(x0, proc, **kwargs)
    ref_other = simulate(x0, proc, **{**kwargs, "seed": int(kwargs["seed"]) + 1})
    if not isinstance(proc, OrnsteinUhlenbeck):  # base_config sets an ou process
        raise TypeError(f"the stability-weights config built a {type(proc).__name__}, not an OrnsteinUhlenbeck")
    H, d = proc.H, proc.d
    G = goe_heads(H, d, 1.0, seed + 101)
    A0_other = proc.A_bar + goe_heads(H, d, 2.0, seed + 202) * 1.5  # another initialisation law
    table: Table = {"noise": {"dF": [], "w2": []}, "law": {"dF": [], "w2": []}}
    control: Table = {"noise": {"dF": [], "w2": []}, "law": {"dF": [], "w2": []}}
    done = 2
    for kind in table:
        for eps in epss:
            if progress:
                progress(done, total, f"{kind} perturbation, eps {eps:g}")
            A0 = proc.A0 + eps * G if kind == "noise" else (1 - eps) * proc.A0 + eps * A0_other
            perturbed = OrnsteinUhlenbeck(proc.A_bar, proc.rate, proc.sigma, A0=A0, symmetric=True, seed=proc.seed)
            pert = simulate(x0, perturbed, **kwargs)
            for tab, r in ((table, ref), (control, ref_other)):
                tab[kind]["dF"].append(float(np.abs(pert.diagnostics["energy"] - r.diagnostics["energy"]).max()))
                tab[kind]["w2"].append(float(_w2(r, pert).max()))
            done += 1
    return _WeightsRun(params, rc_dict, epss, total, table, control)


def _rates_of(epss: list[float], tab: Table) -> dict[str, dict[str, float]]:
    return {k: {m: loglog_fit(np.array(epss), np.array(v[m]))[0] for m in v} for k, v in tab.items()}


def _holds(vals: dict[str, list[float]], rate: dict[str, float]) -> bool:
    mono = all(np.diff(vals["dF"]) < 0) and all(np.diff(vals["w2"]) < 0)
    return bool(mono and rate["dF"] >= 0.5 and rate["w2"] >= 0.5)


def _rate_margin(vals: dict[str, list[float]], rate: dict[str, float]) -> float:
    """How clearly both rates exceed 0.5 (in units of 0.5); -inf when a sequence is not monotone."""
    if not (all(np.diff(vals["dF"]) < 0) and all(np.diff(vals["w2"]) < 0)):
        return -math.inf
    return min(margin_above(rate["dF"], 0.5), margin_above(rate["w2"], 0.5))


def _weights_figure(r: _WeightsRun, rates: dict[str, dict[str, float]]) -> Any:
    epss, table, control = r.epss, r.table, r.control
    fig, ax = plt.subplots(figsize=(6, 4.4))
    for kind, style in (("noise", "o-"), ("law", "s--")):
        ax.loglog(epss, table[kind]["dF"], style, label=f"{kind}: sup_t |F_eps - F| (rate {rates[kind]['dF']:.2f})")
        ax.loglog(epss, table[kind]["w2"], style, label=f"{kind}: sup_t W2 (rate {rates[kind]['w2']:.2f})")
        ax.loglog(epss, control[kind]["w2"], style, color="0.6", label=f"{kind}: control, W2 to another noise path")
    ax.set_xlabel("eps")
    ax.set_title("weight perturbations -> 0")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


def _weights_predictions(
    r: _WeightsRun, rates: dict[str, dict[str, float]], rates_ctrl: dict[str, dict[str, float]]
) -> list[Prediction]:
    table, control = r.table, r.control
    preds: list[Prediction] = []
    for kind in table:
        vals, cv = table[kind], control[kind]
        preds.append(
            Prediction(
                "stability-weights",
                f"Weight perturbation ({'extra noise' if kind == 'noise' else 'changed init law'}): F_eps -> F and trajectories converge",
                f"sup|F_eps - F| {fmt(vals['dF'][0])} -> {fmt(vals['dF'][-1])} (rate {fmt(rates[kind]['dF'])}), "
                f"sup W2 {fmt(vals['w2'][0])} -> {fmt(vals['w2'][-1])} (rate {fmt(rates[kind]['w2'])})",
                "both decrease monotonically as eps -> 0 with observed rate >= 0.5",
                _holds(vals, rates[kind]),
                "the same runs against a reference driven by another noise path",
                f"sup W2 {fmt(cv['w2'][0])} -> {fmt(cv['w2'][-1])} (rate {fmt(rates_ctrl[kind]['w2'])})",
                not _holds(cv, rates_ctrl[kind]),
                margin=_rate_margin(vals, rates[kind]),
                control_margin=-_rate_margin(cv, rates_ctrl[kind]),
                model="gf",
                model_reason="the stability theorem is stated for the gradient flow (docs/model.md)",
            )
        )
    for pred in preds:
        if not pred.ok:
            pred.explanation = "a non-monotone or slow decrease: see the figure (the control is the grey curves)."
    return preds


def _weights_result(
    r: _WeightsRun,
    rates: dict[str, dict[str, float]],
    rates_ctrl: dict[str, dict[str, float]],
    preds: list[Prediction],
    fig: Any,
) -> ExperimentResult:
    epss, table, control = r.epss, r.table, r.control
    ds = xr.Dataset(
        {f"{k}_{m}": (("eps",), np.array(v[m])) for k, v in table.items() for m in v}
        | {f"control_{k}_{m}": (("eps",), np.array(v[m])) for k, v in control.items() for m in v},
        coords={"eps": epss},
    )
    describe(ds, VARIABLES)
    return ExperimentResult(
        "stability-weights",
        {
            "eps": epss,
            **{k: {**v, "rates": rates[k]} for k, v in table.items()},
            "control": {k: {**v, "rates": rates_ctrl[k]} for k, v in control.items()},
        },
        preds,
        figures={"stability_weights": fig},
        configs=[r.rc_dict],
        dataset=ds,
        parameters=r.params.to_dict(),
    )


def experiment_stability_weights(
    cfg: StabilityParams | Mapping[str, Any], *, seed: int = 0, progress: Progress | None = None
) -> ExperimentResult:
    """Perturbed OU initialisations ``A0 + eps G`` and a changed law ``(1 - eps) A0 + eps A0'``, same noise.

    Control: the same perturbed runs compared with a reference driven by *another* noise path (same
    law): the distance does not vanish with ``eps``, and the criterion must reject it.
    """
    start = time.perf_counter()
    r = _measure_weights(cfg, seed, progress)
    rates, rates_ctrl = _rates_of(r.epss, r.table), _rates_of(r.epss, r.control)
    fig = _weights_figure(r, rates)
    preds = _weights_predictions(r, rates, rates_ctrl)
    res = _weights_result(r, rates, rates_ctrl, preds, fig)
    if progress:
        progress(r.total, r.total, "done")
    res.seconds = time.perf_counter() - start
    return res
