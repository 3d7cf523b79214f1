"""Fixtures only; the plain helpers are in ``tests/helpers.py`` (``from helpers import ...``)."""

import numpy as np
import pytest
import torch

from helpers import small_trajectory


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _torch_threads():
    # Tests compare numbers, not speed; a fixed thread count keeps reductions reproducible.
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="session")
def traj3():
    return small_trajectory()


@pytest.fixture(scope="session")
def run_dir3(traj3, tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "r3"
    traj3.save(path, figures=False)
    return path
