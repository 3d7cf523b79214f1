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
