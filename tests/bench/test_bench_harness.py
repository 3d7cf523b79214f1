"""The benchmark harness measures what it says (correctness only; timings are not tested)."""

import numpy as np
import pytest
import torch

from attnflow import tokens, velocity
from attnflow.bench.harness import bench_size, markdown, reference_field
from attnflow.core.heads import goe_heads


def test_reference_field_is_the_mha_velocity():
    x = tokens.uniform(50, 3, seed=0)
    A = goe_heads(3, 3, 2.0, seed=1)
    a, w = np.full(50, 1 / 50), np.full(3, 1 / 3)
    assert np.abs(reference_field(x, A, A, a, w) - velocity(x, A, A, model="mha")).max() < 1e-13


@pytest.mark.slow
def test_bench_rows_report_small_errors_and_markdown():
    rows = bench_size(300, 3, 2, exp_rate=1e9, steps=2, repeats=1)
    names = [r.backend for r in rows]
    assert names[0] == "numpy reference" and names[1] == "dense (flash)" and names[2].startswith("fast")
    assert rows[1].rel_error < 1e-5  # float32 dense kernel
    assert rows[2].rel_error < 1e-6  # fast summation at tol 1e-6
    md = markdown(
        {
            "machine": {"exp_per_s": 1e9, "threads": torch.get_num_threads(), "torch": "x"},
            "beta": 4.0,
            "rows": [r.__dict__ for r in rows],
        }
    )
    assert md.count("\n| 300, 3, 2 |") == 3


def test_fast_profile_accounts_for_the_whole_evaluation():
    from attnflow.bench.fastsum import fast_profile_markdown, fast_profile_rows, profile_fast

    peaks = {"gemm64": 50.0, "gemm32": 100.0, "bandwidth": 10.0}
    prof = profile_fast(N=20_000, H=4, repeats=1, peaks=peaks)
    parts = {p["part"]: p for p in prof["parts"]}
    # the split adds up to the measured call (every part, overhead and assembly included)
    assert abs(sum(p["seconds"] for p in prof["parts"]) - prof["seconds"]) <= 1e-6 + 0.02 * prof["seconds"]
    # the products' work is counted from the plan: 2 N M H (d + 1) flops, floor at the stated GEMM rate
    ev = parts["products W phi (fused loop)"]
    assert ev["work"] == pytest.approx(2 * 20_000 * prof["features"] * 4 * 4 / 1e9)
    assert ev["floor"] == pytest.approx(ev["work"] / 50.0)
    assert prof["floor"] == pytest.approx(sum(p["floor"] for p in prof["parts"]))
    assert len(fast_profile_rows(prof)) == len(prof["parts"])
    assert "x floor" in fast_profile_markdown(prof)
