"""The compiled small-cloud path: its field equals FieldStats' (the one home of the head mix) to
1e-13 for every model with masses and several heads, and one compiled step of each embedded pair
equals the torch step (new point and error norm)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnflow.core.geometry import retract
from attnflow.dynamics.fields import field_stats, prepare
from attnflow.kernels import small
from attnflow.schemes.integrators import ADAPTIVE
from attnflow.solve.controllers import PIState

pytestmark = pytest.mark.skipif(not small.AVAILABLE, reason="numba is not installed")


def problem(model: str, N: int = 24, d: int = 4, H: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    G = rng.standard_normal((H, d, d))
    A = 1.5 * (G + np.swapaxes(G, 1, 2)) / 2
    V = A.copy() if model == "gf" else rng.standard_normal((H, d, d))
    a = rng.uniform(0.2, 1.0, N)
    a /= a.sum()
    w = rng.uniform(0.2, 1.0, H)
    w /= w.sum()
    return x, A, V, a, w


def reference_velocity(x, A, V, a, w, model):
    xt, heads, at, wt = prepare(torch.from_numpy(x), torch.from_numpy(A), torch.from_numpy(V), a, w)
    return field_stats(xt, heads, at, wt).velocity(xt, model).numpy()


@pytest.mark.parametrize("model", ["mha", "gf", "usa"])
def test_compiled_field_equals_field_stats(model):
    x, A, V, a, w = problem(model)
    got = small.field(x, A, V, w, a, model)
    want = reference_velocity(x, A, V, a, w, model)
    assert np.abs(got - want).max() <= 1e-13 * max(1.0, np.abs(want).max())


def test_compiled_field_negative_control():
    """The same comparison sees a wrong head mix: the gf field is not the mha field."""
    x, A, V, a, w = problem("gf")
    got = small.field(x, A, V, w, a, "mha")
    want = reference_velocity(x, A, V, a, w, "gf")
    assert np.abs(got - want).max() > 1e-3


def test_usa_overflow_is_reported():
    x, A, V, a, w = problem("usa")
    with pytest.raises(OverflowError):
        small.field(x, 400.0 * A, V, w, a, "usa")


@pytest.mark.parametrize("method", sorted(ADAPTIVE))
@pytest.mark.parametrize("model", ["mha", "gf"])
def test_compiled_step_equals_torch_step(method, model):
    pair = ADAPTIVE[method]
    x, A, V, a, w = problem(model, N=16, d=3, H=2, seed=1)
    xt, heads, at, wt = prepare(torch.from_numpy(x), torch.from_numpy(A), torch.from_numpy(V), a, w)

    def f(t, y):
        return field_stats(y, heads, at, wt).velocity(y, model)

    # A step whose error estimate stands well above the rounding of the stage sums it is made of.
    rtol, atol, dt = 1e-6, 1e-8, 0.25
    y_t, e_t, k_t = pair.attempt(f, 0.0, xt, dt)
    err_t = PIState(k=pair.embedded_order + 1, dt=dt, rtol=rtol, atol=atol).norm(xt, y_t, e_t)
    y_c, err_c, k1_c, k_c, ok = small.embedded_attempt(x, dt, A, V, w, a, model, pair.arrays(), rtol, atol)
    assert np.abs(k1_c - f(0.0, xt).numpy()).max() < 1e-13
    assert ok
    assert np.abs(y_c - y_t.numpy()).max() < 1e-13
    assert np.abs(k_c - k_t.numpy()).max() < 1e-12
    # The estimate is a difference of stage sums (cancellation): equal to 1e-7 relative, far below the
    # 2x that dropping DOP853's 3rd-order factor makes (test_compiled_step_negative_control).
    assert err_t > 1e-4 and abs(err_c - err_t) <= 1e-7 * err_t, (err_c, err_t)
    # FSAL: handing the first stage in gives the same step.
    y_2, err_2, _, _, _ = small.embedded_attempt(
        x, dt, A, V, w, a, model, pair.arrays(), rtol, atol, k1=f(0.0, xt).numpy()
    )
    assert np.abs(y_2 - y_c).max() < 1e-14 and abs(err_2 - err_c) <= 1e-7 * err_c


def test_compiled_step_negative_control():
    """A perturbed tableau (one b weight off by 1e-3) gives a different point: the comparison can fail."""
    pair = ADAPTIVE["dop853"]
    x, A, V, a, w = problem("mha", N=16, d=3, H=2, seed=1)
    c, Am, b, e, e3, fsal = pair.arrays()
    b = b.copy()
    b[5] += 1e-3
    y_bad, *_ = small.embedded_attempt(x, 0.07, A, V, w, a, "mha", (c, Am, b, e, e3, fsal), 1e-8, 1e-10)
    y_ok, *_ = small.embedded_attempt(x, 0.07, A, V, w, a, "mha", pair.arrays(), 1e-8, 1e-10)
    assert np.abs(y_bad - y_ok).max() > 1e-6
    assert np.allclose(np.linalg.norm(y_bad, axis=1), 1.0)  # still retracted
    _ = retract


def test_dop853_combined_estimate_matters():
    """Without the 3rd-order factor DOP853's error norm changes by far more than the tolerance above."""
    pair = ADAPTIVE["dop853"]
    x, A, V, a, w = problem("mha", N=16, d=3, H=2, seed=1)
    c, Am, b, e, e3, fsal = pair.arrays()
    _, err_plain, _, _, _ = small.embedded_attempt(x, 0.25, A, V, w, a, "mha", (c, Am, b, e, e3[:0], fsal), 1e-6, 1e-8)
    _, err, _, _, _ = small.embedded_attempt(x, 0.25, A, V, w, a, "mha", pair.arrays(), 1e-6, 1e-8)
    assert abs(err_plain - err) > 1e-3 * err, (err_plain, err)


def test_compiled_exp_is_numpys_to_two_ulp():
    """The vectorised compiled exp (2^k p(r)) against NumPy's over the kernel's argument range."""
    x = np.concatenate([-np.random.default_rng(0).uniform(0.0, 700.0, 20000), np.linspace(-30.0, 300.0, 5001)])
    got, want = small.exp_array(x), np.exp(x)
    ulps = np.abs(got / want - 1.0) / np.finfo(np.float64).eps
    print(f"compiled exp: max {ulps.max():.2f} ulp")
    assert ulps.max() <= 2.0


def test_compiled_exp_negative_control():
    """The same comparison sees a truncated polynomial (the Taylor series one term short)."""
    x = np.linspace(-30.0, 30.0, 2001)
    k = np.floor(x * small._LOG2E + 0.5)
    r = (x - k * small._LN2_HI) - k * small._LN2_LO
    short = sum(r**n / float(np.prod(np.arange(1, n + 1))) for n in range(12)) * 2.0**k
    ulps = (np.abs(short / np.exp(x) - 1.0) / np.finfo(np.float64).eps).max()
    print(f"truncated series: max {ulps:.1f} ulp")
    assert ulps > 2.0


@pytest.mark.parametrize("model", ["mha", "gf", "usa"])
def test_shift_free_and_shifted_scores_both_equal_field_stats(model):
    """Both routes of the compiled field (row maximum subtracted or not) equal FieldStats to 1e-13;
    at a large ||A|| the automatic choice takes the shifted route and still matches."""
    x, A, V, a, w = problem(model, N=20, d=3, H=2)
    want = reference_velocity(x, A, V, a, w, model)
    AT, Vc, log_w = small._heads_arrays(A, V, w)
    N, d = x.shape
    for shift_free in (False, True):
        u = np.empty_like(x)
        assert small._field(x, AT, Vc, log_w, a, small.MODEL_CODES[model], u, np.empty(small.work_size(N, d, 2)),
                            np.empty(N * N, dtype=np.int64), shift_free)  # fmt: skip
        assert np.abs(u - want).max() <= 1e-13 * max(1.0, np.abs(want).max()), shift_free
    assert small._shift_free(x, small.a_norm(AT))
    if model != "usa":  # usa overflows there by design (test_usa_overflow_is_reported)
        big = 200.0 * A
        assert not small._shift_free(x, small.a_norm(np.swapaxes(big, 1, 2)))
        want = reference_velocity(x, big, V, a, w, model)
        got = small.field(x, big, V, w, a, model)
        assert np.abs(got - want).max() <= 1e-13 * max(1.0, np.abs(want).max())


def test_shift_free_bound_negative_control():
    """Scores beyond the float range without the shift: forcing the shift-free route there gives a
    wrong field (the exponent leaves the range of 2^k), which is why the route is taken only under
    SHIFT_FREE_BOUND; the automatic choice shifts and matches FieldStats."""
    x, A, V, a, w = problem("mha", N=20, d=3, H=1)
    AT, Vc, log_w = small._heads_arrays(400.0 * A, V, w)
    N, d = x.shape
    u = np.empty_like(x)
    small._field(x, AT, Vc, log_w, a, 0, u, np.empty(small.work_size(N, d, 1)), np.empty(N * N, dtype=np.int64), True)
    want = reference_velocity(x, 400.0 * A, V, a, w, "mha")
    assert not (np.isfinite(u).all() and np.abs(u - want).max() < 1e-3)
    assert np.abs(small.field(x, 400.0 * A, V, w, a, "mha") - want).max() <= 1e-13
