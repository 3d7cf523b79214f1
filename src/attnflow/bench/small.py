"""Small clouds, long times: attnflow's adaptive steps against SciPy's DOP853 on a plain NumPy field.

The problem of the public simulators' metastability studies: model ``mha``, one head, ``A = beta I``,
``V = I`` (``beta = 9``), ``N`` tokens uniform on ``S^2``, ``t = 0 .. 30``, one save at the end.
Every solver runs at the same ``rtol``/``atol`` in one process, side by side; the table gives each
one's field evaluations and wall time, their ratios to SciPy's, and how far its final state lies
from SciPy's (all solvers reach the same state to far below the tolerance's scale, or the row says
not). torchdiffeq is timed too when it is installed (it is not a dependency).

A second table: ``B`` seeds of ``N = 32`` to ``t = 1000`` as one adaptive ensemble
(:func:`attnflow.simulate_ensemble`, every member with its own step control) against a loop of
single runs, both through the compiled small-cloud step, and against single runs through the torch
kernel (the path every small run took before the compiled step; timed on a few seeds and scaled).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from attnflow.core.heads import Heads

SMALL_HEADER = ["N", "solver", "evaluations", "x scipy evals", "wall (s)", "x scipy wall", "max |x - x_scipy|"]
ENSEMBLE_HEADER = ["how", "runs", "wall (s)", "x ensemble", "evaluations"]

BETA = 9.0
RTOL, ATOL = 1e-10, 1e-12


def _cloud(N: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((N, 3))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _numpy_field(N: int, beta: float) -> Callable[[float, np.ndarray], np.ndarray]:
    """The field as a researcher writes it in NumPy (what ``solve_ivp`` integrates)."""

    def f(t: float, y: np.ndarray) -> np.ndarray:
        x = y.reshape(N, 3)
        s = beta * (x @ x.T)
        s -= s.max(axis=1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=1, keepdims=True)
        u = p @ x
        return (u - (u * x).sum(axis=1, keepdims=True) * x).ravel()

    return f


def _heads(beta: float) -> Heads:
    return Heads(K=torch.tensor(beta * np.eye(3)[None]), V=torch.tensor(np.eye(3)[None]))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def compare_small(N: int, t_end: float = 30.0, beta: float = BETA) -> list[dict[str, Any]]:
    """The rows of one cloud size: scipy DOP853, torchdiffeq dopri5 (if installed), attnflow dop853."""
    from scipy.integrate import solve_ivp

    from attnflow.solve.simulation import simulate

    x0 = _cloud(N)
    f = _numpy_field(N, beta)
    kw: dict[str, Any] = dict(model="mha", t_end=t_end, dt=0.01, method="dop853", rtol=RTOL, atol=ATOL)
    simulate(x0, _heads(beta), **{**kw, "t_end": 0.05, "save_every": 5})  # compile and warm up
    t = time.perf_counter()
    sol = solve_ivp(f, (0.0, t_end), x0.ravel(), method="DOP853", rtol=RTOL, atol=ATOL)
    t_scipy = time.perf_counter() - t
    ref = _unit(sol.y[:, -1].reshape(N, 3))
    rows: list[dict[str, Any]] = [
        {"N": N, "solver": "scipy DOP853 (numpy field)", "evaluations": int(sol.nfev), "wall_s": t_scipy}
    ]
    try:
        import torchdiffeq  # type: ignore[import-not-found]
    except ImportError:
        torchdiffeq = None
    if torchdiffeq is not None:  # pragma: no cover - optional
        count = [0]
        xt = torch.from_numpy(x0.ravel())

        def g(t_: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            count[0] += 1
            return torch.from_numpy(f(0.0, y.numpy()))

        t = time.perf_counter()
        ys = torchdiffeq.odeint(g, xt, torch.tensor([0.0, t_end], dtype=torch.float64), rtol=RTOL, atol=ATOL)
        rows.append(
            {"N": N, "solver": "torchdiffeq dopri5", "evaluations": count[0], "wall_s": time.perf_counter() - t,
             "x_end": _unit(ys[-1].numpy().reshape(N, 3))}
        )  # fmt: skip
    t = time.perf_counter()
    tr = simulate(x0, _heads(beta), **kw, save_every=int(round(t_end / 0.01)))
    rows.append(
        {"N": N, "solver": "attnflow dop853" + (" (compiled)" if tr.provenance["adaptive"].get("compiled") else ""),
         "evaluations": int(tr.provenance["adaptive"]["field_evaluations"]), "wall_s": time.perf_counter() - t,
         "x_end": tr.x[-1]}
    )  # fmt: skip
    for r in rows:
        r["evals_ratio"] = r["evaluations"] / rows[0]["evaluations"]
        r["wall_ratio"] = r["wall_s"] / t_scipy
        x_end = r.pop("x_end", ref)
        r["diff"] = float(np.abs(x_end - ref).max())
    return rows


def compare_ensemble(B: int = 100, N: int = 32, t_end: float = 1000.0, torch_runs: int = 3) -> list[dict[str, Any]]:
    """``B`` seeds as one adaptive ensemble (threads automatic, and on every core), as ``B`` compiled
    single runs, (timed on ``torch_runs`` seeds, scaled to ``B``) as single runs through the torch
    kernel, and the arithmetic floor: the ensemble's evaluations times one compiled field evaluation
    in a tight compiled loop."""
    from attnflow.core.threads import available_cores
    from attnflow.kernels import small
    from attnflow.solve.ensemble import ensemble_threads, simulate_ensemble
    from attnflow.solve.simulation import simulate

    X = _unit(np.random.default_rng(1).standard_normal((B, N, 3)))
    heads = _heads(BETA)
    kw: dict[str, Any] = dict(model="mha", t_end=t_end, dt=0.1, save_every=int(round(t_end / 0.1)), method="dop853", rtol=1e-8,
              atol=1e-10)  # fmt: skip
    simulate_ensemble(X[:2], heads, **{**kw, "t_end": 0.5, "save_every": 5})
    auto = ensemble_threads(None, B, N, 1, 13)
    cores = min(B, available_cores())
    rows: list[dict[str, Any]] = []
    for threads in (None, cores) if cores != auto else (None,):
        t = time.perf_counter()
        ens = simulate_ensemble(X, heads, threads=threads, **kw)
        n_thr = ens.provenance["adaptive"]["threads"]
        how = f"{n_thr} thread{'s' if n_thr > 1 else ''}{' (automatic)' if threads is None else ''}"
        rows.append(
            {"how": f"one ensemble (compiled, per-member steps, {how})", "runs": B, "wall_s": time.perf_counter() - t,
             "evaluations": int(sum(ens.provenance["adaptive"]["field_evaluations"]))}
        )  # fmt: skip
    t = time.perf_counter()
    evals = 0
    for b in range(B):
        evals += simulate(X[b], heads, **kw).provenance["adaptive"]["field_evaluations"]
    rows.append({"how": "loop of single runs (compiled)", "runs": B, "wall_s": time.perf_counter() - t,
                 "evaluations": int(evals)})  # fmt: skip
    t = time.perf_counter()
    ev_torch = 0
    for b in range(torch_runs):
        ev_torch += simulate(X[b], heads, **kw, backend="flash").provenance["adaptive"]["field_evaluations"]
    rows.append(
        {"how": f"loop of single runs (torch kernel; {torch_runs} timed, scaled)", "runs": B,
         "wall_s": (time.perf_counter() - t) * B / torch_runs, "evaluations": int(ev_torch * B / torch_runs)}
    )  # fmt: skip
    per_eval = small.field_seconds(
        X[0], BETA * np.eye(3)[None], np.eye(3)[None], np.ones(1), np.full(N, 1.0 / N), "mha"
    )
    rows.append(
        {"how": f"floor: evaluations x one field in a compiled loop ({per_eval * 1e6:.2f} us, one thread)",
         "runs": B, "wall_s": rows[0]["evaluations"] * per_eval, "evaluations": rows[0]["evaluations"],
         "per_eval_s": per_eval}
    )  # fmt: skip
    return rows


def run_small(quick: bool = False, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Both tables; ``quick``: N = 8, 32, 128 and 20 seeds to t = 100."""
    sizes = (8, 32, 128) if quick else (8, 32, 128, 512, 4096)
    before = torch.get_num_threads()
    rows: list[dict[str, Any]] = []
    try:
        torch.set_num_threads(1)  # the small sizes: one thread, like SciPy's NumPy field
        if progress is not None:
            progress("small runs at native speed (numpy RK4, SciPy DOP853)")
        native = compare_native(quick)
        for N in sizes:
            if progress is not None:
                progress(f"small clouds, N = {N}")
            if N >= 4096:
                torch.set_num_threads(before)
            # N = 4096: t = 0 .. 3 (SciPy's dense NumPy field takes about 0.1 s an evaluation there).
            rows += compare_small(N, t_end=3.0 if N >= 4096 else 30.0)
        torch.set_num_threads(1)
        if progress is not None:
            progress("small clouds, ensemble of seeds")
        ens = compare_ensemble(B=20, t_end=100.0) if quick else compare_ensemble()
    finally:
        torch.set_num_threads(before)
    for r in ens:
        r["x_ensemble"] = r["wall_s"] / ens[0]["wall_s"]
    return {
        "small": rows, "ensemble": ens, "beta": BETA, "rtol": RTOL, "atol": ATOL, "threads_large": before,
        "native": native,
    }  # fmt: skip


def small_rows(result: dict[str, Any]) -> list[list[str]]:
    return [
        [f"{r['N']:,}", r["solver"], f"{r['evaluations']:,}", f"{r['evals_ratio']:.2f}", f"{r['wall_s']:.3g}",
         f"{r['wall_ratio']:.2f}", f"{r['diff']:.1e}"]
        for r in result["small"]
    ]  # fmt: skip


def ensemble_rows(result: dict[str, Any]) -> list[list[str]]:
    return [
        [r["how"], str(r["runs"]), f"{r['wall_s']:.3g}", f"{r['x_ensemble']:.1f}", f"{r['evaluations']:,}"]
        for r in result["ensemble"]
    ]


def small_title(result: dict[str, Any]) -> str:
    return (
        f"small clouds: mha, A = {result['beta']:g} I, V = I on S^2, t = 0..30 (N = 4096: 0..3), rtol "
        f"{result['rtol']:g}, atol {result['atol']:g}; one thread below N = 4096"
    )


def small_markdown(result: dict[str, Any]) -> str:
    def md(header: list[str], rows: list[list[str]]) -> str:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])

    return (
        (native_markdown(result["native"]) + "\n" if "native" in result else "")
        + small_title(result) + "\n\n" + md(SMALL_HEADER, small_rows(result)) + "\n\n"
        + "seeds of N = 32 (dop853, rtol 1e-8) as one ensemble against single runs\n\n"
        + md(ENSEMBLE_HEADER, ensemble_rows(result)) + "\n"
    )  # fmt: skip


# --- Native speed (issue 43): small runs against the bare NumPy loop and SciPy, as ratios ---------------

NATIVE_HEADER = ["case", "attnflow (CPU s)", "reference", "reference (CPU s)", "ratio", "bound", "verdict"]

#: ``simulate`` at N = 8, rk4 (save every step, the default) within this factor of a bare NumPy RK4
#: of the same field; N = 32, t = 30, dop853 rtol 1e-8 with default saves within this of SciPy's
#: DOP853 with its default output (issue 43's acceptance bars).
NATIVE_RK4_BOUND = 3.0
NATIVE_DOP853_BOUND = 1.5


def _numpy_rk4(x: np.ndarray, dt: float, n: int, beta: float) -> np.ndarray:
    """``n`` RK4 steps of the field of :func:`_numpy_field` with the retraction, as a researcher writes them."""
    f = _numpy_field(x.shape[0], beta)
    y = x.ravel().copy()
    N = x.shape[0]
    for _ in range(n):
        k1 = f(0.0, y)
        k2 = f(0.0, y + 0.5 * dt * k1)
        k3 = f(0.0, y + 0.5 * dt * k2)
        k4 = f(0.0, y + dt * k3)
        y = y + dt / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        y = (y.reshape(N, 3) / np.linalg.norm(y.reshape(N, 3), axis=1, keepdims=True)).ravel()
    return y.reshape(N, 3)


def _read_diagnostics(tr: Any) -> Any:
    """``tr`` after reading its diagnostics (a deferred table is made then)."""
    len(tr.diagnostics)
    return tr


def _tol(v: float) -> str:
    """``1e-09`` as ``1e-9``."""
    return f"{v:.0e}".replace("e-0", "e-")


def _err(y: np.ndarray, tight: np.ndarray) -> float:
    """The largest coordinate error of a final state ``y`` (retracted) against ``tight``."""
    return float(np.abs(_unit(np.asarray(y).reshape(tight.shape)) - tight).max())


def run_native(quick: bool = False) -> dict[str, Any]:
    """:func:`compare_native` on one torch thread (like SciPy's NumPy field), torch's setting restored."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        return compare_native(quick)
    finally:
        torch.set_num_threads(before)


def _best(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """The best CPU time of ``repeats`` calls (one thread: the work itself, less what other processes
    on a busy machine take from the wall clock) and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t)
    return best, out


def compare_native(quick: bool = False, beta: float = BETA) -> dict[str, Any]:
    """Side by side in this process, best CPU time of several (one thread): ``simulate`` (model ``mha``, ``A = beta I``) at
    N = 8 with rk4 (2,000 steps, saved every step) against the bare NumPy RK4 loop, and at N = 32 with
    dop853 (t = 30, dt = 0.1, rtol 1e-8 and the default atol 1e-9, default saves: 301 states) against
    SciPy's DOP853 with its default output at the same ``rtol`` and ``atol``; each also through the
    torch kernel (``backend="flash"``: the path every small run took before, the negative control
    the bound must reject). A row for information times SciPy at its own default ``atol = 1e-6``
    (on unit vectors 100 times looser than ``rtol``: fewer steps, a larger error); each dop853 row
    states its steps (accepted + rejected) and its final state's error against SciPy at rtol 1e-13.
    diffrax is timed when installed."""
    import os

    from scipy.integrate import solve_ivp

    from attnflow.solve.simulation import ADAPTIVE_OPTIONS, simulate

    repeats = 3 if quick else 5
    heads = _heads(beta)
    rows: list[dict[str, Any]] = []
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    x8, n, dt = _cloud(8), 2000, 0.01
    kw8: dict[str, Any] = dict(model="mha", t_end=n * dt, dt=dt, method="rk4")
    simulate(x8, heads, **{**kw8, "t_end": 0.05})  # compile and warm up
    simulate(x8, heads, **{**kw8, "t_end": 0.05}, backend="flash")
    t_np, ref = _best(lambda: _numpy_rk4(x8, dt, n, beta), repeats)
    cases: tuple[tuple[str, dict[str, Any], bool], ...] = (
        ("", {}, False),
        (" (control: torch kernel)", {"backend": "flash"}, True),
    )
    for label, extra, control in cases:
        t_af, tr = _best(functools.partial(simulate, x8, heads, **kw8, **extra), 1 if control else repeats)
        rows.append({
            "case": f"N = 8, rk4, {n:,} steps, saved every step{label}", "attnflow_s": t_af,
            "reference": "numpy RK4 loop", "reference_s": t_np, "ratio": t_af / t_np, "bound": NATIVE_RK4_BOUND,
            "control": control, "diff": float(np.abs(tr.x[-1] - ref).max()),
        })  # fmt: skip

    x32 = _cloud(32)
    f = _numpy_field(32, beta)
    atol = ADAPTIVE_OPTIONS["atol"]  # attnflow's default atol: SciPy is given the same
    kw32: dict[str, Any] = dict(model="mha", t_end=30.0, dt=0.1, method="dop853", rtol=1e-8)
    simulate(x32, heads, **{**kw32, "t_end": 0.5})
    # The final state to far below either tolerance, to state each one's error.
    tight = _unit(
        solve_ivp(f, (0.0, 30.0), x32.ravel(), method="DOP853", rtol=1e-13, atol=1e-15).y[:, -1].reshape(32, 3)
    )
    refs = []
    for ref_atol, info in ((atol, False), (None, True)):
        extra_tol = {} if ref_atol is None else {"atol": ref_atol}
        t_sp, sol = _best(
            functools.partial(solve_ivp, f, (0.0, 30.0), x32.ravel(), method="DOP853", rtol=1e-8, **extra_tol), repeats
        )
        accepted = sol.t.size - 1  # each trial step of SciPy's DOP853 costs 12 evaluations, its start 2
        what = f"atol {_tol(ref_atol)} (the same)" if ref_atol is not None else "its default atol 1e-6"
        refs.append((
            t_sp, info,
            f"scipy DOP853 rtol 1e-8, {what}, default output ({sol.t.size} states; {accepted}+"
            f"{(int(sol.nfev) - 2) // 12 - accepted} steps; error {_err(sol.y[:, -1], tight):.1e})",
        ))  # fmt: skip
    runs = [
        (label, control, False, _best(functools.partial(simulate, x32, heads, **kw32, **extra), 1 if control else repeats))
        for label, extra, control in cases
    ]  # fmt: skip
    # The saved states' diagnostics are made on first read (DeferredDiagnostics): timed read too, for information.
    read = _best(lambda: _read_diagnostics(simulate(x32, heads, **kw32)), repeats)
    runs.append((", diagnostics of every state read", False, True, read))
    for t_sp, info, reference in refs:
        for label, control, read_info, (t_af, tr) in runs:
            if info and (control or read_info):
                continue
            ad = tr.provenance["adaptive"]
            rows.append({
                "case": f"N = 32, dop853 rtol 1e-8 (atol {_tol(atol)}), t = 30, default saves ({len(tr.t)} states; "
                f"{ad['accepted_steps']}+{ad['rejected_steps']} steps; error {_err(tr.x[-1], tight):.1e}){label}",
                "attnflow_s": t_af, "reference": reference, "reference_s": t_sp, "ratio": t_af / t_sp,
                "bound": NATIVE_DOP853_BOUND, "control": control, "info": info or read_info,
                "diff": float(np.abs(tr.x[-1] - tight).max()),
            })  # fmt: skip
    try:
        import diffrax  # type: ignore[import-not-found]  # noqa: F401

        diffrax_note = "diffrax is installed but not timed here (its JIT start-up is not comparable in one run)"
    except ImportError:
        diffrax_note = (
            "diffrax not timed: not installed (it needs jax, several hundred MB; not a dependency of attnflow)"
        )
    for r in rows:
        r["pass"] = r["ratio"] < r["bound"]
        r["margin"] = r["bound"] / r["ratio"]
    ok = all(r["pass"] != r["control"] for r in rows if not r.get("info"))
    return {"rows": rows, "load_average": load, "diffrax": diffrax_note, "all_ok": ok, "repeats": repeats}


def native_rows(native: dict[str, Any]) -> list[list[str]]:
    out = []
    for r in native["rows"]:
        if r.get("info"):
            why = "the diagnostics' bulk pass" if "read" in r["case"] else "SciPy at a looser tolerance, see its error"
            verdict = f"for information ({r['ratio']:.2f}x: {why})"
        elif r["control"]:
            verdict = "rejected (as it must)" if not r["pass"] else "NOT REJECTED: the bound cannot fail"
        else:
            verdict = f"PASS (margin {r['margin']:.2f}x)" if r["pass"] else f"FAIL ({r['ratio']:.2f} >= {r['bound']:g})"
        out.append([r["case"], f"{r['attnflow_s']:.4f}", r["reference"], f"{r['reference_s']:.4f}",
                    f"{r['ratio']:.2f}", f"< {r['bound']:g}", verdict])  # fmt: skip
    return out


def native_title(native: dict[str, Any]) -> str:
    return (
        f"small runs at native speed: attnflow / reference CPU time, best of {native['repeats']}, one process, one thread "
        f"(load average {native['load_average']:.2f})"
    )


def native_bottom_line(native: dict[str, Any]) -> str:
    rows = [r for r in native["rows"] if not r.get("info")]
    passed = sum(r["pass"] for r in rows if not r["control"])
    rejected = sum(not r["pass"] for r in rows if r["control"])
    n_crit, n_ctrl = sum(not r["control"] for r in rows), sum(r["control"] for r in rows)
    info = "".join(
        f"; for information: {'with every diagnostic read ' if 'read' in r['case'] else ''}{r['ratio']:.2f}x against "
        f"{r['reference'].split(',')[0]}, {r['reference'].split(', ')[1]}"
        for r in native["rows"] if r.get("info")
    )  # fmt: skip
    return (
        f"native speed: {passed}/{n_crit} PASS, {rejected}/{n_ctrl} controls rejected"
        f" (load average {native['load_average']:.2f}){info}; {native['diffrax']}"
    )


def native_markdown(native: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(NATIVE_HEADER) + " |", "|" + "---|" * len(NATIVE_HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in native_rows(native)]
    return native_title(native) + "\n\n" + "\n".join(lines) + "\n\n" + native_bottom_line(native) + "\n"
