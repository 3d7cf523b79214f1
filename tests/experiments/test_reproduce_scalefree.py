"""Issue 28: per-seed floor constants, scale-free criteria with margins, random parameter sets, d = 2,
finite-H path length, the gf/mha gap, the EDI order of callable weights, parameter models (issue 26)
and reproduce's tables at 80 columns (issue 31)."""

import math

import numpy as np
import pytest
import yaml
from rich.console import Console

from attnflow.analysis.edi import edi_budget
from attnflow.analysis.limits import stationarity
from attnflow.analysis.model_gap import field_gap, trajectory_gap
from attnflow.config import parse_config
from attnflow.core.errors import InputError
from attnflow.core.heads import goe_heads, identity_heads
from attnflow.core.tokens import uniform
from attnflow.experiments import PARAMS, ExperimentConfigError, default_params, experiment_config, run_experiment
from attnflow.experiments.common import (
    MIN_MARGIN,
    ExperimentResult,
    Prediction,
    margin_above,
    margin_below,
    margin_inside,
    write_experiment,
)
from attnflow.experiments.edi import ROUNDOFF, asymptotic_order, run_config
from attnflow.experiments.floors import (
    WINDOW_TAUS,
    late_window,
    predicted_floor,
    relaxation_time,
    single_cluster_constant,
    slopes_sq,
    time_average,
)
from attnflow.experiments.heads import (
    CONTROL_FACTOR,
    FAMILY_LEVEL,
    RATIO_TOL,
    SeedFloor,
    _constant_check,
    family_z,
    seed_bound,
)
from attnflow.experiments.oscillating import finite_h_path_length
from attnflow.experiments.random_sets import draw
from attnflow.solve.simulation import simulate
from attnflow.weights.processes import FromCallable, OrnsteinUhlenbeck, Oscillating

NAMES = ("ou", "oscillating", "heads", "edi", "stability-input", "stability-weights")


# --- per-seed floors ----------------------------------------------------------------------------------


def test_batched_slopes_match_stationarity(rng):
    """The Monte Carlo's batched |dF|^2 equals analysis.limits.stationarity head set by head set."""
    G = rng.standard_normal((3, 5, 3, 3))
    A = 2.0 * np.eye(3) + 0.3 * 0.5 * (G + G.transpose(0, 1, 3, 2))
    x = uniform(12, 3, 4)
    expect = [stationarity(x, A[r]).slope ** 2 for r in range(3)]
    assert slopes_sq(x, A) == pytest.approx(expect, rel=1e-10)


def test_predicted_floor_matches_the_closed_form_at_a_single_cluster():
    """At a single cluster under beta I + c S, H E|dF|^2 -> c^2 (d-1)/2 exp(beta + 3c^2/2) (Gaussian MGF)."""
    beta, c, H = 2.0, 0.5 / math.sqrt(2.0), 64
    for d in (2, 4):
        x = np.tile(np.eye(d)[0], (8, 1))
        mean, se = predicted_floor(x, identity_heads(H, d, beta), c, 1500, seed=3)
        closed = single_cluster_constant(beta, c, d)
        # Monte Carlo error plus the O(1/H) finite-H correction of the ratio of averages.
        assert abs(H * mean - closed) <= 4 * H * se + closed / H * 4
        # Negative control: a wrong constant (x2) is far outside the same band.
        assert abs(2 * H * mean - closed) > 4 * H * se + closed / H * 4


def _rows(ratios, se=0.1):
    return [
        SeedFloor(i, r, se * r, 0.0, 1.0, (5.0, 10.0), (1, 1), True, "", 1.0, 0.01, None) for i, r in enumerate(ratios)
    ]


def test_per_seed_constant_check_and_its_planted_wrong_constant():
    rng = np.random.default_rng(0)
    good = _rows(np.exp(0.1 * rng.standard_normal(24)))
    ok = _constant_check(good)
    assert ok.margin > MIN_MARGIN and ok.n == 24
    wrong = _constant_check(good, CONTROL_FACTOR)  # the prediction doubled: rejected
    assert wrong.margin < 0
    # A pooled bias beyond RATIO_TOL fails even when every seed is within its own error bars.
    biased = _constant_check(_rows(np.full(10, 1.0 + 2 * RATIO_TOL), se=0.5))
    assert biased.margin < 0
    assert _constant_check([]).margin == -math.inf


def test_per_seed_bound_holds_its_level_for_any_number_of_seeds():
    """Sidak's z_n: n correct seeds with Gaussian errors fail together at FAMILY_LEVEL, for every n."""
    from scipy import stats

    assert family_z(1) == pytest.approx(3.0, abs=1e-12)  # one seed: the old 3 standard errors
    rng = np.random.default_rng(5)
    for n in (8, 24, 72):
        z = family_z(n)
        # Closed form: P(all n within z) = (1 - 2 sf(z))^n = 1 - FAMILY_LEVEL.
        assert (1 - 2 * stats.norm.sf(z)) ** n == pytest.approx(1 - FAMILY_LEVEL, rel=1e-12)
        # Monte Carlo of the worst of n standard normals (the errors of a correct constant).
        worst = np.abs(rng.standard_normal((200_000, n))).max(axis=1)
        rate = float(np.mean(worst > z))
        assert abs(rate - FAMILY_LEVEL) < 5 * math.sqrt(FAMILY_LEVEL / 200_000)
        # Control: the fixed per-seed 3 fails a correct constant far more often as n grows.
        assert float(np.mean(worst > 3.0)) > 2.5 * FAMILY_LEVEL
    # In the check: a seed 3.5 standard errors low (beyond RATIO_TOL) passes among 24 seeds, not alone.
    tol = math.log1p(RATIO_TOL)
    se = 0.1
    out = math.exp(-tol - 3.5 * se)
    rows = _rows([1.0] * 23 + [out], se=se)
    many = _constant_check(rows)
    assert many.z == pytest.approx(family_z(24)) and many.margin > 0
    se_log = rows[-1].se_log  # the window's error with the Monte Carlo error of the prediction
    assert many.worst[2] == pytest.approx(-seed_bound(math.log(out), se_log, 24, tol))  # signed: the low side
    assert -math.log(out) > tol + 3.0 * se_log  # control: the old fixed 3 would have failed the set on that seed
    # ... and 4.5 standard errors out fails among 24 seeds too, on either side.
    assert _constant_check(_rows([1.0] * 23 + [math.exp(-tol - 4.5 * se)], se=se)).margin < 0
    assert _constant_check(_rows([1.0] * 23 + [math.exp(tol + 4.5 * se)], se=se)).margin < 0


def test_seed_bound_is_the_gamma_quantile_and_holds_its_level():
    """A window mean of |dF|^2 is close to Gamma(k, 1/k), k = 1/se^2: seed_bound's Gamma quantiles fail n correct
    Gamma seeds together at FAMILY_LEVEL (Monte Carlo), and tend to z_n se for small se. Control: the Gaussian
    bound in log ratio (z_n se on both sides) fails the same correct seeds at five times that level, on the low
    side (the log of a Gamma variable is skewed to the left)."""
    tol = math.log1p(RATIO_TOL)
    for n in (8, 24):
        z = family_z(n)
        assert seed_bound(-1.0, 0.002, n, tol) - tol == pytest.approx(z * 0.002, rel=2e-3)  # the Gaussian limit
        assert seed_bound(1.0, 0.002, n, tol) - tol == pytest.approx(z * 0.002, rel=2e-3)
    assert seed_bound(-1.0, 0.0, 8, tol) == tol and math.isnan(seed_bound(1.0, math.nan, 8, tol))
    rng = np.random.default_rng(0)
    n, se = 24, 0.25
    k = 1.0 / se**2
    v = np.log(rng.gamma(k, 1.0 / k, (100_000, n)))
    lo, hi = seed_bound(-1.0, se, n, 0.0), seed_bound(1.0, se, n, 0.0)
    assert lo > family_z(n) * se > hi  # wider below, narrower above
    rate = float(((v < -lo) | (v > hi)).any(axis=1).mean())
    assert abs(rate - FAMILY_LEVEL) < 5 * math.sqrt(FAMILY_LEVEL / 100_000), rate
    gauss = float((np.abs(v) > family_z(n) * se).any(axis=1).mean())
    assert gauss > 4 * FAMILY_LEVEL, gauss


# --- the run's own time scales -------------------------------------------------------------------------


def test_relaxation_time_and_window_follow_the_run():
    t = np.linspace(0.0, 40.0, 401)
    for tau in (0.5, 2.0, 8.0):
        F = -1.0 + np.exp(-t / tau)
        assert relaxation_time(t, F) == pytest.approx(tau, abs=0.11)
        w = late_window(t, relaxation_time(t, F))
        assert w.start == pytest.approx(max(WINDOW_TAUS * tau, 20.0), abs=0.35)
    # A run shorter than its relaxation: the window is not long enough, and says so.
    F = -1.0 + np.exp(-t / 30.0) + 1e-3 * np.sin(t)
    assert not late_window(t, relaxation_time(t, F)).ok
    mean, se = time_average(t, np.ones_like(t), 20.0)
    assert mean == pytest.approx(1.0) and se == pytest.approx(0.0, abs=1e-15)


# --- margins --------------------------------------------------------------------------------------------


def test_a_pass_by_a_hair_is_a_fail_and_a_control_rejected_by_a_hair_is_not_rejected():
    assert margin_below(0.9, 1.0) == pytest.approx(0.1) and margin_above(1.1, 1.0) == pytest.approx(0.1)
    assert margin_inside(2.0, 1.0, 3.0) == pytest.approx(1.0) and margin_inside(0.0, 1.0, 3.0) < 0
    clear = Prediction("x", "s", "m", "c", True, "ctl", "cm", True, margin=0.5, control_margin=0.5)
    assert clear.ok and clear.verdict_text == "PASS (margin 0.5)"
    hair = Prediction("x", "s", "m", "c", True, "ctl", "cm", True, margin=0.05, control_margin=0.5)
    assert not hair.passed and hair.verdict == "FAIL" and "below the minimum" in hair.explanation
    ctl = Prediction("x", "s", "m", "c", True, "ctl", "cm", True, margin=0.5, control_margin=0.05)
    assert not ctl.control_rejected and ctl.verdict == "FAIL (control passes)"


def test_edi_order_is_fitted_over_the_asymptotic_range():
    dts = [0.4, 0.2, 0.1, 0.05, 0.025]
    # Pre-asymptotic at the coarsest step, then order 4, then rounding at the finest.
    rel = np.array([3e-1, 1e-4 * 16, 1e-4, 1e-4 / 16, 0.5 * ROUNDOFF])
    order, steps, local = asymptotic_order(dts, rel, 0.5)
    assert order == pytest.approx(4.0, abs=1e-9) and steps == [0.2, 0.1, 0.05]
    assert len(local) == 4
    # Negative control: an O(1) residual has order 0, far from 4.
    assert asymptotic_order(dts, np.full(5, 0.1), 0.5)[0] == pytest.approx(0.0, abs=1e-9)


def test_edi_of_a_callable_states_its_order_and_the_control_sees_it():
    """A callable without derivative= closes the EDI at rk4's order 4 (quadrature, dA/dt by finite difference,
    stated by the budget); with derivative="increment" at order 1. The order-4 criterion rejects the control."""
    rc = parse_config(run_config(default_params("edi", quick=True).to_dict() | {"t_end": 1.0}, "oscillating", 0.1, 0))
    from attnflow.config import build

    x0, osc, kw = build(rc)
    assert isinstance(osc, Oscillating)
    x0 = x0[:12] / np.linalg.norm(x0[:12], axis=1, keepdims=True)
    dts = [0.1, 0.05, 0.025]
    rel = {"plain": [], "increment": []}
    for dt in dts:
        kw2 = {**kw, "dt": dt, "t_end": 1.0, "save_every": 10}
        plain = FromCallable(osc.A_at)
        increment = FromCallable(osc.A_at, derivative="increment")
        b = edi_budget(simulate(x0, plain, **kw2))
        assert b.expected_order == 4 and "finite difference" in b.order_reason
        rel["plain"].append(b.relative_residual)
        b = edi_budget(simulate(x0, increment, **kw2))
        assert b.expected_order == 1 and "first-order" in b.order_reason
        rel["increment"].append(b.relative_residual)
    p_plain = asymptotic_order(dts, np.array(rel["plain"]), 0.5)[0]
    p_inc = asymptotic_order(dts, np.array(rel["increment"]), 0.5)[0]
    assert abs(p_plain - 4.0) <= 0.5
    assert abs(p_inc - 4.0) > 0.5 and abs(p_inc - 1.0) <= 0.3


# --- finite H, the gf/mha gap -------------------------------------------------------------------------


def test_finite_h_heads_have_a_brownian_path_and_the_law_does_not():
    A_bar = np.repeat(np.diag([2.0, 1.0, 0.5])[None], 6, 0)
    ou = OrnsteinUhlenbeck(A_bar, 1.0, 0.4, A0=A_bar + goe_heads(6, 3, 1.0, 1))
    r = finite_h_path_length(ou, [4.0, 8.0], seed=2)
    assert all(-0.6 <= e <= -0.4 for e in r["exponents"])
    assert 1.8 <= r["growth_T"] <= 2.2
    assert all(abs(e) < 0.1 for e in r["law_exponents"]) and r["law_growth_T"] < 1.2
    assert min(r["margins"]) > 0 > min(r["law_margins"])


def test_gf_and_mha_gap(rng):
    x = uniform(20, 3, 0)
    one = identity_heads(1, 3, 2.0) + goe_heads(1, 3, 0.5, 1)
    assert field_gap(x, one) == pytest.approx(0.0, abs=1e-12)  # one head: the models coincide
    many = identity_heads(4, 3, 2.0) + goe_heads(4, 3, 1.5, 2)
    gap = field_gap(x, many)
    assert 0.01 < gap < 10
    with pytest.raises(ValueError):  # InputError once core.heads raises it (issue 26)
        field_gap(x, rng.standard_normal((2, 3, 3)))  # not symmetric: no gf field
    kw = {"t_end": 1.0, "dt": 0.05, "method": "rk4", "save_every": 5}
    g = simulate(x, many, model="gf", **kw)
    m = simulate(x, many, model="mha", **kw)
    tg = trajectory_gap(g, m)
    assert tg.w2[0] == pytest.approx(0.0, abs=1e-9) and tg.final_w2 > 1e-4 and tg.largest_angle > 0
    assert trajectory_gap(g, simulate(x, many, model="mha", **kw)).final_w2 == pytest.approx(tg.final_w2)
    with pytest.raises(InputError):
        trajectory_gap(m, g)


# --- parameter models ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_parameters_round_trip_and_refuse_bad_sets(name):
    for quick in (True, False):
        p = default_params(name, quick=quick)
        assert PARAMS[name].parse(yaml.safe_load(yaml.safe_dump(p.to_dict()))) == p
    with pytest.raises(ExperimentConfigError):
        experiment_config(name, sets=["nope=1"])
    assert isinstance(ExperimentConfigError("x"), InputError)


def test_configs_yaml_parses_back(tmp_path):
    """Every config an experiment writes parses: the parameters with the experiment's model, each run
    with the core parse_config."""
    cfg = experiment_config("edi", quick=True)
    runs = [run_config(cfg, p, 0.1, 0) for p in ("constant", "oscillating", "ou")]
    res = ExperimentResult("edi", {}, [], configs=runs, parameters=cfg)
    write_experiment(res, tmp_path / "edi", seed=0, quick=True)
    data = yaml.safe_load((tmp_path / "edi" / "configs.yaml").read_text())
    assert PARAMS["edi"].parse(data["parameters"]).to_dict() == cfg
    for r in data["runs"]:
        parse_config(r)


@pytest.mark.parametrize("name", NAMES)
def test_random_sets_are_valid_and_cover_the_documented_ranges(name):
    ds = set()
    for k in range(40):
        sets = draw(name, np.random.default_rng([5, k]))
        assert sets == draw(name, np.random.default_rng([5, k]))  # reproducible from (seed, k)
        cfg = experiment_config(name, quick=True, sets=sets)
        d = len(cfg["heads"]["spectrum"]) if name in ("ou", "oscillating") else cfg["tokens"]["d"]
        ds.add(d)
    assert ds == set(range(2, 9))


# --- d = 2 end to end, random sets through the CLI, 80 columns -------------------------------------


SMALL = {
    "ou": ["heads.spectrum=[2.0, 0.5]", "tokens.n=12", "heads.count=4", "integration.t_end=4"],
    "oscillating": [
        "heads.spectrum=[2.0, 0.5]",
        "tokens.n=12",
        "heads.count=4",
        "integration.t_end=4",
        "law.paths=2000",
        "law.t_ends=[2, 4]",
    ],
    "heads": ["tokens.d=2", "heads.counts=[4, 8]", "seeds=3", "integration.t_end=4", "draws=16", "tail=2"],
    "edi": ["tokens.d=2", "tokens.n=8", "t_end=1.0", "ou.seeds=2"],
    "stability-input": ["tokens.d=2", "tokens.n=8", "integration.t_end=1.0"],
    "stability-weights": ["tokens.d=2", "tokens.n=8", "integration.t_end=1.0"],
}


@pytest.mark.parametrize("name", list(SMALL))
def test_d2_runs_end_to_end_with_circle_figures(name, tmp_path):
    res = run_experiment(name, quick=True, seed=0, sets=SMALL[name])
    assert res.predictions and res.figures
    write_experiment(res, tmp_path / name, seed=0, quick=True)
    assert list((tmp_path / name / "figures").glob("*.png"))
    assert all(p.margin is not None for p in res.predictions)


@pytest.mark.integration
def test_random_sets_cli_small_k(tmp_path):
    import json

    from typer.testing import CliRunner

    from attnflow.cli.main import app

    out = tmp_path / "rs"
    r = CliRunner().invoke(
        app, ["reproduce", "stability-weights", "--random-sets", "1", "--seed", "3", "--out", str(out)]
    )
    assert r.exit_code in (0, 1), r.output
    data = json.loads((out / "random_sets.json").read_text())
    assert data["random_sets"] == 1 and data["predictions"] and "ranges" in data
    assert all(v["runs"] == 1 for v in data["predictions"].values())
    # Each set keeps its measured values (a failure is explained without a rerun).
    measured = data["sets"][0]["experiments"]["stability-weights"]["measured"]
    assert isinstance(measured, dict) and measured
    assert (r.exit_code == 0) is data["passed"]
    assert "--random-sets 1" in (out / "report.md").read_text()
    bad = CliRunner().invoke(
        app, ["reproduce", "heads", "--random-sets", "2", "--set", "seeds=3", "--out", str(tmp_path / "x")]
    )
    assert bad.exit_code == 2 and not (tmp_path / "x").exists()


def test_reproduce_table_reads_at_80_columns():
    from attnflow.cli.reproduce import results_table

    long = "the late slope floor scales like 1/H over settled seeds " * 3
    p = Prediction("heads", long, "tail exponent -1.07, CI [-1.29, -0.87]", "CI excludes -1/2", True, "ctl", "x", True,
                   margin=0.48, control_margin=1.4)  # fmt: skip
    res = ExperimentResult("heads", {}, [p, p])
    console = Console(width=80, record=True, color_system=None)
    console.print(results_table([res], "attnflow reproduce heads"))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    flat = " ".join(text.split())
    for word in long.split():  # no word is split across lines
        assert f" {word} " in f" {flat} " or f"{word}" in flat.replace("│", " ").split()
    assert "PASS" in text and "margin 0.48" in text


def test_random_sets_keep_one_row_per_prediction_across_sets():
    from attnflow.experiments.random_sets import _key

    a = Prediction("heads", "OU weights (base: d 5, beta 1.3, uniform cloud): floor ~ 1/H (median)", "m", "c", True)
    b = Prediction("heads", "OU weights (base: d 2, beta 2.7, cap cloud): floor ~ 1/H (median)", "m", "c", True)
    assert _key(ExperimentResult("heads", {}, [a]), 0) == _key(ExperimentResult("heads", {}, [b]), 0)
    assert _key(ExperimentResult("heads", {}, [a]), 0) == "heads #1: OU weights: floor ~ 1/H"


def test_random_sets_close_each_sets_figures():
    """Each set's figures are closed once the set is recorded (20 sets of figures stayed open before)."""
    import matplotlib.pyplot as plt

    from attnflow.experiments.random_sets import run_random_sets

    def run(name, overrides):
        fig = plt.figure()
        p = Prediction(name, "s", "m", "c", True, "ctl", "x", True, margin=0.5, control_margin=0.5)
        return ExperimentResult(name, {"v": 1.0}, [p], figures={"f": fig})

    plt.close("all")
    rs = run_random_sets("edi", 3, 0, run, ["edi"])
    assert rs.passed and plt.get_fignums() == []
    assert rs.sets[0]["experiments"]["edi"]["measured"] == {"v": 1.0}
