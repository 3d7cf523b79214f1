"""``stability-input`` and ``stability-weights``: continuous dependence on tokens and on weights."""

from __future__ import annotations

import time

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

from attnflow.analysis.distances import wasserstein_sphere
from attnflow.config import build, parse_config
from attnflow.core.heads import goe_heads
from attnflow.dynamics.lipschitz import gronwall_exponent, lipschitz_bound
from attnflow.experiments.common import ExperimentResult, Prediction, fmt, loglog_fit
from attnflow.experiments.runs import run
from attnflow.io.metadata import RUN_VARIABLES, describe
from attnflow.solve.simulation import simulate
from attnflow.weights.processes import OrnsteinUhlenbeck

#: name -> (long_name, units, description) of the variables of both stability experiments' datasets.
VARIABLES: dict[str, tuple[str, str, str]] = {
    "time": RUN_VARIABLES["time"],
    "noise": ("input noise", "1", "size of the perturbation of the initial tokens"),
    "w2": ("W2(mu_t, nu_t)", "1", "Wasserstein distance on the sphere between the flows of the two inputs"),
    "gronwall_exponent": ("int_0^t L", "1", "Gronwall exponent: the integral of the Lipschitz bound L of the field"),
    "eps": ("weight perturbation eps", "1", "size of the perturbation of the weights"),
    "noise_dF": (
        "sup_t |F_eps - F| (extra noise)",
        "1",
        "largest energy difference over time, weights with extra noise",
    ),
    "noise_w2": ("sup_t W2 (extra noise)", "1", "largest Wasserstein distance over time, weights with extra noise"),
    "law_dF": ("sup_t |F_eps - F| (changed law)", "1", "largest energy difference over time, changed initial law"),
    "law_w2": ("sup_t W2 (changed law)", "1", "largest Wasserstein distance over time, changed initial law"),
}


def base_config(seed: int, quick: bool) -> dict:
    return {
        "name": "stability",
        "model": "gf",
        "seed": seed,
        "tokens": {"n": 32 if quick else 64, "d": 3},
        "heads": {"count": 8, "preset": "identity", "beta": 1.0},
        "weights": {"process": "ou", "rate": 1.0, "sigma": 0.3, "init_spread": 0.5},
        "integration": {"t_end": 3.0 if quick else 6.0, "dt": 0.05, "method": "rk4", "save_every": 4},
    }


def _w2(traj_a, traj_b) -> np.ndarray:
    a = traj_a.token_weights
    return np.array([wasserstein_sphere(traj_a.x[k], traj_b.x[k], a=a, b=a).value for k in range(len(traj_a.t))])


def experiment_stability_input(quick: bool, seed: int) -> ExperimentResult:
    start = time.perf_counter()
    cfg = base_config(seed, quick)
    _, ref = run(cfg)
    gron = gronwall_exponent(ref)  # int_0^t L
    levels = [1e-1, 1e-2, 1e-3]
    rng = np.random.default_rng(seed + 17)
    ratios, w2s, rates = {}, {}, {}
    for eps in levels:
        y0 = ref.x[0] + eps * rng.standard_normal(ref.x[0].shape)
        y0 /= np.linalg.norm(y0, axis=1, keepdims=True)
        _, pert = run(cfg, x0=y0)
        w2 = _w2(ref, pert)
        w2s[eps] = w2
        ratios[eps] = np.log(np.maximum(w2, 1e-300) / w2[0]) - gron  # log of W2_t / (e^{int L} W2_0)
        # Measured growth rate, for comparison with the bound L.
        rates[eps] = float(np.max(np.log(np.maximum(w2[1:], 1e-300) / w2[0]) / ref.t[1:]))
    L0 = lipschitz_bound(ref.A[0], model="gf")
    worst = max(float(r.max()) for r in ratios.values())  # log-ratio: <= 0 is the bound
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for eps in levels:
        ax[0].semilogy(ref.t, w2s[eps], label=f"W2(mu_t, nu_t), noise {eps:g}")
        ax[1].plot(ref.t, ratios[eps], label=f"noise {eps:g}")
    ax[0].set_title("W2(mu_t, nu_t) for perturbed inputs")
    ax[1].axhline(0.0, color="k", lw=0.8)
    ax[1].set_title("log [W2(mu_t, nu_t) / (exp(int_0^t L) W2(mu_0, nu_0))]")
    for a in ax:
        a.set_xlabel("t")
        a.legend(fontsize=7)
        a.grid(alpha=0.3, which="both")
    fig.tight_layout()
    ds = describe(
        xr.Dataset(
            {"w2": (("noise", "time"), np.stack([w2s[e] for e in levels])), "gronwall_exponent": (("time",), gron)},
            coords={"noise": levels, "time": ref.t},
        ),
        VARIABLES,
    )
    pred = Prediction(
        "stability-input",
        "Input perturbation: W2(mu_t, nu_t) <= exp(L t) W2(mu_0, nu_0)",
        f"max log-ratio {fmt(worst)} over t <= {ref.t[-1]:g} and noise {levels}; measured growth rate "
        f"{fmt(max(rates.values()))} vs the bound L = {fmt(L0)} at t=0",
        "log[W2_t / (exp(int L) W2_0)] <= 0 at every time and noise level, and measured rate <= L",
        bool(worst <= 1e-9 and max(rates.values()) <= L0),
    )
    res = ExperimentResult(
        "stability-input",
        {"max_log_ratio": worst, "L_t0": L0, "measured_rate": rates, "noise": levels},
        [pred],
        figures={"stability_input": fig},
        configs=[cfg],
        dataset=ds,
    )
    res.seconds = time.perf_counter() - start
    return res


def experiment_stability_weights(quick: bool, seed: int) -> ExperimentResult:
    """Perturbed OU initialisations ``A0 + eps G`` and a changed law ``(1 - eps) A0 + eps A0'``, same noise."""
    start = time.perf_counter()
    cfg = base_config(seed, quick)
    rc = parse_config(cfg)
    x0, proc, kwargs = build(rc)
    assert isinstance(proc, OrnsteinUhlenbeck)  # base_config's weights
    ref = simulate(x0, proc, **kwargs)
    H, d = proc.H, proc.d
    G = goe_heads(H, d, 1.0, seed + 101)
    A0_other = proc.A_bar + goe_heads(H, d, 2.0, seed + 202) * 1.5  # another initialisation law
    epss = [0.3, 0.1, 0.03, 0.01, 0.003]
    table: dict[str, dict[str, list[float]]] = {"noise": {"dF": [], "w2": []}, "law": {"dF": [], "w2": []}}
    for kind in table:
        for eps in epss:
            A0 = proc.A0 + eps * G if kind == "noise" else (1 - eps) * proc.A0 + eps * A0_other
            p = OrnsteinUhlenbeck(proc.A_bar, proc.rate, proc.sigma, A0=A0, symmetric=True, seed=proc.seed)
            pert = simulate(x0, p, **kwargs)
            table[kind]["dF"].append(float(np.abs(pert.diagnostics["energy"] - ref.diagnostics["energy"]).max()))
            table[kind]["w2"].append(float(_w2(ref, pert).max()))
    rates = {k: {m: loglog_fit(np.array(epss), np.array(v[m]))[0] for m in v} for k, v in table.items()}
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for kind, style in (("noise", "o-"), ("law", "s--")):
        ax.loglog(epss, table[kind]["dF"], style, label=f"{kind}: sup_t |F_eps - F| (rate {rates[kind]['dF']:.2f})")
        ax.loglog(epss, table[kind]["w2"], style, label=f"{kind}: sup_t W2 (rate {rates[kind]['w2']:.2f})")
    ax.set_xlabel("eps")
    ax.set_title("weight perturbations -> 0")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    preds = []
    for kind in table:
        vals = table[kind]
        mono = all(np.diff(vals["dF"]) < 0) and all(np.diff(vals["w2"]) < 0)
        preds.append(
            Prediction(
                "stability-weights",
                f"Weight perturbation ({'extra noise' if kind == 'noise' else 'changed init law'}): F_eps -> F and trajectories converge",
                f"sup|F_eps - F| {fmt(vals['dF'][0])} -> {fmt(vals['dF'][-1])} (rate {fmt(rates[kind]['dF'])}), "
                f"sup W2 {fmt(vals['w2'][0])} -> {fmt(vals['w2'][-1])} (rate {fmt(rates[kind]['w2'])})",
                "both decrease monotonically as eps -> 0 with observed rate >= 0.5",
                bool(mono and rates[kind]["dF"] >= 0.5 and rates[kind]["w2"] >= 0.5),
            )
        )
    ds = describe(
        xr.Dataset({f"{k}_{m}": (("eps",), np.array(v[m])) for k, v in table.items() for m in v}, coords={"eps": epss}),
        VARIABLES,
    )
    res = ExperimentResult(
        "stability-weights",
        {"eps": epss, **{k: {**v, "rates": rates[k]} for k, v in table.items()}},
        preds,
        figures={"stability_weights": fig},
        configs=[cfg],
        dataset=ds,
    )
    res.seconds = time.perf_counter() - start
    return res
