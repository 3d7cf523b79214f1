"""A run started on a saddle plus a small push along ``escape`` leaves it; pushed along a stable direction
it returns. Each verdict is measured against a scale of the same run (the push's own energy change and
length), and each criterion is shown to reject the other run (its negative control)."""

from __future__ import annotations

import math

import numpy as np

import attnflow as af


def _run(x0, A, t_end):
    return af.simulate(
        x0, A, model="gf", t_end=t_end, dt=t_end / 20, method="dopri5", rtol=1e-8, atol=1e-11, record_steps=False
    )


def test_push_along_escape_leaves_and_along_stable_returns():
    rng = np.random.default_rng(7)
    d = 3
    beta = float(rng.uniform(1.0, 2.0))
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    c = q[:, 0]
    x = np.stack([c, c, -c, -c])  # two antipodal clusters of two tokens: a saddle of index d - 1
    A = beta * np.eye(d)[None]
    p = af.classify_stationary(x, A)
    assert p.kind == "saddle" and p.index == d - 1 and p.escape is not None and p.stable is not None
    eps = 1e-3
    # Predicted rates of the gf flow: the mass-metric eigenvalue times the mobility b = 1 / cosh(beta) at both
    # clusters (equal masses), so the horizons come from the classification, not from a tuned constant.
    b = 1.0 / math.cosh(beta)
    rate_out = -float(p.eigenvalues[0]) * b
    rate_in = float(max(s.max() for s in p.split_eigenvalues.values())) * b
    runs = {}
    for name, u, horizon in (
        ("escape", p.escape, 4 * math.log(1 / eps) / rate_out),
        ("stable", p.stable, 10 / rate_in),
    ):
        x0 = x + eps * u
        x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
        traj = _run(x0, A, horizon)
        E = traj.diagnostics["energy"]
        push_energy = abs(E[0] - p.energy)  # the push's own energy change: the run's scale
        push_length = float(np.linalg.norm(x0 - x))
        runs[name] = {
            "drop": p.energy - E[-1],
            "push_energy": push_energy,
            "return": float(np.linalg.norm(traj.x[-1] - x)) / push_length,
            "end": af.classify_stationary(traj.x[-1], A),
        }
    leaves = lambda r: r["drop"] > 1e3 * r["push_energy"]
    returns = lambda r: r["return"] < 1e-2 and abs(r["drop"]) <= r["push_energy"]
    e, s = runs["escape"], runs["stable"]
    print(
        f"beta={beta:.3f}: escape drop {e['drop']:.3e} = {e['drop'] / e['push_energy']:.2e} x push energy "
        f"(needs > 1e3), ends {e['end'].kind} with {e['end'].clusters} cluster(s); stable push returns to "
        f"{s['return']:.2e} of its length (needs < 1e-2), drop {s['drop']:.2e} vs push energy {s['push_energy']:.2e}"
    )
    assert leaves(e) and e["end"].kind == "minimiser" and e["end"].clusters == 1
    assert returns(s) and s["end"].kind == "saddle" and s["end"].index == d - 1
    # Negative controls: each criterion rejects the other run.
    assert not returns(e)
    assert not leaves(s)
