"""A million tokens, 1000 rk4 steps: the long run of docs/performance.md (not part of the tests).

1,000,000 tokens uniform on S^2, H = 8 GOE heads scaled to operator norm beta = 4 (the bench's
fast-summation problem), model ``mha``, rk4 with dt = 0.01 to t = 10, fast summation at tolerance
1e-6, the state and its diagnostics saved every 100 steps. Prints the wall time, the provenance's
split and the first and last diagnostics.

    python benchmarks/million_tokens.py            # about 18-25 minutes on the 2-core CI machine
    python benchmarks/million_tokens.py --steps 10 # a quick look
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import attnflow as af
from attnflow.core import heads, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    x0 = tokens.uniform(args.tokens, 3, seed=0)
    A0 = heads.goe_heads(8, 3, 1.0, seed=1)
    A = A0 * 4.0 / np.linalg.norm(A0, ord=2, axis=(1, 2)).max()
    dt = 0.01
    start = time.perf_counter()
    traj = af.simulate(
        x0, A, model="mha", t_end=args.steps * dt, dt=dt, method="rk4", save_every=100, backend="fast", fast_tol=1e-6
    )
    wall = time.perf_counter() - start
    p = traj.provenance
    print(f"{args.tokens:,} tokens x {args.steps} rk4 steps: {wall:.1f} s wall ({wall / args.steps:.3f} s per step)")
    print("split (s):", {k: round(v, 1) for k, v in p.get("seconds", {}).items()})
    for k in ("energy", "clusters", "slope", "order_parameter"):
        print(f"{k}: {traj.diagnostics[k][0]:.6g} -> {traj.diagnostics[k][-1]:.6g}")


if __name__ == "__main__":
    main()
