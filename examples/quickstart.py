"""Quickstart: simulate from Python, read the numbers, save a run folder and its interactive report.

    python examples/quickstart.py [OUT]        (default OUT = runs/quickstart)

64 tokens on S^2, 4 heads A_h = 4 I driven by an Ornstein-Uhlenbeck process, the gradient-flow
model `gf`, Heun steps. Runs in a few seconds on a laptop CPU.
"""

import sys

import numpy as np

import attnflow
from attnflow import heads, tokens
from attnflow.weights import OrnsteinUhlenbeck

out = sys.argv[1] if len(sys.argv) > 1 else "runs/quickstart"

x0 = tokens.uniform(64, 3, seed=0)  # mu_0: 64 tokens, uniform on the sphere
process = OrnsteinUhlenbeck(heads.identity_heads(4, 3, beta=4.0), rate=1.0, sigma=1.0)  # Theta_t
traj = attnflow.simulate(x0, process, model="gf", t_end=2.0, dt=0.05, method="heun", save_every=2, seed=0)

d = traj.diagnostics
print(f"saved {len(traj.t)} times, x has shape {traj.x.shape}")
print(f"energy F(mu_t, t): {d['energy'][0]:.4f} -> {d['energy'][-1]:.4f}")
print(f"slope |dF|:        {d['slope'][0]:.4f} -> {d['slope'][-1]:.4f}")
print(f"clusters:          {int(d['clusters'][0])} -> {int(d['clusters'][-1])}")
# along the gf flow the metric speed |mu'| equals the slope |dF| (docs/model.md)
print(f"max | |mu'| - |dF| | = {np.max(np.abs(d['metric_speed'] - d['slope'])):.2e}")

traj.save(out, overwrite=True)  # dataset.zarr + provenance.json + figures/
print("wrote", attnflow.write_report(out))  # OUT/report.html
