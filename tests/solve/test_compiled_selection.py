"""Which runs take the compiled small-cloud path: the adaptive and the fixed step select their heads
with one helper (``_plain_constant_heads``). Merging the adaptive step's own copy into it changed
no run's path, because for :class:`Heads` the compiled path's ``supported`` asks exactly ``plain``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnflow.core.heads import Heads
from attnflow.kernels import small as _small
from attnflow.kernels.dispatch import KernelOptions
from attnflow.schemes.integrators import ADAPTIVE, get_integrator
from attnflow.solve.problem import Problem
from attnflow.solve.solver import _compiled_fixed, _compiled_step, _plain_constant_heads
from attnflow.weights.processes import Constant, Layers

pytestmark = pytest.mark.skipif(not _small.AVAILABLE, reason="the compiled path needs numba")

K = torch.eye(3, dtype=torch.float64)[None] * 1.5
#: One variant per feature that makes heads non-plain (and the plain heads).
VARIANTS = {
    "plain": {},
    "bias_q": {"bias_q": torch.zeros(1, 3, dtype=torch.float64)},
    "bias_k": {"bias_k": torch.zeros(1, 3, dtype=torch.float64)},
    "bias_v": {"bias_v": torch.zeros(1, 3, dtype=torch.float64)},
    "causal": {"causal": True},
    "rope": {"rope": torch.ones(3, dtype=torch.float64)},
}


def _x(n: int = 6, d: int = 3) -> torch.Tensor:
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((n, d)))
    return x / x.norm(dim=1, keepdim=True)


def _constant(heads: Heads) -> Constant:
    proc = Constant(K)
    proc.heads = heads  # as_heads would keep the features; set them exactly
    return proc


@pytest.mark.parametrize("name", VARIANTS)
def test_supported_asks_exactly_plain(name):
    h = Heads(K=K, **VARIANTS[name])
    for dtype in (torch.float64, torch.float32):
        assert _small.supported(h, "cpu", dtype) == h.plain == (name == "plain")


@pytest.mark.parametrize("name", VARIANTS)
def test_adaptive_and_fixed_steps_select_the_same_runs(name):
    x, a, w = _x(), torch.full((6,), 1 / 6, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    h = Heads(K=K, **VARIANTS[name])
    for proc in (_constant(h), Layers([h, h], t_end=1.0)):
        plain = _plain_constant_heads(proc, x) is not None
        assert plain == (name == "plain")
        adaptive = _compiled_step(ADAPTIVE["dopri5"], proc, x, a, w, KernelOptions(), recording=False)
        assert (adaptive is not None) == plain
        if isinstance(proc, Constant):
            p = Problem(x0=x, a=a, w=w, process=proc, model="gf", t0=0.0, t_end=1.0, seed=None, cluster_eps=1e-3,
                        options=KernelOptions())  # fmt: skip
            assert (_compiled_fixed(get_integrator("rk4"), p, x, a, w, recording=False) is not None) == plain


class _NotPlain(Heads):
    """Heads whose ``plain`` says no for a reason ``supported`` does not look at (a future feature)."""

    @property
    def plain(self) -> bool:
        return False


def test_negative_control_a_disagreeing_plain_is_caught():
    h = _NotPlain(K=K)
    assert _small.supported(h, "cpu", torch.float64) != h.plain  # what the first test would flag
    assert _plain_constant_heads(_constant(h), _x()) is None  # and the merged selection stays off the path
