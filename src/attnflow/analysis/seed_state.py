"""Whether a run's late window rests at one configuration, and what that configuration is.

The theory's omega-limit points are stationary points of the limiting energy, not only single clusters.
So a run "settled" when its clusters stay the same through its late window, whatever their number:

* **in transition**: the partition of the tokens into clusters (``1 - <x_i, x_j> < cluster_eps``) differs
  between the window's first and last state (clusters merged inside the window, or exchanged tokens). Its
  window mean is of no one configuration: reported, not averaged in.
* **settled**: the same clusters at both ends. Its final state is classified by
  :func:`attnflow.analysis.stationary.classify_stationary` under the law's mean heads: minimiser or saddle
  with its index, when the Newton step to the critical point (``newton_distance``, radians in the mass
  metric) is within the state's **local scale**; beyond it, "not near a stationary point" (a local
  classification says nothing there, as :func:`~attnflow.analysis.stationary.describe` says).

The local scale is measured in the run: ``NEAR_WANDER`` times the rms fluctuation over the window of the
angles between the cluster centres (how far the heads' noise moves the configuration; rotation-invariant),
never below the grouping's own resolution ``arccos(1 - cluster_eps)`` (tokens counted as one cluster may sit
that far apart) and never above :data:`~attnflow.analysis.stationary.LOCAL_NEWTON_RAD` (where the quadratic
model stops describing anything). A seed held off a stationary point by its heads' noise sits within a few
of its own fluctuations of it; a configuration parked on a slope of the energy (two clusters of a cap cloud
drifting together exponentially slowly) has a Newton step many of its fluctuations long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnflow.analysis.stationary import LOCAL_NEWTON_RAD, classify_stationary, token_clusters
from attnflow.core.errors import InputError

#: A settled state counts as near its stationary point when its Newton step is within this many of the
#: configuration's own rms fluctuation over the window (three standard deviations of a Gaussian wander).
NEAR_WANDER = 3.0
#: How many of the window's states are compared with its first (evenly spaced, the last included).
LOOKS = 5

SETTLED, IN_TRANSITION = "settled", "in transition"
#: A window at one configuration that the classifier cannot place at a stationary point (its Newton step is
#: beyond the local scale): reported with its step, not settled (the theory's rest points are stationary).
NOT_NEAR = "not near a stationary point"


@dataclass(frozen=True)
class WindowState:
    """What one run's late window rests at.

    ``clusters``: the cluster counts at the window's first and last state; ``status``: ``"settled"`` (the
    same clusters throughout) or ``"in transition"``; ``kind``: ``"minimiser"``, ``"saddle"``,
    ``"not near a stationary point"`` or ``"not classified"`` (settled) and ``"in transition"`` otherwise;
    ``index`` the stationary point's index (``None`` unless minimiser or saddle); ``newton`` the classifier's
    Newton step (rad) and ``scale`` the local scale it was held against (``wander`` the window's rms
    fluctuation of the centres' angles); ``reason`` one sentence.
    """

    clusters: tuple[int, int]
    status: str
    kind: str
    index: int | None
    newton: float
    scale: float
    wander: float
    reason: str

    @property
    def settled(self) -> bool:
        return self.status == SETTLED

    def summary(self) -> dict[str, Any]:
        """JSON-ready record (``results.json``)."""
        return {
            "clusters": list(self.clusters),
            "status": self.status,
            "state": self.kind,
            "index": self.index,
            "newton_distance": self.newton if math.isfinite(self.newton) else None,
            "local_scale": self.scale if math.isfinite(self.scale) else None,
            "wander": self.wander if math.isfinite(self.wander) else None,
            "reason": self.reason,
        }


def partition(x: np.ndarray, cluster_eps: float) -> np.ndarray:
    """Cluster labels of the tokens ``x`` ``(N, d)``, numbered in order of each cluster's first token (so two
    states with the same clusters have equal labels)."""
    raw = token_clusters(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)), cluster_eps)
    first: dict[int, int] = {}
    return np.array([first.setdefault(int(v), len(first)) for v in raw], dtype=np.int64)


def centre_angles(x: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The angles ``theta_kl`` between the cluster centres (unit mean of each cluster's tokens) of every state
    ``x`` ``(S, N, d)``: ``(S, K (K - 1) / 2)``, the configuration up to rotation."""
    K = int(labels.max()) + 1
    onehot = np.eye(K)[labels]  # (N, K)
    c = np.einsum("snd,nk->skd", np.asarray(x, float), onehot)
    c /= np.linalg.norm(c, axis=-1, keepdims=True)
    iu = np.triu_indices(K, 1)
    G = np.einsum("skd,sld->skl", c, c)[:, iu[0], iu[1]]
    return np.arccos(np.clip(G, -1.0, 1.0))


def window_state(x: np.ndarray, heads: np.ndarray, cluster_eps: float) -> WindowState:
    """What the window's states ``x`` ``(S, N, d)`` (first to last saved state) rest at, under the heads ``heads``
    ``(H, d, d)`` of the limiting energy (the law's mean; equal heads may be passed once: uniform head masses).
    Uniform token masses, model ``gf``."""
    x = np.asarray(x, float)
    looks = np.unique(np.linspace(0, len(x) - 1, min(LOOKS, len(x))).round().astype(int))
    labels = [partition(x[k], cluster_eps) for k in looks]
    counts = (int(labels[0].max()) + 1, int(labels[-1].max()) + 1)
    changed = next((k for k, lab in zip(looks, labels) if not np.array_equal(lab, labels[0])), None)
    if changed is not None:
        c_at = int(labels[list(looks).index(changed)].max()) + 1
        what = "clusters merged" if c_at < counts[0] else "clusters changed tokens"
        return WindowState(
            counts, IN_TRANSITION, IN_TRANSITION, None, math.nan, math.nan, math.nan,
            f"{counts[0]} -> {counts[1]} clusters through the window ({what} inside it: in transition, its mean is "
            "of no one configuration)",
        )  # fmt: skip
    ang = centre_angles(x, labels[-1])
    wander = float(np.sqrt(np.mean((ang - ang.mean(axis=0)) ** 2))) if ang.size else 0.0
    scale = min(LOCAL_NEWTON_RAD, max(math.acos(1.0 - cluster_eps), NEAR_WANDER * wander))
    try:
        # The state is known only to within its local scale: an orbit direction smaller than that is not resolved.
        xn = x[-1] / np.linalg.norm(x[-1], axis=-1, keepdims=True)
        point = classify_stationary(xn, heads, cluster_eps=cluster_eps, orbit_rtol=scale)
    except InputError as e:
        return WindowState(
            counts, SETTLED, "not classified", None, math.nan, scale, wander, f"settled; not classified: {e}"
        )
    s = "s" if counts[1] != 1 else ""
    if point.newton_distance > scale:
        return WindowState(
            counts, NOT_NEAR, NOT_NEAR, None, point.newton_distance, scale, wander,
            f"one configuration of {counts[1]} cluster{s} through the window but {NOT_NEAR}: Newton step {point.newton_distance:.2g} rad beyond the "
            f"local scale {scale:.2g} rad ({NEAR_WANDER:g} x the window's fluctuation {wander:.2g} rad)",
        )  # fmt: skip
    what = "minimiser" if point.kind == "minimiser" else f"saddle of index {point.index}"
    return WindowState(
        counts, SETTLED, point.kind, point.index, point.newton_distance, scale, wander,
        f"settled in {counts[1]} cluster{s} at a {what} (Newton step {point.newton_distance:.2g} rad, local scale "
        f"{scale:.2g} rad)",
    )  # fmt: skip
