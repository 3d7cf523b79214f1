import numpy as np
import pytest
import torch


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def random_sym(rng, H, d, scale=1.0):
    G = rng.standard_normal((H, d, d))
    return scale * (G + G.transpose(0, 2, 1)) / 2


def random_tokens(rng, N, d):
    x = rng.standard_normal((N, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def random_masses(rng, n):
    m = rng.uniform(0.5, 1.5, n)
    return m / m.sum()


@pytest.fixture(autouse=True)
def _torch_threads():
    # Tests compare numbers, not speed; a fixed thread count keeps reductions reproducible.
    torch.set_num_threads(1)
    yield


# --- small simulated runs for the report / movie / CLI-view tests (fast enough for CI's default run) ---


def small_trajectory(n: int = 80, d: int = 3, H: int = 2, t_end: float = 1.5, dt: float = 0.1, seed: int = 0):
    """A ``gf`` run with constant GOE heads, Euler steps, every step saved."""
    from attnflow import simulate, tokens
    from attnflow.core.heads import goe_heads

    x0 = tokens.uniform(n, d, seed=seed)
    A = goe_heads(H, d, beta=4.0, seed=seed)
    return simulate(
        x0,
        A,
        model="gf",
        t_end=t_end,
        dt=dt,
        method="euler",
        save_every=1,
        config={"name": "test", "diagnostics": {"cluster_eps": 1e-3}},
    )


@pytest.fixture(scope="session")
def traj3():
    return small_trajectory()


@pytest.fixture(scope="session")
def run_dir3(traj3, tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "r3"
    traj3.save(path, figures=False)
    return path
