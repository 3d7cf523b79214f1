"""Where the CPU time of a small adaptive single run goes: set-up, compiled work, Python per trial step.

The case of ``attnflow bench --only-native`` (issue 43 item 3): ``simulate`` of N = 32 tokens on
S^2, one head ``A = 9 I``, ``V = I``, model ``mha``, ``dop853`` at rtol 1e-8 (atol 1e-9), ``dt = 0.1``,
``t = 0 .. 30``, default saves (301 states), on one thread. Printed side by side in one process,
each the best CPU time (``time.process_time``) of ``--repeats`` (default 40):

* ``whole``: the run;
* ``one step``: the same call to ``t_end = dt`` (one trial step, two saves): the set-up of a call;
* ``compiled``: the run's own compiled calls (every trial step and every dense-output call, with
  the arguments the run gave them, recorded once) replayed straight into numba's compiled entry
  points, so that neither attnflow's wrappers nor numba's argument typing are counted;
* ``Python per trial step`` = ``(whole - one step - compiled) / (trials - 1)``.

Run it with any checkout's interpreter (``/path/.venv/bin/python benchmarks/adaptive_overhead.py``):
it imports the installed ``attnflow``, so the code before and after a change can be timed alike.
``--profile FILE`` also writes a cProfile of 200 runs (sorted by own time, the top 40 printed).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import torch


def cloud(N: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((N, 3))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def best(fn: Any, repeats: int) -> float:
    b = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        fn()
        b = min(b, time.process_time() - t)
    return b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--profile", default=None, help="write a cProfile of 200 whole runs here")
    args = ap.parse_args()
    torch.set_num_threads(1)

    import attnflow
    from attnflow.core.heads import Heads
    from attnflow.kernels import small

    heads = Heads(K=torch.tensor(9.0 * np.eye(3)[None]), V=torch.tensor(np.eye(3)[None]))
    x32 = cloud(32)
    kw: dict[str, Any] = dict(model="mha", t_end=30.0, dt=0.1, method="dop853", rtol=1e-8)

    def whole() -> Any:
        return attnflow.simulate(x32, heads, **kw)

    def one() -> Any:
        return attnflow.simulate(x32, heads, **{**kw, "t_end": 0.1})

    tr = whole()
    one()
    ad = tr.provenance["adaptive"]
    trials = ad["accepted_steps"] + ad["rejected_steps"]

    # Record the run's compiled calls (their arguments), then replay them into the compiled entry points.
    calls: list[tuple[Any, tuple]] = []
    orig = {name: getattr(small, name) for name in ("_attempt", "_dense_and_points", "_dense", "_dense_points")
            if hasattr(small, name)}  # fmt: skip

    def recorder(name: str) -> Any:
        fn = orig[name]

        def call(*a: Any) -> Any:
            copied = tuple(x.copy() if isinstance(x, np.ndarray) else x for x in a)
            out = fn(*a)
            calls.append((fn, copied))
            return out

        return call

    for name in orig:
        setattr(small, name, recorder(name))
    try:
        whole()
    finally:
        for name, fn in orig.items():
            setattr(small, name, fn)
    n_trials = sum(1 for fn, _ in calls if fn is orig["_attempt"])
    entry = []
    for fn, a in calls:
        fn(*a)  # compiled for these types already; the entry point skips numba's argument typing
        (sig,) = [s for s in fn.overloads if len(s) == len(a)][:1] or [next(iter(fn.overloads))]
        entry.append((fn.overloads[sig].entry_point, a))

    def replay() -> None:
        for f, a in entry:
            f(*a)

    t_whole = best(whole, args.repeats)
    t_one = best(one, args.repeats)
    t_comp = best(replay, args.repeats)
    t_trial = best(lambda: [f(*a) for f, a in entry if f is entry[0][0]], args.repeats)
    per = (t_whole - t_one - t_comp) / (trials - 1)
    load = os.getloadavg()
    print(f"attnflow {attnflow.__file__}")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; best CPU time of {args.repeats}")
    print(f"trials {trials} (accepted {ad['accepted_steps']}, rejected {ad['rejected_steps']}; recorded {n_trials}),"
          f" compiled calls {len(calls)}, saved states {len(tr.t)}")  # fmt: skip
    print(f"whole run          {1e3 * t_whole:8.3f} ms")
    print(f"one-step run       {1e3 * t_one:8.3f} ms   (set-up per call)")
    print(f"compiled calls     {1e3 * t_comp:8.3f} ms   (trials alone {1e3 * t_trial:.3f} ms,"
          f" {1e6 * t_trial / n_trials:.2f} us each)")  # fmt: skip
    print(f"Python per trial   {1e6 * per:8.2f} us   ((whole - one step - compiled) / (trials - 1))")
    if args.profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            whole()
        pr.disable()
        pr.dump_stats(args.profile)
        pstats.Stats(pr).sort_stats("tottime").print_stats(40)


if __name__ == "__main__":
    main()
