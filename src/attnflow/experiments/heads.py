"""``heads``: the late-time slope floor under OU weights scales like ``1/H``.

For each ``H`` and seed, a ``gf`` run with ``H`` OU heads around ``beta I`` from a hemisphere; the
floor is the time average of ``|dF|^2`` over the second half of the run. Seeds are averaged, the
exponent is the least-squares slope of ``log floor`` against ``log H``, and its 95% interval comes
from a bootstrap over seeds (resampling seeds, refitting).
"""

from __future__ import annotations

import time

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

from attnflow.experiments.common import ExperimentResult, Prediction, fmt, loglog_fit
from attnflow.experiments.runs import late_mean, run
from attnflow.io.metadata import describe

#: name -> (long_name, units, description) of this experiment's dataset.
VARIABLES: dict[str, tuple[str, str, str]] = {
    "H": ("number of heads H", "1", "number of heads of the run"),
    "seed": ("seed", "1", "seed of the run"),
    "floor": ("slope floor", "1", "late-time mean of |dF|^2 of one run (OU weights)"),
    "floor_mean": ("mean slope floor", "1", "late-time mean of |dF|^2, averaged over seeds"),
}


def config(H: int, seed: int, quick: bool) -> dict:
    return {
        "name": f"heads-H{H}-s{seed}",
        "model": "gf",
        "seed": seed,
        "tokens": {"n": 32 if quick else 64, "d": 3, "init": "cap", "angle": 1.5707963267948966},
        "heads": {"count": H, "preset": "identity", "beta": 2.0},
        "weights": {"process": "ou", "rate": 1.0, "sigma": 0.5, "init_spread": 0.5},
        "integration": {"t_end": 12.0 if quick else 30.0, "dt": 0.05, "method": "rk4", "save_every": 1},
    }


def experiment_heads(quick: bool, seed: int, full: bool = False, progress=None) -> ExperimentResult:
    start = time.perf_counter()
    Hs = [1, 2, 4, 8, 16] if quick else [1, 2, 4, 8, 16, 32, 64] + ([128, 256] if full else [])
    seeds = [seed + s for s in range(4 if quick else 8)]
    floors = np.zeros((len(Hs), len(seeds)))
    cfgs = []
    for i, H in enumerate(Hs):
        for j, s in enumerate(seeds):
            cfg = config(H, s, quick)
            cfgs.append(cfg)
            _, traj = run(cfg)
            floors[i, j] = late_mean(traj.t, traj.diagnostics["slope"] ** 2)
            if progress:
                progress(f"H={H} seed={s}")
    mean = floors.mean(1)
    p, c = loglog_fit(np.array(Hs, float), mean)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(2000):
        pick = rng.integers(0, len(seeds), len(seeds))
        boots.append(loglog_fit(np.array(Hs, float), floors[:, pick].mean(1))[0])
    lo, hi = (float(v) for v in np.percentile(boots, [2.5, 97.5]))
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for j in range(len(seeds)):
        ax.loglog(Hs, floors[:, j], ".", color="0.7", ms=5)
    ax.loglog(Hs, mean, "o", color="C0", label="mean over seeds")
    Hf = np.geomspace(Hs[0], Hs[-1], 50)
    ax.loglog(Hf, c * Hf**p, "-", color="C3", label=f"fit: exponent {p:.2f} [{lo:.2f}, {hi:.2f}]")
    ax.loglog(Hf, mean[0] * Hf**-1.0, ":", color="k", label="1/H")
    ax.set_xlabel("number of heads H")
    ax.set_ylabel("late-time mean of |dF|^2")
    ax.set_title("slope floor under OU weights")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    ds = describe(
        xr.Dataset(
            {"floor": (("H", "seed"), floors), "floor_mean": (("H",), mean)},
            coords={"H": Hs, "seed": seeds},
            attrs={"exponent": p, "ci_low": lo, "ci_high": hi},
        ),
        VARIABLES,
    )
    criterion = "95% CI contains -1" if not quick else "95% CI within [-1.6, -0.4] (quick run: few seeds, short times)"
    ok = (lo <= -1.0 <= hi) if not quick else (-1.6 <= lo and hi <= -0.4)
    pred = Prediction(
        "heads",
        "OU weights: the late-time slope floor scales like 1/H",
        f"exponent {fmt(p)}, 95% CI [{fmt(lo)}, {fmt(hi)}] over H = {Hs[0]}..{Hs[-1]}",
        criterion,
        bool(ok),
    )
    res = ExperimentResult(
        "heads",
        {"exponent": p, "ci": [lo, hi], "H": Hs, "floor_mean": mean.tolist(), "seeds": len(seeds)},
        [pred],
        figures={"heads": fig},
        configs=cfgs,
        dataset=ds,
    )
    res.seconds = time.perf_counter() - start
    return res
