"""Issue 28, ``ou`` row #2 (the cloud settles) is sequential (:func:`relaxation.settle_row`): its control is the
oscillating law at ``omega_c = min(omega, g)`` (a pace the cluster can follow), and an undecided look continues both
runs and judges them again; a moving cloud stays a FAIL at every look."""

import numpy as np
import pytest

from attnflow.experiments import experiment_config, relaxation
from attnflow.experiments.common import MIN_MARGIN
from attnflow.experiments.floors import Window
from attnflow.experiments.relaxation import SettleStage, Settling, control_frequency

#: A small, fast configuration (d = 3, a clear spectral gap: g > omega, the drawn run is the control).
SMALL = ["tokens.n=24", "heads.count=8", "integration.t_end=8", "law.paths=2000", "law.t_ends=[4, 8]"]
#: ``--random-sets 20 --seed 4`` set 5 (d = 2, H = 8, run at seed 4): the cluster's g = 0.518 < omega = 0.956, the
#: drawn oscillating run stays within 0.38 of the bound (no power), the run at omega_c = g does not.
SLOW = [
    "heads.spectrum=[2.033, 1.51]",
    "heads.variety=0.055",
    "heads.count=8",
    "ou.rate=0.679",
    "ou.sigma=0.279",
    "ou.init_spread=2.379",
    "oscillating.amplitude=1.885",
    "oscillating.omega=0.956",
]


@pytest.fixture(autouse=True)
def _fresh_cache():
    relaxation._settle_row_cached.cache_clear()
    yield
    relaxation._settle_row_cached.cache_clear()


def _stage(ratio_ou: float, ratio_c: float, *, ok: bool = True, clusters: int = 1, antipodal: bool = False):
    win = Window(10.0, 20.0 if ok else 10.5, 2.0)
    return SettleStage(
        20.0, 1.0, 2.0, win, 5.0, np.ones(4), 1.0, Settling(ratio_ou, 0.0, 0.5), Settling(ratio_c, 0.0, 0.5),
        clusters, antipodal,
    )  # fmt: skip


def test_an_undecided_look_is_named_and_a_decided_one_is_not():
    # Decided: a clear PASS (control rejected), a clear FAIL of one cluster, a clear FAIL of an antipodal pair.
    assert relaxation._undecided(_stage(0.5, 2.0)) == ""
    assert relaxation._undecided(_stage(1.5, 2.0)) == ""
    assert relaxation._undecided(_stage(1.5, 2.0, clusters=2, antipodal=True)) == ""
    assert relaxation._undecided(_stage(0.5, 0.5)) == ""  # control without power: decided, no second look
    # Undecided: a short window, either ratio within MIN_MARGIN of the bound, a FAIL at a saddle (2 clusters).
    assert "window" in relaxation._undecided(_stage(0.5, 2.0, ok=False))
    for r in (1.0 - 0.5 * MIN_MARGIN, 1.0 + 0.5 * MIN_MARGIN):
        assert "minimum margin" in relaxation._undecided(_stage(r, 2.0))
        assert "control" in relaxation._undecided(_stage(0.5, r))
    assert "saddle" in relaxation._undecided(_stage(1.5, 2.0, clusters=2))
    assert control_frequency(0.5, 1.0) == 0.5 and control_frequency(2.0, 1.0) == 1.0


def test_the_control_runs_at_omega_c_only_where_g_is_below_omega_and_has_the_power_the_drawn_one_lacks():
    fast = experiment_config("ou", quick=True, sets=SMALL)
    sq, st = relaxation.settle_row(fast, 0), relaxation._settle(fast, 0)
    g = 1.0 / relaxation._run_length(fast, 0).tau_slow
    assert g > float(fast["oscillating"]["omega"]) and not sq["powered"]
    assert sq["omega_c"] == float(fast["oscillating"]["omega"])
    assert sq["stages"][0].control.ratio == st["oscillating"].ratio  # the drawn run itself
    slow = experiment_config("ou", quick=True, sets=SLOW)
    sq, st = relaxation.settle_row(slow, 4), relaxation._settle(slow, 4)
    g = 1.0 / relaxation._run_length(slow, 4).tau_slow
    assert sq["powered"] and sq["omega_c"] == pytest.approx(g) and g < float(slow["oscillating"]["omega"])
    # The negative control of the old control: on look 0's window and wander the drawn run stays within the bound
    # (no power) and the run at omega_c is rejected with the margin. (This set ends in an antipodal pair whose
    # slowest mode, 1/0.448, is slower than the cluster's 1/g: look 0's window holds less than it, so the row
    # continues once; the control keeps its power there and the OU run settles.)
    look0, fin = sq["stages"][0], sq["final"]
    drawn = relaxation.settling(relaxation._runs(slow, 4)[0]["oscillating"], look0.window.start, look0.wander)
    assert drawn.ratio < 1.0 - MIN_MARGIN < 1.0 + MIN_MARGIN < look0.control.ratio
    assert look0.antipodal and look0.tau_slow > 1.0 / g and fin.window.ok
    assert fin.control.ratio > 1.0 + MIN_MARGIN and fin.ou.ratio < 1.0 - MIN_MARGIN


def test_the_row_continues_only_while_undecided_and_stops_at_a_decision(monkeypatch):
    cfg = experiment_config("ou", quick=True, sets=SMALL)
    sq = relaxation.settle_row(cfg, 0)
    assert len(sq["stages"]) == 1 and relaxation._undecided(sq["final"]) == ""  # decided at once: no continuation
    first = sq["final"]
    relaxation._settle_row_cached.cache_clear()
    calls = []
    real = relaxation._undecided

    def once(stage):  # the first look planted undecided, the rest judged by the rule
        calls.append(stage.T)
        return "planted" if len(calls) == 1 else real(stage)

    monkeypatch.setattr(relaxation, "_undecided", once)
    sq = relaxation.settle_row(cfg, 0)
    looks = sq["stages"]
    assert len(looks) == 2 and looks[0].undecided == "planted" and looks[1].undecided == ""
    assert looks[1].T == pytest.approx(2.0 * first.T, abs=0.11)  # doubled (to the save grid)
    # The second look: a later window, replicas restarted for it, the same control frequency.
    assert looks[1].window.start >= first.T - 1e-9 and looks[1].replicas_from > first.replicas_from
    assert sq["ou_traj"].t[-1] == pytest.approx(looks[1].T) and sq["control_traj"].t[-1] == pytest.approx(looks[1].T)
    assert looks[1].ou.ratio < 1.0 - MIN_MARGIN < 1.0 + MIN_MARGIN < looks[1].control.ratio


def test_continuation_does_not_turn_a_moving_cloud_into_a_pass(monkeypatch):
    """Negative control: every look forced (undecided), the control (oscillating weights at omega_c: a cloud that keeps
    moving) fails the same settling check at every look, with each look's own window and wander."""
    monkeypatch.setattr(relaxation, "_undecided", lambda stage: "planted")
    cfg = experiment_config("ou", quick=True, sets=[*SLOW, "tokens.n=24"])
    sq = relaxation.settle_row(cfg, 4)
    looks = sq["stages"]
    assert len(looks) == relaxation.SETTLE_CONTINUATIONS + 1
    assert all(b.T > a.T and b.window.start > a.window.start for a, b in zip(looks, looks[1:]))
    for look in looks:
        assert look.control.ratio > 1.0 + MIN_MARGIN, (look.T, look.control.text())
