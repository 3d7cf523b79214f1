"""Sweeps on real Dask clusters: a LocalCluster with a worker killed mid-sweep, and a separately
started ``dask scheduler`` + ``dask worker`` reached through ``--scheduler``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

distributed = pytest.importorskip("distributed")
pd = pytest.importorskip("pandas")

import attnflow  # noqa: E402
from attnflow.cli.main import app  # noqa: E402
from attnflow.sweep.runner import run_sweep  # noqa: E402
from attnflow.sweep.table import POINTS, load_sweep_results  # noqa: E402

pytestmark = pytest.mark.integration

# 12 points of ~0.05 s each (on an idle core), batches of 2: long enough to kill a worker in the middle.
SWEEP = {
    "name": "tiny",
    "base": "ou",
    "set": {
        "tokens.n": 12,
        "heads.count": 2,
        "integration.t_end": 0.6,
        "integration.dt": 0.02,
        "integration.save_every": 5,
        "diagnostics.cluster_eps": 0.01,
    },
    "grid": {"product": {"heads.beta": [1.0, 4.0], "weights.sigma": [0.5, 1.0]}},
    "seeds": 3,
    "batch": 2,
}
SRC = str(Path(attnflow.__file__).resolve().parents[1])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="module")
def sweep_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("sweep") / "tiny.yaml"
    p.write_text(yaml.safe_dump(SWEEP))
    return p


@pytest.fixture(scope="module")
def cluster():
    """A real LocalCluster: two worker processes, each under a nanny that restarts it when killed."""
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50
    ) as c:
        yield c


@pytest.fixture(scope="module")
def killed_run(cluster, sweep_file, tmp_path_factory):
    """Run the sweep on the 2-worker LocalCluster and SIGKILL a busy worker once a point has finished."""
    out = tmp_path_factory.mktemp("local") / "out"
    client = distributed.Client(cluster)
    info: dict = {"killed": None, "before": {}}

    def on_progress(ok: int, failed: int, total: int) -> None:
        if info["killed"] is None and ok >= 1:
            busy = [w for w, keys in client.processing().items() if keys]
            if not busy:
                return
            pid = client.run(os.getpid, workers=[busy[0]])[busy[0]]
            # Everything finished so far, with its exact bytes: none of it may be lost or redone.
            info["before"] = {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in (out / POINTS).glob("*.json")}
            info["remaining_at_kill"] = total - ok - failed
            os.kill(pid, signal.SIGKILL)
            info["killed"] = pid

    try:
        report = run_sweep(sweep_file, out, client=client, on_progress=on_progress)
    finally:
        client.close()
    return out, report, info


def test_killing_a_worker_loses_no_finished_point_and_the_sweep_completes(killed_run):
    out, report, info = killed_run
    assert info["killed"] is not None, "no worker was busy when the first point finished"
    assert info["remaining_at_kill"] > 0
    with pytest.raises(ProcessLookupError):
        os.kill(info["killed"], 0)
    assert (report.total, report.ran, report.ok, report.failed) == (12, 12, 12, 0)
    table = load_sweep_results(out)
    assert len(table) == 12 and set(table["status"]) == {"ok"}
    assert sorted(zip(table["heads.beta"], table["weights.sigma"], table["seed"])) == sorted(
        (b, s, k) for b in (1.0, 4.0) for s in (0.5, 1.0) for k in range(3)
    )
    assert np.isfinite(table["energy_end"]).all() and (table["clusters_end"] >= 1).all()
    for name, (data, mtime) in info["before"].items():
        f = out / POINTS / name
        assert f.read_bytes() == data and f.stat().st_mtime_ns == mtime
    ts = load_sweep_results(out, timeseries=True)
    assert len(ts) == 12 * 7  # 30 steps saved every 5, plus t = 0


def test_a_second_run_does_no_work_and_needs_no_cluster(killed_run, sweep_file):
    out, _, _ = killed_run
    before = {f.name: f.stat().st_mtime_ns for f in (out / POINTS).glob("*.json")}
    # An unreachable scheduler: the run would fail if it tried to start any task.
    report = run_sweep(sweep_file, out, scheduler="tcp://127.0.0.1:9")
    assert (report.skipped, report.ran, report.ok) == (12, 0, 12)
    assert {f.name: f.stat().st_mtime_ns for f in (out / POINTS).glob("*.json")} == before


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 60) -> None:
    end = time.time() + seconds
    while not path.exists():
        if proc.poll() is not None or time.time() > end:
            raise RuntimeError(f"dask process exited or timed out (rc={proc.poll()})")
        time.sleep(0.2)


def test_scheduler_option_sends_the_sweep_to_a_separately_started_cluster(killed_run, sweep_file, tmp_path):
    from typer.testing import CliRunner

    dask_cli = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    sched_file = tmp_path / "scheduler.json"
    procs = []
    try:
        procs.append(
            subprocess.Popen(
                dask_cli
                + ["--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", str(sched_file)],
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        _wait_for(sched_file, procs[0])
        address = yaml.safe_load(sched_file.read_text())["address"]
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    address,
                    "--nthreads",
                    "1",
                    "--nworkers",
                    "1",
                    "--no-dashboard",
                    "--no-nanny",
                    "--host",
                    "127.0.0.1",
                ],
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        with distributed.Client(address, timeout="30s") as c:
            c.wait_for_workers(1, timeout=60)
            assert c.run(os.getpid)  # the worker is a separate process on loopback
        out = tmp_path / "remote"
        r = CliRunner().invoke(app, ["sweep", str(sweep_file), "--out", str(out), "--scheduler", address])
        assert r.exit_code == 0, r.output
        assert "12 run now; 12 ok, 0 failed" in " ".join(r.output.split())
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    local, remote = load_sweep_results(killed_run[0]), load_sweep_results(out)
    pids = {json.loads(f.read_text())["pid"] for f in (out / POINTS).glob("*.json")}
    assert os.getpid() not in pids
    drop = ["wall_s"]
    pd.testing.assert_frame_equal(local.drop(columns=drop), remote.drop(columns=drop), check_exact=False, rtol=1e-12)
    pd.testing.assert_frame_equal(
        load_sweep_results(killed_run[0], timeseries=True),
        load_sweep_results(out, timeseries=True),
        check_exact=False,
        rtol=1e-12,
    )


def test_failed_points_are_recorded_and_the_cli_exits_1(cluster, tmp_path):
    """A point that raises is a row with its error and the sweep goes on; --retry-failed runs it again."""
    from typer.testing import CliRunner

    spec = {
        **SWEEP,
        "set": {**SWEEP["set"], "integration.t_end": 0.2, "tokens.path": str(tmp_path / "x.npy")},
        "grid": {"product": {"tokens.init": ["uniform", "file"]}},
        "seeds": 1,
    }
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    address = cluster.scheduler_address
    r = CliRunner().invoke(app, ["sweep", str(f), "--out", str(out), "--scheduler", address])
    assert r.exit_code == 1, r.output
    table = load_sweep_results(out)
    assert list(table["status"]) == ["ok", "failed"]
    assert "x.npy" in table["error"][1]
    # The token file now exists: retrying the failed point succeeds, the finished one is not redone.
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(SWEEP["set"]["tokens.n"], 3)))
    report = run_sweep(f, out, scheduler=address, retry_failed=True)
    assert (report.skipped, report.ran, report.ok, report.failed) == (1, 1, 2, 0)


@pytest.mark.slow
def test_quick_example_through_the_cli_on_the_default_local_cluster(tmp_path):
    """The acceptance run: examples/sweep_quick.yaml writes the table; running it again simulates nothing."""
    from typer.testing import CliRunner

    example = Path(__file__).resolve().parents[2] / "examples" / "sweep_quick.yaml"
    out = tmp_path / "quick"
    start = time.perf_counter()
    r = CliRunner().invoke(app, ["sweep", str(example), "--out", str(out), "--workers", "2"])
    assert r.exit_code == 0, r.output
    assert time.perf_counter() - start < 120
    table = load_sweep_results(out)
    assert len(table) >= 12 and set(table["status"]) == {"ok"}
    r = CliRunner().invoke(app, ["sweep", str(example), "--out", str(out), "--workers", "2"])
    assert r.exit_code == 0 and f"{len(table)} already finished, 0 run now" in " ".join(r.output.split())
