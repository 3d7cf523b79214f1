"""Time ``render_movie`` on 600 frames of 1000 tokens (the issue's bar: under two minutes on a 2-core machine).

    PYTHONPATH=src python benchmarks/movie_bench.py [--frames 600] [--tokens 1000] [--trails 0] [--out /tmp/bench.mp4]

The trajectory is synthetic (tokens sliding along great circles towards four poles), so the timing
measures rendering and encoding only.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from attnflow.core.tokens import uniform
from attnflow.io.trajectory import Trajectory
from attnflow.viz.movie import render_movie


def synthetic_trajectory(n: int, saved: int, d: int = 3, H: int = 2, seed: int = 0) -> Trajectory:
    x0 = uniform(n, d, seed=seed)
    poles = uniform(4, d, seed=seed + 1)
    target = poles[np.argmax(x0 @ poles.T, axis=1)]
    s = np.linspace(0, 1, saved)[:, None, None] ** 0.5
    x = (1 - s) * x0 + s * target
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    t = np.linspace(0, 10, saved)
    A = np.broadcast_to(np.eye(d), (saved, H, d, d)).copy()
    diag = {k: np.zeros(saved) for k in ("energy", "slope", "metric_speed", "clusters", "order_parameter")}
    return Trajectory(
        t=t,
        x=x,
        A=A,
        V=None,
        diagnostics=diag,
        token_weights=np.full(n, 1 / n),
        head_weights=np.full(H, 1 / H),
        model="gf",
        method="rk4",
        dt=0.01,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=600)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--trails", type=int, default=0)
    ap.add_argument("--rotate", type=float, default=90.0)
    ap.add_argument("--resolution", default="1280x720")
    ap.add_argument("--out", default="/tmp/attnflow-bench.mp4")
    args = ap.parse_args()
    traj = synthetic_trajectory(args.tokens, saved=101)
    w, h = (int(v) for v in args.resolution.split("x"))
    start = time.perf_counter()
    render_movie(traj, args.out, frames=args.frames, trails=args.trails, rotate=args.rotate, resolution=(w, h))
    wall = time.perf_counter() - start
    print(
        f"{args.frames} frames, {args.tokens} tokens, trails={args.trails}, {args.resolution}: "
        f"{wall:.1f} s ({args.frames / wall:.1f} frames/s) -> {args.out}"
    )


if __name__ == "__main__":
    main()
