"""attnflow reproduce: every prediction carries a negative control that its criterion rejects; the
checks' building blocks against closed forms; the Lipschitz bound is a bound."""

import json
import math

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from attnflow.analysis.floor_fit import Decision, ExponentFit, TailFit
from attnflow.analysis.following import floor_scale
from attnflow.analysis.laws import bures_wasserstein, law_path_length
from attnflow.cli.main import app
from attnflow.dynamics.lipschitz import lipschitz_bound
from attnflow.experiments import ExperimentConfigError, experiment_config, relax_runs
from attnflow.experiments.edi import _order, _rms
from attnflow.experiments.heads import (
    COMPETING,
    NO_FIT_BATCHES,
    _decide,
    _decisive,
    _exponent_fit,
    _ratio_margin,
    adds_batch,
    batches_needed,
)
from attnflow.experiments.relax_runs import FLOOR_FACTOR
from attnflow.experiments.report import README_BEGIN, README_END
from attnflow.weights.processes import OrnsteinUhlenbeck, Oscillating
from helpers import random_sym, random_tokens

#: Predictions whose criterion is well posed and holds, with the control rejected, in the quick run.
MUST_HOLD = {
    ("ou", 0),  # stationary for Theta_inf (the run's own transient is not)
    ("ou", 1),  # the cloud settles (the oscillating one does not)
    ("ou", 2),  # the slope is at the finite-H floor (the oscillating one is far above)
    ("oscillating", 0),  # OU law length converges
    ("oscillating", 1),  # oscillating law length grows linearly
    ("oscillating", 2),  # finite-H heads: a Brownian path (the H = infinity law is not)
    ("oscillating", 3),  # the slope stays above the floor (the OU one does not)
    ("oscillating", 4),  # no relaxation under oscillating weights
    ("edi", 0),  # constant weights, order 4
    ("edi", 1),  # oscillating weights, order 4
    ("edi", 3),  # a callable without derivative: order 4 by finite difference (the increment control has 1)
    ("heads", 0),  # each settled seed's floor is its predicted constant (the doubled constant is rejected)
    ("heads", 1),  # quick: 1/H against H^(-1/2) as competing laws
    ("stability-input", 0),
    ("stability-input", 1),
    ("stability-input", 2),  # continuous dependence: sup_t W2 ~ W2_0 (the other-weight-path pair has order 0)
    ("stability-weights", 0),
    ("stability-weights", 1),
}
#: Every control must be rejected. Reported as it comes out, not required: the EDI order along OU
#: paths (edi, 2), a statistical estimate (rms over 24 seeds) whose scatter is half its tolerance.
CONTROL_MAY_PASS: set[tuple[str, int]] = set()


@pytest.mark.parametrize("model", ["gf", "mha"])
def test_lipschitz_bound_dominates_the_jacobian(rng, model):
    """L bounds the a-weighted operator norm of the particle field's Jacobian (autograd) at random states."""
    import attnflow as af

    N, d, H = 12, 3, 3
    for _ in range(5):
        A = random_sym(rng, H, d, 0.8) if model == "gf" else rng.standard_normal((H, d, d)) * 0.5
        V = None if model == "gf" else rng.standard_normal((H, d, d)) * 0.5
        x = torch.from_numpy(random_tokens(rng, N, d))
        f = lambda y, A=A, V=V: af.velocity(
            y.reshape(N, d), torch.from_numpy(A), None if V is None else torch.from_numpy(V), model=model
        ).reshape(-1)
        J = torch.autograd.functional.jacobian(f, x.reshape(-1)).numpy()
        # Uniform masses: ||.||_a is a multiple of the Euclidean norm, so the operator norms agree.
        assert np.linalg.norm(J, 2) <= lipschitz_bound(A, V, model=model)


def _synthetic_heads(rng, Hs, n, law, noise):
    """Per-seed predicted constants ~ H^(-0.95) (a finite-H correction, 5% seed scatter) and floors that
    are those constants times H^law times log-normal window noise."""
    pred = 10.0 * Hs[:, None] ** -0.95 * np.exp(0.05 * rng.standard_normal((len(Hs), n)))
    floors = pred * Hs[:, None] ** law * np.exp(noise * rng.standard_normal((len(Hs), n)))
    return floors, np.sqrt(floors), pred, np.ones(floors.shape, bool)


def test_tail_criterion_accepts_one_over_h_and_rejects_h_to_minus_half():
    """The exponent criterion on synthetic floors over 8 seeds: floors following their predicted constants
    pass; floors ~ H^(-1/2) (the competing law, planted) fail decisively, as their |dF| controls do."""
    rng = np.random.default_rng(0)
    Hs = np.array([16.0, 32, 64, 128, 256])
    for law, expect in ((0.0, "pass"), (0.45, "fail")):  # 0.45: floor ~ H^(-0.5) given constants ~ H^(-0.95)
        floors, ab, pred, ok = _synthetic_heads(rng, Hs, 8, law, 0.1)
        fit = _exponent_fit(Hs, floors, ab, pred, ok, 3, 1)
        assert fit.predicted_exponent == pytest.approx(-0.95, abs=0.05)
        assert fit.gap == pytest.approx(COMPETING + 0.95, abs=0.05)
        assert abs(fit.ratio.exponent - law) < 0.1
        assert abs(fit.main.exponent - (law - 0.95)) < 0.1  # the floor's own exponent (information)
        assert np.allclose(fit.main.local_exponents, law - 0.95, atol=0.25)
        assert fit.decision == expect
        assert (_ratio_margin(fit.ratio.ci, fit.gap) > 0) is (expect == "pass")
        if expect == "pass":  # the control: sqrt of the floors ~ H^(-1/2), over the same constants
            assert fit.control_decision == "fail"


def test_a_floor_planted_at_h_to_minus_1_3_fails_and_a_two_h_fit_is_undecided():
    """Floors at H^-1.3 (steeper than their constants ~ H^-0.95: ratio exponent -0.35) fail the 1/H prediction
    as surely as the competing H^-1/2; the same data on two H values is undecided, never a pass."""
    rng = np.random.default_rng(5)
    Hs = np.array([16.0, 32, 64, 128])
    floors, ab, pred, ok = _synthetic_heads(rng, Hs, 8, -0.35, 0.1)
    fit = _exponent_fit(Hs, floors, ab, pred, ok, 3, 1)
    assert fit.main.exponent == pytest.approx(-1.3, abs=0.1)
    assert fit.ratio.ci[1] < 0.5 * fit.gap  # the old one-sided rule would have passed it
    assert fit.decision == "fail"
    two = _exponent_fit(Hs[:2], floors[:2], ab[:2], pred[:2], ok[:2], 3, 1)
    assert len(two.ratio.tail_H) == 2 and two.decision == "undecided"
    good, gab, gpred, gok = _synthetic_heads(rng, Hs[:2], 8, 0.0, 0.02)
    assert _exponent_fit(Hs[:2], good, gab, gpred, gok, 3, 1).decision == "undecided"  # exact on 2 H: still
    # A middle H whose seeds are all unsettled leaves two H values: undecided as well.
    ok_mid = ok.copy()
    ok_mid[2] = False
    assert _exponent_fit(Hs[1:], floors[1:], ab[1:], pred[1:], ok_mid[1:], 3, 1).decision == "undecided"


def test_exponent_decision_is_sequential_and_undecided_is_not_a_pass():
    """The verdict against the competing law: below the midpoint (by the minimum margin) passes, above fails, across it is undecided
    (more seeds); noisy windows leave 8 seeds undecided and 24 seeds of the same law decide; no fit and
    no gap are undecided, never a pass."""
    assert _decide([-0.2, 0.2], 0.5, 3) == "pass" and _ratio_margin([-0.2, 0.2], 0.5) == pytest.approx(0.2)
    assert _decide([0.3, 0.7], 0.5, 3) == "fail"
    assert _decide([-0.2, 0.24], 0.5, 3) == "undecided"  # below the midpoint, by less than the report's minimum margin
    assert _decide([-0.1, 0.3], 0.5, 3) == "undecided" and _ratio_margin([-0.1, 0.3], 0.5) < 0
    assert _decide([float("nan")] * 2, 0.5, 3) == "undecided" and _decide([-0.1, 0.1], 0.0, 3) == "undecided"
    # Two-sided: beyond the prediction on the far side fails (the H^-1.31 [-1.50, -1.15] floor, whose
    # ratio CI is about [-0.5, -0.15]; the old one-sided rule, upper end below the midpoint, passed it).
    assert _decide([-0.5, -0.15], 0.5, 3) == "fail" and _ratio_margin([-0.5, -0.15], 0.5) < 0
    assert _decide([-0.2, 0.2], 0.5, 2) == "undecided"  # two H values: a line through two points
    assert _decide([-0.2, 0.2], 0.5) == "undecided"
    Hs = np.array([16.0, 32, 64])
    floors, ab, pred, ok = _synthetic_heads(np.random.default_rng(1), Hs, 24, 0.0, 0.4)
    few = _exponent_fit(Hs, floors[:, :8], ab[:, :8], pred[:, :8], ok[:, :8], 3, 1)
    many = _exponent_fit(Hs, floors, ab, pred, ok, 3, 1)
    assert few.decision == "undecided", few.ratio.ci
    assert many.decision == "pass", many.ratio.ci


def test_floor_scale_is_the_heads_fluctuation():
    """At a point cluster on an eigenvector of a common mean (stationary for every c = 0 law), s_H is the
    heads' finite-H fluctuation: 0 without noise, linear in c, and ~ H^(-1/2) (the mean of H noises)."""
    x = np.tile([1.0, 0.0, 0.0], (4, 1))
    spec = np.diag([3.0, 1.5, 0.5])

    def s(H: int, sigma: float) -> float:
        ou = OrnsteinUhlenbeck(np.repeat(spec[None], H, 0), 1.0, sigma)
        return floor_scale(x, ou, 400, 0)

    assert s(4, 0.0) < 1e-12
    assert s(4, 0.02) / s(4, 0.01) == pytest.approx(2.0, rel=0.1)
    assert s(64, 0.01) / s(4, 0.01) == pytest.approx(0.25, rel=0.15)


def test_slope_floor_separates_ou_from_oscillating():
    """The quick ou/oscillating runs: OU's late rms slope is at the floor, the oscillating one far above it."""
    cfg = relax_runs.default_config(True)
    trajs, procs = relax_runs.pair_runs(cfg, 0)
    fl = relax_runs.slope_floor(trajs, procs["ou"], cfg, 0)
    assert fl.scale > 0
    assert fl.runs["ou"].ratio <= FLOOR_FACTOR < 10 * FLOOR_FACTOR < fl.runs["oscillating"].ratio
    # One window for both runs, in units of the OU run's own relaxation time: [max(3 tau, T/2), T].
    assert fl.runs["ou"].window == fl.runs["oscillating"].window
    saved = cfg["integration"]["dt"] * cfg["integration"]["save_every"]
    T = float(trajs["ou"].t[-1])  # t_end, or longer when the run continued to hold its relaxation time
    assert T >= cfg["integration"]["t_end"]
    assert fl.runs["ou"].window[0] == pytest.approx(max(3 * fl.tau, T / 2), abs=saved)
    assert fl.window_ok and 0 < fl.tau < T / 3


def test_edi_order_is_the_order_of_the_rms_over_paths():
    """One path's residual dt (a + b Z_dt), Z_dt fresh on every grid, has no order; the rms over paths has 1."""
    rng = np.random.default_rng(0)
    dts = [0.1, 0.05, 0.025, 0.0125]
    dt = np.array(dts)
    per_seed = np.abs(dt * (0.3 + rng.standard_normal((400, len(dts)))))
    assert _order(dts, _rms(per_seed)) == pytest.approx(1.0, abs=0.1)
    orders = np.array([_order(dts, r) for r in per_seed[:12]])
    assert orders.std() > 0.3  # a single path's order scatters
    # The negative control's shape: an O(1) error (a wrong weight contribution) has order 0.
    assert _order(dts, _rms(0.3 + 0.01 * rng.standard_normal((12, len(dts))))) == pytest.approx(0.0, abs=0.1)


def test_bures_wasserstein_closed_form():
    """Commuting covariances: W2^2 = |m1 - m2|^2 + sum (sqrt(a_i) - sqrt(b_i))^2."""
    a, b = np.array([1.0, 4.0, 0.25]), np.array([9.0, 1.0, 0.25])
    m1, m2 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
    expect = math.sqrt(5.0 + (1 - 3) ** 2 + (2 - 1) ** 2)
    assert bures_wasserstein(m1, np.diag(a), m2, np.diag(b)) == pytest.approx(expect, rel=1e-12)
    R = np.linalg.qr(np.random.default_rng(3).standard_normal((3, 3)))[0]  # rotate both: same distance
    assert bures_wasserstein(R @ m1, R @ np.diag(a) @ R.T, R @ m2, R @ np.diag(b) @ R.T) == pytest.approx(expect)


def test_law_path_length_matches_closed_forms():
    """Sampled law lengths: OU converges (to its closed form), oscillating grows linearly (deterministic: exact)."""
    H, d = 4, 3
    A_bar = np.broadcast_to(np.diag([3.0, 1.5, 0.5]), (H, d, d)).copy()
    A0 = A_bar + np.eye(3)
    ou = OrnsteinUhlenbeck(A_bar, 1.0, 0.3, A0=A0)
    law = law_path_length(ou, 20000, 0.5, 16.0, seed=5)
    # The mean moves from A_bar + I to A_bar: a straight line of length |I|_F = sqrt(3) in the mean alone,
    # plus the noise's growth from 0 to c_inf = 0.3 / sqrt(2) in each of 6 coordinates: at least sqrt(3).
    assert law["closed_form"][-1] >= math.sqrt(3.0) - 1e-6
    assert law["sampled"][-1] == pytest.approx(law["closed_form"][-1], rel=0.05)
    half = np.interp(8.0, law["t"], law["sampled"])
    assert (law["sampled"][-1] - half) < 0.02 * law["sampled"][-1]
    C = np.broadcast_to(np.eye(3), (H, d, d)).copy()
    osc = Oscillating(A_bar, C, 1.0, 0.0)  # every head A_bar + I sin t: the mean moves by |I|_F |cos t| dt
    law = law_path_length(osc, 1000, 0.01, 4 * math.pi, seed=0)
    assert law["sampled"][-1] == pytest.approx(8 * math.sqrt(3.0), rel=1e-3)
    assert np.array_equal(law["null"], np.zeros_like(law["null"]))


def test_ou_path_is_the_sampler_path():
    """OrnsteinUhlenbeck.path gives the values an OUSampler with the same seed visits on the same grid."""
    rng = np.random.default_rng(0)
    A_bar = random_sym(rng, 2, 3, 1.0)
    ou = OrnsteinUhlenbeck(A_bar, 0.7, 0.4, A0=A_bar + 0.5, seed=11)
    times = np.linspace(0.0, 2.0, 9)
    path = ou.path(times)
    s = ou.sampler()
    for k, t in enumerate(times):
        assert np.array_equal(s(t).A.numpy(), path[k])


def test_experiment_config_overrides():
    cfg = experiment_config("heads", sets=["heads.beta=3", "weights.rate=0.5", "heads.counts=[16,32,64,128]"])
    assert cfg["heads"]["beta"] == 3.0 and isinstance(cfg["heads"]["beta"], float)
    assert cfg["weights"]["rate"] == 0.5 and cfg["heads"]["counts"] == [16, 32, 64, 128]
    for bad in ("heads.nope=1", "heads.counts=abc", "nope.beta=1", "heads.beta", "heads.beta=[1"):
        with pytest.raises(ExperimentConfigError):
            experiment_config("heads", sets=[bad])


@pytest.mark.integration
def test_reproduce_single_writes_its_report_and_rejects_bad_sets(tmp_path):
    out = tmp_path / "sw"
    args = ["reproduce", "stability-weights", "--quick", "--out", str(out), "--set", "eps=[0.1,0.03,0.01]"]
    r = CliRunner().invoke(app, [*args, "--set", "integration.t_end=1.0"])
    assert r.exit_code in (0, 1), r.output
    report = (out / "report.md").read_text()
    assert "rejects:" in report and "figures/stability_weights.png" in report
    res = json.loads((out / "results.json").read_text())
    assert all(p["control"] and p["control_measured"] for p in res["predictions"])
    assert "eps" in (out / "configs.yaml").read_text()
    bad = CliRunner().invoke(app, ["reproduce", "heads", "--set", "heads.nope=3", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "nope" in bad.output and not (tmp_path / "x").exists()
    bad = CliRunner().invoke(app, ["reproduce", "all", "--set", "heads.beta=3", "--out", str(tmp_path / "y")])
    assert bad.exit_code == 2 and not (tmp_path / "y").exists()
    bad = CliRunner().invoke(app, ["reproduce", "edi", "--full", "--quick", "--out", str(tmp_path / "z")])
    assert bad.exit_code == 2 and "--full" in bad.output and not (tmp_path / "z").exists()


@pytest.mark.integration
def test_reproduce_full_is_deprecated_but_accepted(tmp_path):
    out = tmp_path / "sw"
    args = ["reproduce", "stability-weights", "--full", "--out", str(out), "--set", "eps=[0.1,0.03,0.01]"]
    r = CliRunner().invoke(app, [*args, "--set", "integration.t_end=1.0", "--set", "tokens.n=16"])
    assert r.exit_code in (0, 1), r.output
    assert "deprecated" in r.output and (out / "results.json").is_file()
    assert yaml.safe_load((out / "config.yaml").read_text())["quick"] is False


# slow: the heaviest default test (836 s of the 1506 s that test_reproduce, test_adaptive, test_cli, test_examples,
# test_fastsum, test_loop, test_movie and test_report took together at load 15); CI runs it (.ci/run).
@pytest.mark.integration
@pytest.mark.slow
def test_reproduce_all_quick(tmp_path):
    """The quick suite: every prediction reports a control; the well-posed ones hold with their control rejected."""
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{README_BEGIN}\nold\n{README_END}\noutro\n")
    out = tmp_path / "rep"
    r = CliRunner().invoke(app, ["reproduce", "all", "--quick", "--out", str(out), "--readme", str(readme)])
    assert r.exit_code in (0, 1), r.output
    res = json.loads((out / "results.json").read_text())
    all_ok = True
    for name in ("ou", "oscillating", "heads", "edi", "stability-input", "stability-weights"):
        folder = out / name
        assert json.loads((folder / "provenance.json").read_text())["complete"] is True
        assert (folder / "configs.yaml").is_file() and (folder / "dataset.zarr").is_dir()
        assert list((folder / "figures").glob("*.png")) and list((folder / "figures").glob("*.pdf"))
        preds = json.loads((folder / "results.json").read_text())["predictions"]
        for i, p in enumerate(preds):
            assert p["control"] and p["control_measured"], (name, i)
            all_ok &= p["passed"] and p["control_rejected"]
            if (name, i) not in CONTROL_MAY_PASS:
                assert p["control_rejected"], (name, i, p)
            if (name, i) in MUST_HOLD:
                assert p["passed"] and p["control_rejected"], (name, i, p)
    assert res["passed"] is all_ok and (r.exit_code == 0) is all_ok
    h = json.loads((out / "heads" / "results.json").read_text())["heads"]
    assert h["ratio_geometric_mean"] is not None and abs(math.log(h["ratio_geometric_mean"])) < math.log(1.2)
    assert h["ci"][0] < h["exponent"] < h["ci"][1] and -1.3 < h["exponent"] < -0.8
    assert len(h["local_exponents"]) == len(h["H"]) - 1 and h["tail"]["H"] == h["H"][-3:]
    report = (out / "report.md").read_text()
    assert report.count("rejects:") >= 14 and "negative control" in report
    assert (out / "report.html").read_text().count("data:image/png;base64,") >= 6
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "\nold\n" not in text and "| heads |" in text
    # The ou folder is a core run folder: attnflow.load reads its trajectory.
    import attnflow as af

    assert af.load(out / "ou").model == "gf"


@pytest.mark.integration
def test_reproduce_rejects_unknown_names(tmp_path):
    r = CliRunner().invoke(app, ["reproduce", "nope", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "unknown experiment" in r.output


def test_batches_needed_projects_the_interval_width_not_the_estimate():
    """The sequential design's projection: the CI's half-width, shrinking like 1/sqrt(seeds), against the
    distance an interval centred on the prediction needs from the midpoint. Closed forms; the estimate's
    location does not enter (an interval inside the margin band is still decidable by more seeds)."""
    # Half-width 0.15 must come below 0.25 x 0.9 = 0.225: (0.15 / 0.225)^2 batches.
    assert batches_needed([0.0, 0.3], 0.5, 1) == pytest.approx((0.15 / 0.225) ** 2)
    assert batches_needed([0.2, 0.6], 0.5, 2) == pytest.approx(2 * (0.2 / 0.225) ** 2)
    assert batches_needed([0.1, 0.4], 0.5, 1) == pytest.approx(
        batches_needed([0.0, 0.3], 0.5, 1)
    )  # the band: same width
    assert math.isinf(batches_needed([0.1, 0.4], -0.1, 1))  # no gap to the competing law
    assert math.isnan(batches_needed([math.nan, math.nan], 0.5, 1))  # no fit: nothing to project
    assert adds_batch(_fit_at([0.0, 0.3]), 1, 12)
    assert not adds_batch(_fit_at([0.0, 0.3]), 12, 12)  # the budget is spent
    assert not adds_batch(_fit_at([-1.0, 2.0]), 1, 12)  # 44 batches: beyond the budget
    assert not adds_batch(_fit_at([-0.1, 0.1], "pass"), 1, 12)
    nofit = _fit_at([math.nan, math.nan])
    assert adds_batch(nofit, NO_FIT_BATCHES - 1, 12) and not adds_batch(nofit, NO_FIT_BATCHES, 12)
    # The step reads the fit and leaves it as it was; with_batches records the projection explicitly.
    assert math.isnan(nofit.batches_needed)
    fit = _fit_at([0.0, 0.3])
    assert adds_batch(fit, 2, 12) and math.isnan(fit.batches_needed)
    assert fit.with_batches(2).batches_needed == pytest.approx(2 * (0.15 / 0.225) ** 2)


def _fit_at(ci: list[float], decision: Decision = "undecided", gap: float = 0.5) -> ExponentFit:
    """An :class:`ExponentFit` whose ratio has the interval ``ci`` (the only fit :func:`adds_batch` reads)."""
    tail = TailFit(np.array([]), np.array([]), math.nan, math.nan, ci, [], None, [], False)
    return ExponentFit(tail, tail, tail, tail, math.nan, gap, decision, "undecided")


def _design(law: float, rng_seed: int, noise: float = 0.3, cap: int = 12) -> tuple[ExponentFit, int]:
    """The sequential design (heads.adds_batch) on synthetic floors, batches of 8 seeds at H = 16, 32, 64
    (the same draws whatever ``cap``)."""
    Hs = np.array([16.0, 32, 64])
    floors, ab, pred, ok = _synthetic_heads(np.random.default_rng(rng_seed), Hs, 8 * 12, law, noise)
    b = 1
    while True:
        n = 8 * b
        fit = _exponent_fit(Hs, floors[:, :n], ab[:, :n], pred[:, :n], ok[:, :n], 3, 1)
        if not adds_batch(fit, b, cap):
            return fit, b
        b += 1


def test_the_design_decides_a_correct_law_whose_first_batch_landed_near_the_midpoint():
    """At the noise of a d = 3 set (log-noise 0.3 per seed), draws of a correct law (ratio exponent 0) whose first
    8 seeds landed near the midpoint (estimate 0.18 against 0.23, and 0.26 above it): a projection around the
    estimate said 17 and 31 batches and stopped them undecided (a FAIL); the width's projection goes on, and more
    seeds decide PASS. Control: the competing law planted at the same draws is never passed (it fails)."""
    for k in (1, 15):
        first = _design(0.0, k, cap=1)[0]
        mid = 0.5 * first.gap
        # Two-sided, a first batch whose interval excludes 0 is a FAIL, but not a decisive one (its interval still
        # reaches inside the window): the design goes on, as it did for the undecided one-sided verdict.
        assert first.decision in ("undecided", "fail") and first.ratio.exponent > 0.75 * mid, first.ratio
        assert not _decisive(first.ratio.ci, first.gap)
        fit, b = _design(0.0, k)
        assert fit.decision == "pass" and 1 < b <= 12, (k, b, fit.ratio.ci)
        wrong, _ = _design(0.45, k)  # floors ~ H^(-1/2) over constants ~ H^(-0.95)
        assert wrong.decision == "fail", (k, wrong.ratio.ci)
        steep, _ = _design(-0.35, k)  # floors ~ H^(-1.3): beyond the prediction on the other side
        assert steep.decision == "fail" and steep.ratio.ci[1] < 0, (k, steep.ratio.ci)
