"""The thread policy reads the load average as well as the work size, and says what it chose (issue 43)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import attnflow as af
from attnflow.core import threads as th
from attnflow.core.threads import SMALL_WORK_PAIRS, THREADED_MIN_PAIRS, ThreadPolicy

MID = 1024**2 * 4  # the N = 1024, H = 4: between the two thresholds


def _machine(monkeypatch: pytest.MonkeyPatch, cores: int, load: float | None) -> None:
    monkeypatch.setattr(th, "available_cores", lambda: cores)
    monkeypatch.setattr(th, "load_average", lambda: load)


def test_idle_cores_get_the_work_busy_ones_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(monkeypatch, 2, 0.1)
    idle = ThreadPolicy().choose(MID)
    assert idle.threads == 2 and "idle" in idle.reason and idle.load == 0.1
    _machine(monkeypatch, 2, 1.6)  # negative control: a CPU-bound process beside us
    busy = ThreadPolicy().choose(MID)
    assert busy.threads == 1 and "busy" in busy.reason
    _machine(monkeypatch, 16, 6.2)  # partly busy: the idle cores, rounded
    assert ThreadPolicy().choose(MID).threads == 10
    _machine(monkeypatch, 16, 40.0)  # overloaded: still one thread, never zero
    assert ThreadPolicy().choose(MID).threads == 1


def test_size_thresholds_and_fixed_counts_ignore_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(monkeypatch, 4, 0.0)
    assert ThreadPolicy().choose(THREADED_MIN_PAIRS / 2).threads == 1  # tiny work: one thread even when idle
    assert ThreadPolicy().choose(THREADED_MIN_PAIRS).threads == 4
    _machine(monkeypatch, 4, 8.0)
    assert ThreadPolicy().choose(SMALL_WORK_PAIRS).threads == 4  # large work: the cores
    assert ThreadPolicy(3).choose(MID).threads == 3
    assert ThreadPolicy(3).choose(MID).reason == "fixed: threads=3"
    _machine(monkeypatch, 4, None)  # no load average: the safe side
    assert ThreadPolicy().choose(MID).threads == 1


def test_a_run_says_what_it_chose(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    x0 = np.random.default_rng(0).standard_normal((8, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    A = np.eye(3)[None]
    _machine(monkeypatch, 2, 1.7)
    with caplog.at_level(logging.INFO, logger="attnflow.solve.solver"):
        tr = af.simulate(x0, A, t_end=0.02, dt=0.01, threads=2)
    assert tr.provenance["threads"]["threads"] == 2 and tr.provenance["threads"]["reason"] == "fixed: threads=2"
    assert any("threads: fixed: threads=2" in r.getMessage() for r in caplog.records)
    tr = af.simulate(x0, A, t_end=0.02, dt=0.01)
    assert tr.provenance["threads"]["threads"] == 1 and "small work" in tr.provenance["threads"]["reason"]


def test_the_choice_is_capped_by_torchs_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnflow.solve.problem import thread_choice

    _machine(monkeypatch, 8, 0.0)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        c = thread_choice(None, MID)
        assert c.threads == 2 and "capped" in c.reason
        assert thread_choice(5, MID).threads == 5  # an explicit count is not capped
    finally:
        torch.set_num_threads(before)
