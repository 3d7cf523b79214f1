"""``--threads`` on every command that computes, applied through ThreadPolicy (issue 31, item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.cli.threads import run_pairs, threaded
from attnflow.core.threads import SMALL_WORK_PAIRS, ThreadPolicy

COMPUTING = [
    ["sweep"],
    ["plot"],
    ["report"],
    ["movie"],
    ["edi"],
    ["bench"],
    ["hf", "run"],
    ["hf", "verify"],
    ["hf", "gf"],
]


@pytest.mark.integration
@pytest.mark.parametrize("cmd", COMPUTING, ids=" ".join)
def test_every_computing_command_has_threads(cmd: list[str]) -> None:
    out = CliRunner().invoke(app, [*cmd, "--help"], terminal_width=200).output
    assert "--threads" in out, out


def _probe_app(pairs: float) -> tuple[typer.Typer, list[int]]:
    seen: list[int] = []
    probe = typer.Typer()

    @probe.command()
    @threaded(lambda kw: pairs)
    def go(name: str = typer.Argument("x")) -> None:
        seen.append(torch.get_num_threads())

    @probe.command()
    def other() -> None:  # a second command so typer keeps the sub-command name
        pass

    return probe, seen


@pytest.mark.integration
def test_threaded_applies_the_policy_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnflow.core import threads as th

    monkeypatch.setattr(th, "load_average", lambda: 64.0)  # a busy machine: mid-sized work on one thread
    before = torch.get_num_threads()
    small, seen = _probe_app(SMALL_WORK_PAIRS / 10)
    assert CliRunner().invoke(small, ["go"]).exit_code == 0
    assert seen == [1]
    big, seen = _probe_app(SMALL_WORK_PAIRS * 10)
    assert CliRunner().invoke(big, ["go"]).exit_code == 0
    assert seen == [ThreadPolicy().for_work(SMALL_WORK_PAIRS * 10)]
    fixed, seen = _probe_app(SMALL_WORK_PAIRS * 10)
    assert CliRunner().invoke(fixed, ["go", "--threads", "1"]).exit_code == 0
    assert seen == [1]
    assert torch.get_num_threads() == before
    # negative control: a thread count of 0 is refused before the body runs
    res = CliRunner().invoke(fixed, ["go", "--threads", "0"])
    assert res.exit_code == 2 and seen == [1]


def test_run_pairs_reads_headers(tmp_path: Path) -> None:
    import json

    ds = tmp_path / "dataset.zarr"
    (ds / "x").mkdir(parents=True)
    (ds / "A").mkdir()
    (ds / "x" / ".zarray").write_text(json.dumps({"shape": [5, 300, 3]}))
    (ds / "A" / ".zarray").write_text(json.dumps({"shape": [5, 8, 3, 3]}))
    assert run_pairs(tmp_path) == 300**2 * 8
    (ds / "x" / ".zarray").write_text("{not json")
    assert run_pairs(tmp_path) == 0.0
    assert run_pairs(tmp_path / "missing") == 0.0


def test_small_work_threshold_puts_the_presets_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnflow.core import threads as th

    # the preset ou (N = 256, H = 8) is small work (one thread on a busy machine); a 4096-token,
    # 8-head run is not
    monkeypatch.setattr(th, "load_average", lambda: 64.0)
    assert ThreadPolicy().for_work(256**2 * 8) == 1
    assert 256**2 * 8 < SMALL_WORK_PAIRS <= 4096**2 * 8


def test_sweep_workers_take_the_thread_count(monkeypatch) -> None:
    from attnflow.sweep import runner

    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    base = {"id": "p0", "index": 0, "params": {}, "seed": 0, "config": {"no_such_key": 1}}
    assert runner.run_point({**base, "threads": 3})["error"]  # the bad config is recorded, not raised
    runner.run_point(base)
    assert calls == [3, 1]  # --threads 3 per worker; the default one thread per worker


def test_bench_thread_table_rows_ratios_and_verdict(monkeypatch) -> None:
    """The bench table's plumbing with stand-in work: each run sees the thread count of its column,
    the spinner is running only in the second row of each case, and the verdict reads the ratio."""
    import time as _time

    from attnflow.bench import threads as bt

    seen: list[tuple[int, int]] = []

    def work(k: int) -> None:
        seen.append((k, torch.get_num_threads()))
        _time.sleep(0.01 * k)  # a stand-in whose time grows with the threads: the policy (1) wins

    monkeypatch.setattr(bt, "_cases", lambda quick: [("preset ou (t_end 1)", 256, 8, work)])
    rows = bt.run_thread_benchmarks(quick=True)
    assert [r["beside"] for r in rows] == ["nothing", "a spinning process"]
    assert all(k == n for k, n in seen)  # torch's count is the column's
    assert rows[0]["policy_threads"] == 1 and rows[0]["default_threads"] >= 1
    md = bt.thread_markdown(rows)
    assert md.count("\n| preset ou") == 2 and "PASS: preset ou beside a spinning process" in md
    # negative control: a policy time twice the one-thread time fails the 1.5 target
    bad = [dict(r, policy_s=2 * r["one_s"]) for r in rows]
    assert bt.thread_verdict(bad).startswith("FAIL")
