"""The ``heads`` experiment's words and figure: the two predictions of a parameter set, their explanations when
they fail, ``results.json``'s headline and notes, and the figure (:mod:`attnflow.experiments.heads` runs it)."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from attnflow.analysis.floor_fit import (
    CONTROL_FACTOR,
    FAMILY_LEVEL,
    LOCAL_BAND,
    RATIO_TOL,
    SeedFloor,
    ratio_margin,
    row_tau,
)
from attnflow.experiments.common import MIN_MARGIN, Prediction, fmt
from attnflow.experiments.floors import MIN_TAUS, single_cluster_constant
from attnflow.experiments.heads_params import SetResult, UnsettledSeed


def seed_states(per_H: list[list[SeedFloor]]) -> list[list[dict[str, Any]]]:
    """Per ``H``, per seed: what its late window rests at (``results.json``: cluster counts, settled or in
    transition, minimiser / saddle / not near a stationary point, index, reason) and whether it entered."""
    return [
        [
            {"seed": r.seed, **(r.state.summary() if r.state else {}), "entered": bool(r.settled), "why": r.why}
            for r in row
        ]
        for row in per_H
    ]


def set_predictions(name: str, r: SetResult) -> list[Prediction]:
    """The two predictions of one parameter set's results ``r`` (:func:`attnflow.experiments.heads._run_set`):
    each settled seed's constant, and the 1/H law through measured / predicted; a failing one explained."""
    sc, per_H = r.config, r.per_H
    Hs, main, const, const_ctrl = np.array(r.H, float), r.main, r.constant, r.constant_control
    T_run, t_end, d = r.T, sc.integration.t_end, sc.tokens.d
    preds: list[Prediction] = []
    label = (
        f"{name}: d {d}, beta {sc.heads.beta:g}, rate {sc.weights.rate:g}, sigma {sc.weights.sigma:g}, "
        f"{sc.tokens.init} cloud"
    )
    runs_to = f"runs to T = {T_run:g}" + (
        f" (t_end {t_end:g} x {T_run / t_end:g}: {d - 1} tangent dimension{'s' if d > 2 else ''}, each seed's window "
        "as precise as at d = 3)"
        if T_run != t_end
        else ""
    )
    n_tail = sum(len(row) for H, row in zip(Hs, per_H) if H in main.tail_H)
    tail_txt = ", ".join(str(int(h)) for h in main.tail_H) or "none"
    worst = const.worst
    tail_len = [
        sum(r.window[1] - r.window[0] for r in row if r.settled) / row_tau(row)
        for H, row in zip(Hs, per_H)
        if H in main.tail_H and row_tau(row) > 0
    ]
    preds.append(
        Prediction(
            "heads",
            f"OU weights ({label}): each settled seed's late floor <|dF|^2> is the central-limit constant of "
            "H heads drawn from the stationary law at its final cloud",
            f"measured / predicted over {const.n} of {n_tail} seeds at H = {tail_txt} (settled ones): "
            + (
                f"geometric mean {fmt(math.exp(const.pooled))} (se of its log {fmt(const.pooled_se)}), "
                f"range {fmt(float(np.min(const.ratios)))}..{fmt(float(np.max(const.ratios)))}; "
                f"worst seed {worst[0]}: {fmt(worst[1])} against its bound {fmt(math.exp(worst[2]))}; "
                f"errors from tau_int of |dF|^2 = {', '.join(fmt(row_tau(row)) for H, row in zip(Hs, per_H) if H in main.tail_H)} "
                f"(pooled windows {', '.join(fmt(float(tail_len[i])) for i in range(len(tail_len)))} tau_int long)"
                if worst is not None  # a worst seed exactly when some seed settled (const.n > 0)
                else "no settled seed"
            ),
            f"pooled |log ratio| <= log(1 + {RATIO_TOL:g}) and each seed's <= that + |log q|, q its Gamma(1/se^2) "
            f"quantile on its side at Sidak's level over the n = {const.n} seeds (z_n = "
            f"{fmt(const.z) if const.n else '?'} of its standard errors in the Gaussian limit; a false FAIL "
            f"for the whole set at {100 * FAMILY_LEVEL:.2g}%, one seed's 3 standard errors)",
            const.margin >= 0,
            f"the same criterion with the prediction x{CONTROL_FACTOR:g} (a planted wrong constant)",
            f"geometric mean {fmt(math.exp(const_ctrl.pooled))}" if const_ctrl.n else "no settled seed",
            const_ctrl.margin < 0,
            margin=const.margin,
            control_margin=-const_ctrl.margin,
            model="gf",
            model_reason="the constant is a property of the gradient flow's slope |dF| (docs/model.md)",
        )
    )
    preds.append(_exponent_prediction(r, label, runs_to))
    if not preds[1].ok:
        preds[1].explanation = exponent_note(preds[1], r) + " " + preds[1].explanation
    if not preds[0].ok:
        preds[0].explanation = constant_note(preds[0], r) + " " + preds[0].explanation
    return preds


def _exponent_prediction(r: SetResult, label: str, runs_to: str) -> Prediction:
    """The 1/H row of one set: measured / predicted flat in ``H`` against the competing law ``H^(-1/2)``."""
    fit, per_H, settled = r.fit, r.per_H, r.settled
    Hs, main, ctrl = np.array(r.H, float), r.main, r.control
    batches, S, cap_b = r.batches, r.seeds_per_batch, r.config.seed_batches
    preds: list[Prediction] = []
    asym = main.asymptotic_from_H
    rf, rc, gap = fit.ratio, fit.ratio_control, fit.gap
    n_settled = int(settled[[i for i, H in enumerate(Hs) if H in rf.tail_H]].sum())
    n_tail = sum(len(row) for H, row in zip(Hs, per_H) if H in rf.tail_H)
    preds.append(
        Prediction(
            "heads",
            f"OU weights ({label}): the late slope floor scales like 1/H, as its per-seed predicted constants "
            "do (measured / predicted flat in H)",
            f"measured / predicted (geometric mean over settled seeds): exponent {fmt(rf.exponent)}, 95% CI "
            f"[{fmt(rf.ci[0])}, {fmt(rf.ci[1])}] over H = "
            f"{', '.join(str(int(h)) for h in rf.fit_H) or 'none'}"
            + (
                " (pre-asymptotic: the local slopes drift over the whole tail)"
                if rf.pre_asymptotic
                else ("" if rf.fit_H == rf.tail_H else " (the tail's asymptotic range)")
            )
            + f" ({n_settled} of {n_tail} seeds settled; "
            f"{batches} batch{'es' if batches > 1 else ''} of {S} seeds, at most {cap_b}; {runs_to}); "
            + (
                ("the CI contains 0" if rf.ci[0] <= 0.0 <= rf.ci[1] else "the CI excludes 0")
                if math.isfinite(rf.ci[0])
                else "no fit"
            )
            + f"; the predicted constants' own exponent {fmt(fit.predicted_exponent)}; for information the "
            f"floor's exponent {fmt(main.exponent)}, CI [{fmt(main.ci[0])}, {fmt(main.ci[1])}] (median), "
            f"local exponents {', '.join(f'{v:.2f}' for v in main.local_exponents)}, "
            + (f"within {LOCAL_BAND} of -1 from H = {asym}" if asym else f"not within {LOCAL_BAND} of -1"),
            f"against the competing law H^(-1/2) (ratio exponent -1/2 - {fmt(fit.predicted_exponent)} = "
            f"{fmt(gap)}), two-sided (attnflow.verdicts.Exponent): the ratio's CI (bootstrap over settled seeds, "
            f"on 3 or more H) lies inside (-{fmt(0.5 * gap)}, {fmt(0.5 * gap)}) by {MIN_MARGIN:g} "
            f"of {fmt(0.5 * gap)}; a CI reaching out of it and excluding 0, on either side, fails; until it decides, {S} more seeds at the tail's H while the "
            f"interval says a decision is within {cap_b} batches "
            "(undecided when it stops: FAIL, not enough seeds)",
            fit.decision == "pass",
            "the same on the late mean of |dF| (not squared; ~ H^(-1/2)) over the predicted floors",
            f"exponent {fmt(rc.exponent)}, CI [{fmt(rc.ci[0])}, {fmt(rc.ci[1])}] (|dF| itself: {fmt(ctrl.exponent)})",
            fit.control_decision != "pass",
            margin=ratio_margin(rf.ci, gap),
            control_margin=-ratio_margin(rc.ci, gap),
            model="gf",
            model_reason="the floor is of the gradient flow's slope |dF| (docs/model.md)",
        )
    )
    return preds[0]


def headline(results: dict[str, SetResult], seeds: list[int], unsettled: list[UnsettledSeed]) -> dict[str, Any]:
    """``results.json``'s numbers: the base set's fits, and per set its ratios, seed states, fits and budget."""
    base = results["base"]
    bm = base.main
    headline = {
        "exponent": bm.exponent,
        "ci": bm.ci,
        "H": base.H,
        "floor_median": bm.median,
        "local_exponents": bm.local_exponents,
        "tail": {"H": bm.tail_H, "exponent": bm.exponent, "ci": bm.ci},
        "asymptotic_from_H": bm.asymptotic_from_H,
        "control_exponent": base.control.exponent,
        "control_ci": base.control.ci,
        "ratio_geometric_mean": math.exp(base.constant.pooled) if base.constant.n else None,
        "seeds": seeds,
        "unsettled": [u.as_json() for u in unsettled],
        "sets": {
            n: {
                "H": r.H,
                "floor_median": r.main.median,
                "ratio_per_seed": r.floor / r.predicted,
                "h_times_predicted_median": np.nanmedian(r.predicted, axis=1) * np.array(r.H, float),
                "single_cluster_constant": single_cluster_constant(
                    r.config.heads.beta, r.config.stationary_scale, r.config.tokens.d
                ),
                "settled": r.settled,
                "seed_states": seed_states(r.per_H),
                "tau_int": [row_tau(row) for row in r.per_H],
                "se_iat": [[x.se for x in row] for row in r.per_H],
                "se_batch_means": [[x.se_batch for x in row] for row in r.per_H],
                "local_exponents": r.main.local_exponents,
                "tail": {"H": r.main.tail_H, "exponent": r.main.exponent, "ci": r.main.ci},
                "asymptotic_from_H": r.main.asymptotic_from_H,
                "predicted_exponent": r.fit.predicted_exponent,
                "control": {"exponent": r.control.exponent, "ci": r.control.ci},
                "ratio": {
                    "exponent": r.fit.ratio.exponent,
                    "ci": r.fit.ratio.ci,
                    "fit_H": r.fit.ratio.fit_H,
                    "pre_asymptotic": r.fit.ratio.pre_asymptotic,
                    "geometric_mean": r.fit.ratio.median,
                    "gap": r.fit.gap,
                    "decision": r.fit.decision,
                    "control": {
                        "exponent": r.fit.ratio_control.exponent,
                        "ci": r.fit.ratio_control.ci,
                    },
                },
                "run_length": r.run_length,
                "seed_batches": {
                    "used": r.batches,
                    "needed": r.fit.batches_needed,
                    "cap": r.config.seed_batches,
                    "size": r.seeds_per_batch,
                },
                "parameters": r.config.to_dict(),
            }
            for n, r in results.items()
        },
    }
    return headline


def notes(unsettled: list[UnsettledSeed]) -> list[str]:
    """The report's notes: why a floor exists, and every seed left out with its reason."""
    out = [
        "Finite H: the empirical measure of H OU heads has a Brownian path of infinite length, so it does not meet "
        "the integrability hypothesis (only the H = infinity law does); that is why a floor exists at all.",
    ]
    if unsettled:
        out.append(
            "Seeds that had not settled (reported, not averaged in): "
            + "; ".join(
                f"set {u.set_name}, H = {u.H}, seed {u.seed}: {u.why} (floor {fmt(u.floor)}, predicted "
                f"{fmt(u.predicted)})"
                for u in unsettled
            )
        )
    return out


def constant_note(p: Prediction, r: SetResult) -> str:
    """Why the constant's row failed: its control not rejected, no settled seed, or the side the ratios sit on."""
    c = r.constant
    if not p.control_rejected:
        return (
            f"the doubled constant is not rejected (geometric mean {math.exp(r.constant_control.pooled):.3g}): "
            "the seeds' standard errors are too large to tell a factor 2."
        )
    if c.worst is None:  # no seed settled (c.n == 0)
        return "no seed settled at the tail's H: nothing to compare (see the unsettled seeds in the notes)."
    g = math.exp(c.pooled)
    side = (
        "above: the cloud has not reached a stationary point of the limiting energy, or a seed's window is an outlier"
        if g > 1
        else "below: a settled cluster's climb of its heads' noise lowers the floor, but by no measurable amount at the "
        "drawn ranges (docs/reproduce.md), so few seeds' scatter is the likelier reading"
    )
    spread = (
        f" over {c.n} settled seeds, {abs(c.pooled) / c.pooled_se:.2g} of its standard errors "
        f"({c.pooled_se:.2g} in log) from 1"
        if math.isfinite(c.pooled_se) and c.pooled_se > 0
        else ""
    )
    return f"measured / predicted is {g:.3g} on average{spread}, {side}; worst seed {c.worst[0]} at {c.worst[1]:.3g}."


def dropped(r: SetResult) -> str:
    """Which ``H`` lost their settled seeds, and why (counted by reason), for a failing row's note."""
    out = []
    for H, row in zip(r.H, r.per_H):
        bad = [x for x in row if not x.settled]
        if len(row) - len(bad) >= 2:
            continue
        why = {
            "too short for their correlation time (pooled window under "
            f"{MIN_TAUS:g} tau_int; tau_int = {row_tau(row):.3g})": sum("correlation time" in x.why for x in bad),
            "in transition (clusters merging inside the window)": sum("in transition" in x.why for x in bad),
            "a window shorter than one relaxation time": sum("relaxation time" in x.why for x in bad),
        }
        out.append(f"H = {H}: " + ", ".join(f"{n} {k}" for k, n in why.items() if n))
    return (" Left out of the fit: " + "; ".join(out) + " (a longer run would bring them in).") if out else ""


def exponent_note(p: Prediction, r: SetResult) -> str:
    """Why the 1/H row failed: its control not rejected, no fit, no gap, pre-asymptotic, undecided, or which side."""
    f = r.fit
    rf, gap = f.ratio, f.gap
    lo, hi = rf.ci
    seeds = f"{r.batches} batch{'es' if r.batches > 1 else ''} of {r.seeds_per_batch} seeds"
    if not p.control_rejected:
        return "the control's CI meets the criterion too: the run cannot tell the two laws apart."
    if not math.isfinite(lo):
        return f"fewer than two H had two settled seeds after {seeds}: no fit." + dropped(r)
    if not (math.isfinite(gap) and gap > 0):
        return f"the predicted constants' own exponent {f.predicted_exponent:.2f} leaves no gap to H^(-1/2)."
    short = ""
    if len(rf.tail_H) < min(len(r.H), r.config.tail):
        short = f" The fit is over H = {', '.join(str(int(h)) for h in rf.tail_H)} only." + dropped(r)
    gm = ", ".join(f"{v:.3g}" for v in rf.median if math.isfinite(v))
    n_ok = int(sum(np.sum(r.settled[i]) for i, H in enumerate(r.H) if H in rf.tail_H))
    n_all = sum(len(row) for H, row in zip(r.H, r.per_H) if H in rf.tail_H)
    if f.decision == "undecided" and rf.pre_asymptotic:
        return (
            f"pre-asymptotic: after {seeds} the local exponents of measured / predicted "
            f"({', '.join(f'{v:.2f}' for v in rf.local_exponents)}) still drift over H = "
            f"{', '.join(str(int(h)) for h in rf.tail_H)} (attnflow.verdicts.stats.asymptotic_start): no exponent "
            "to test, a FAIL by the stated design, not evidence against the law." + short
        )
    if f.decision == "undecided":
        need = f.batches_needed
        cap = r.config.seed_batches
        stop = (
            f"even if the prediction held, a decision would need about {math.ceil(need)} batches at this scatter, "
            f"beyond the budget of {cap}"
            if need > cap
            else f"the budget of {cap} batches was spent"
        )
        return (
            f"inconclusive ({stop}): after {seeds} ({n_ok} of {n_all} seeds settled at H = "
            f"{', '.join(str(int(h)) for h in rf.tail_H)}) the ratio's CI [{lo:.2f}, {hi:.2f}] does not lie inside "
            f"(-{0.5 * gap:.2f}, {0.5 * gap:.2f}) by the minimum margin {MIN_MARGIN:g} of {0.5 * gap:.2f}"
            + (f", and a fit on {len(rf.tail_H)} H values decides nothing" if len(rf.tail_H) < 3 else "")
            + f" (geometric means of measured / "
            f"predicted per H: {gm}): not enough seeds, a FAIL by the stated design, not evidence against the law."
            + short
        )
    if hi < 0:
        return (
            f"the ratio's CI [{lo:.2f}, {hi:.2f}] lies below 0: the floor falls faster than its predicted constants "
            f"(geometric means of measured / predicted per H: {gm}), beyond the prediction on the side away from "
            "H^(-1/2); the two-sided criterion rejects it." + short
        )
    return (
        f"the ratio's CI [{lo:.2f}, {hi:.2f}] excludes 0 on the side of H^(-1/2) (midpoint {0.5 * gap:.2f}): the floor falls more slowly "
        f"than its predicted constants (geometric means of measured / predicted per H: {gm}); at small H a cluster "
        "that follows the heads' noise sits below its frozen-cloud constant, or seeds have not reached their "
        "stationary point." + short
    )


def figure(results: dict[str, SetResult], seeds: list[int]):
    """Per set: each seed's floor against ``H`` with the settled seeds' median, and measured / predicted."""
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    for j, (name, r) in enumerate(results.items()):
        Hs, m = np.array(r.H, float), r.main
        col = f"C{j}"
        for i, H in enumerate(Hs):
            ok = r.settled[i]
            ax[0].loglog(np.full(ok.sum(), H), r.floor[i][ok], ".", color=col, ms=3, alpha=0.4)
            ax[0].loglog(np.full((~ok).sum(), H), r.floor[i][~ok], "x", color="C3", ms=5)
            ax[1].semilogx(np.full(ok.sum(), H), (r.floor / r.predicted)[i][ok], ".", color=col, ms=4)
            ax[1].semilogx(np.full((~ok).sum(), H), (r.floor / r.predicted)[i][~ok], "x", color="C3", ms=5)
        ax[0].loglog(
            Hs,
            m.median,
            "o-",
            color=col,
            label=f"{name}: tail {m.exponent:.2f} [{m.ci[0]:.2f}, {m.ci[1]:.2f}]",
        )
        ax[1].plot([], [], ".", color=col, label=name)
    ref = results["base"]
    Hr, med = np.array(ref.H, float), ref.main.median
    k = np.flatnonzero(np.isfinite(med))
    if len(k):
        ax[0].loglog(Hr, med[k[-1]] * (Hr / Hr[k[-1]]) ** -1.0, "k:", label="slope -1")
    ax[0].plot([], [], "x", color="C3", label="not settled (not in the fit)")
    ax[0].set_xlabel("number of heads H")
    ax[0].set_ylabel(r"floor $\langle |\partial F|^2 \rangle_{late}$")
    ax[0].set_title("slope floor per seed; median of settled seeds")
    ax[1].axhspan(1 / (1 + RATIO_TOL), 1 + RATIO_TOL, color="0.9", label=f"1 +- {RATIO_TOL:g} (log scale)")
    ax[1].axhline(1.0, color="k", lw=0.8)
    ax[1].axhline(1 / CONTROL_FACTOR, color="C3", lw=0.8, ls="--", label=f"control: prediction x{CONTROL_FACTOR:g}")
    ax[1].set_yscale("log")
    ax[1].set_xlabel("number of heads H")
    ax[1].set_ylabel("measured / predicted floor")
    ax[1].set_title("per-seed floor against its central-limit constant")
    for a in ax:
        a.legend(fontsize=7)
        a.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
