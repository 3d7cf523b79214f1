"""Run a sweep on Dask: batches of points as tasks, each point's record written as it finishes.

The driver (:func:`run_sweep`) expands the sweep file, skips points that already have a record,
groups the rest into batches (several small simulations in one task keep the scheduler's
per-task overhead small) and submits them to a ``dask.distributed`` cluster: an embedded
``LocalCluster`` by default, or any running scheduler. Fault tolerance comes from Dask: a task
whose worker dies is rescheduled on another worker, and a retried batch skips the points that
its first attempt already wrote. A point that raises is recorded with its error and the sweep
goes on.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from attnflow.config import ConfigError, parse_config
from attnflow.core.errors import Hint
from attnflow.core.threads import ThreadPolicy
from attnflow.io.lock import output_lock
from attnflow.io.safety import atomic_write, refuse_link
from attnflow.io.store import folder_kind, mark_folder, what_it_is
from attnflow.runs import run_config
from attnflow.solve.preflight import Estimate, preflight, sweep_estimate
from attnflow.sweep.spec import SweepPoint, SweepSpec, load_sweep, sweep_points
from attnflow.sweep.table import (
    POINTS,
    SPEC,
    TRAJECTORIES,
    assemble,
    finished_ids,
    point_path,
    read_record,
    write_record,
)


@dataclass
class SweepReport:
    """What one :func:`run_sweep` call did: ``ran`` points simulated now, ``skipped`` already finished."""

    total: int
    skipped: int
    ran: int
    ok: int
    failed: int
    results: Path
    wall_s: float

    def _repr_html_(self) -> str:
        from attnflow.core.html import html_table

        return html_table(
            "SweepReport",
            [
                ("points", f"{self.total}: {self.skipped} already finished, {self.ran} run now"),
                ("ok, failed", f"{self.ok}, {self.failed}"),
                ("results table", self.results),
                ("wall time (s)", self.wall_s),
            ],
        )


def require_sweep_extra() -> None:
    """Fail with an install hint when the optional Dask/Parquet dependencies are missing."""
    import importlib.util

    missing = [m for m in ("distributed", "pandas", "pyarrow") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"sweeps need {', '.join(missing)}, which is not installed; install them with "
            "pip install 'attnflow[sweep]' (dask[distributed], pandas, pyarrow)."
        )


def run_point(point: dict[str, Any], out: str | None = None, keep_trajectory: bool = False) -> dict[str, Any]:
    """Simulate one point (a :class:`SweepPoint` as a dict) and return its record; never raises.

    With ``out`` a folder this process can see, the record is written there atomically at once.
    """
    import torch

    # One worker process per core: intra-op threads would only oversubscribe the machine (the
    # default; run_sweep(threads=k) gives each worker k).
    torch.set_num_threads(int(point.get("threads") or 1))
    record: dict[str, Any] = {
        "point": point["id"],
        "index": point["index"],
        "params": point["params"],
        "seed": point["seed"],
        "config": point["config"],
        "host": platform.node(),
        "pid": os.getpid(),
        "error": None,
        "trajectory": None,
    }
    start = time.perf_counter()
    try:
        cfg = parse_config(point["config"], f"of sweep point {point['index']}")
        traj = run_config(cfg)
        record["t"] = traj.t.tolist()
        record["diagnostics"] = {k: v.tolist() for k, v in traj.diagnostics.items()}
        if keep_trajectory and out is not None:
            rel = f"{TRAJECTORIES}/{point['id']}"
            traj.save(Path(out) / rel, overwrite=True, figures=False)
            record["trajectory"] = rel
        record["status"] = "ok"
    except Exception as e:
        record["status"] = "failed"
        record["error"] = f"{type(e).__name__}: {e}"
    record["wall_s"] = time.perf_counter() - start
    if out is not None and (Path(out) / POINTS).is_dir():
        write_record(Path(out), record)
    return record


def run_batch(points: list[dict[str, Any]], out: str | None = None, keep_trajectories: bool = False) -> list[dict]:
    """Run several points one after the other in one task, skipping those already recorded.

    A retried batch (its first worker died) thus redoes only the points that had not finished.
    """
    records = []
    for p in points:
        done = read_record(Path(out), p["id"]) if out is not None else None
        if done is not None and done.get("status") == "ok":
            records.append(done)
        else:
            records.append(run_point(p, out, keep_trajectories))
    return records


def _payload(p: SweepPoint, threads: int | None = None) -> dict[str, Any]:
    return {"id": p.id, "index": p.index, "params": p.params, "seed": p.seed, "config": p.config, "threads": threads}


def batch_size(spec_batch: int | str, n_pending: int, n_workers: int) -> int:
    """Points per task: the sweep's ``batch``, or ``auto`` = about four tasks per worker."""
    if spec_batch != "auto":
        return int(spec_batch)
    return max(1, math.ceil(n_pending / (4 * max(1, n_workers))))


def _start_client(scheduler: str | None, workers: int | None):
    """A client of the cluster at ``scheduler``, or of a new LocalCluster with ``workers`` processes."""
    from distributed import Client, LocalCluster

    if scheduler is not None:
        try:
            return Client(scheduler, timeout="10s"), None
        except (OSError, TimeoutError) as e:
            raise ConfigError(
                f"cannot reach the Dask scheduler at {scheduler!r} ({e}); start one with 'dask scheduler' and "
                "'dask worker ADDRESS', then pass its tcp://host:port address."
            ) from None
    n = workers or max(1, min(os.cpu_count() or 1, 8))
    cluster = LocalCluster(
        n_workers=n,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.ERROR,
    )
    return Client(cluster), cluster


def run_sweep(
    sweep: SweepSpec | str | os.PathLike,
    out: str | os.PathLike,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    batch: int | None = None,
    retry_failed: bool = False,
    client=None,
    on_progress: Callable[[int, int, int], None] | None = None,
    root: Path | None = None,
    confirm: Callable[[Estimate], None] | None = None,
    on_points: Callable[[int, int], None] | None = None,
    threads: int | None = None,
) -> SweepReport:
    """Run every unfinished point of ``sweep`` on Dask and write the tables under ``out``.

    ``sweep``: a :class:`SweepSpec` or a sweep YAML path. ``scheduler``: a Dask scheduler address
    (default: an embedded ``LocalCluster`` with ``workers`` processes); ``client``: an existing
    ``distributed.Client`` instead. ``batch`` overrides the sweep's points per task.
    ``retry_failed`` re-runs points recorded as failed. ``on_progress(ok, failed, total)`` is
    called as points finish, ``on_points(k, n)`` as the points are built and validated (before any
    runs; a sweep has at most :data:`attnflow.sweep.spec.MAX_POINTS`). Finished points are skipped, so calling it again resumes.
    ``threads``: torch threads per worker (default 1: the local cluster has a worker per core).
    Before anything is written, the pre-flight estimate of the unfinished points
    (:func:`attnflow.solve.preflight.sweep_estimate`) refuses a sweep whose points cannot fit in
    memory and is handed to ``confirm`` (which may raise to stop a heavy sweep).
    """
    if scheduler is not None and workers is not None:
        raise ConfigError(
            "workers= sizes the embedded local cluster; with scheduler= the workers of that cluster run the sweep.",
            hint=Hint("workers"),
        )
    require_sweep_extra()
    ThreadPolicy(threads)  # validates it before anything starts
    if isinstance(sweep, SweepSpec):
        spec = sweep
    else:
        spec, root = load_sweep(sweep)
    points = sweep_points(spec, root, progress=on_points)
    shown = str(out)
    out = Path(out).resolve()
    kind = folder_kind(out)
    if kind not in ("missing", "empty", "sweep"):
        # One ownership rule: a sweep continues only in its own folder (recognised by its manifest);
        # a folder of the user's files (a sweep.yaml, a results.parquet of their own) is never written.
        raise ConfigError(
            f"out={shown!r} is {what_it_is(out)}, not an attnflow sweep folder; attnflow will not write into it. "
            "Give a new folder (or the folder of the same sweep, to continue it).",
            hint=Hint("out"),
        )
    if kind == "sweep":
        _refuse_links(out)
    done = finished_ids(out) if out.is_dir() else set()
    n_workers = workers or (1 if scheduler is not None or client is not None else max(1, min(os.cpu_count() or 1, 8)))
    est = preflight(
        sweep_estimate([p.config for p in points if p.id not in done], n_workers),
        what=f"this sweep ({len(points)} points)",
    )
    if confirm is not None:
        confirm(est)
    owned = None
    if client is None and scheduler is not None and (retry_failed or any(p.id not in done for p in points)):
        # Reach the scheduler before anything is written: an unreachable one leaves no folder behind.
        client, _ = _start_client(scheduler, None)
        owned = client
    try:
        with output_lock(out, what="sweep folder"):
            return _run_locked(spec, points, out, scheduler, workers, batch, retry_failed, client, on_progress, threads)
    finally:
        if owned is not None:
            owned.close()


def _refuse_links(out: Path) -> None:
    """Refuse a link planted where the sweep writes: in ``out`` itself and in ``out/points`` (the run
    folders under ``trajectories/`` are written atomically, never through a link, see
    :func:`attnflow.io.store.atomic_folder`)."""
    for folder in (out, out / POINTS):
        if folder.is_dir() and not folder.is_symlink():
            with os.scandir(folder) as entries:
                for entry in entries:
                    refuse_link(entry.path, "sweep file")
        else:
            refuse_link(folder, "points folder")


def _run_locked(
    spec, points, out, scheduler, workers, batch, retry_failed, client, on_progress, threads=None
) -> SweepReport:
    """:func:`run_sweep` once the output lock of ``out`` is held."""
    (out / POINTS).mkdir(parents=True, exist_ok=True)
    refuse_link(out / POINTS, "points folder")
    mark_folder(out, "sweep")
    with atomic_write(out / SPEC) as fh:
        fh.write(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))

    start = time.perf_counter()
    by_id = {p.id: p for p in points}
    status: dict[str, str] = {}
    for pid in finished_ids(out) & by_id.keys():
        rec = read_record(out, pid)
        if rec is not None:
            status[pid] = rec["status"]
    skip = {pid for pid, s in status.items() if s == "ok" or (s == "failed" and not retry_failed)}
    for pid in set(status) - skip:
        # A failed point to retry: its old record goes, so that progress counts the new attempt.
        del status[pid]
        point_path(out, pid).unlink(missing_ok=True)
    pending = [p for p in points if p.id not in skip]

    last: list[tuple[int, int]] = []

    def report_progress() -> None:
        vals = list(status.values())
        counts = (vals.count("ok"), vals.count("failed"))
        if on_progress is not None and (not last or counts != last[-1]):
            last.append(counts)
            on_progress(*counts, len(points))

    report_progress()
    try:
        if pending:
            _run_pending(spec, pending, out, status, scheduler, workers, batch, client, report_progress, threads)
    finally:
        # Also after an interrupt: the tables then show what finished, the rest as pending.
        assemble(out, points, spec.summary.window)
    vals = [status.get(p.id, "pending") for p in points]
    return SweepReport(
        total=len(points),
        skipped=len(skip),
        ran=len(pending),
        ok=vals.count("ok"),
        failed=vals.count("failed"),
        results=out,
        wall_s=time.perf_counter() - start,
    )


def _run_pending(spec, pending, out, status, scheduler, workers, batch, client, report_progress, threads=None) -> None:
    from distributed import wait

    own = client is None
    cluster = None
    if own:
        client, cluster = _start_client(scheduler, workers)
    try:
        n_workers = len(client.scheduler_info(n_workers=-1)["workers"]) or 1
        size = batch or batch_size(spec.batch, len(pending), n_workers)
        batches = [pending[i : i + size] for i in range(0, len(pending), size)]
        futures = {
            client.submit(
                run_batch,
                [_payload(p, threads) for p in b],
                str(out),
                spec.keep_trajectories,
                key=f"attnflow-sweep-{b[0].id}-{len(b)}",
                retries=spec.retries,
                pure=False,
            ): b
            for b in batches
        }
        ids = {p.id for p in pending}
        waiting = set(futures)
        while waiting:
            try:
                done, not_done = wait(list(waiting), timeout=0.5, return_when="FIRST_COMPLETED")
            except TimeoutError:
                done, not_done = set(), waiting
            waiting = set(not_done)
            for fut in done:
                _collect(fut, futures[fut], out, status)
            # Workers write each record as its point finishes, before their batch returns: count those too.
            for pid in (finished_ids(out) & ids) - status.keys():
                rec = read_record(out, pid)
                if rec is not None:
                    status[pid] = rec["status"]
            report_progress()
    finally:
        if own:
            client.close()
            if cluster is not None:
                cluster.close()


def _collect(fut, batch: list[SweepPoint], out: Path, status: dict[str, str]) -> None:
    """Store a finished task's records (when its workers could not see ``out``) or record its failure."""
    try:
        records = fut.result()
    except Exception as e:
        records = []
        for p in batch:
            rec = read_record(out, p.id)
            if rec is None:
                rec = {
                    **_payload(p),
                    "point": p.id,
                    "status": "failed",
                    "error": f"{type(e).__name__}: {e}",
                    "wall_s": math.nan,
                    "trajectory": None,
                }
                rec.pop("id")
                write_record(out, rec)
            records.append(rec)
    for rec in records:
        if read_record(out, rec["point"]) is None:
            write_record(out, rec)
        status[rec["point"]] = rec["status"]
