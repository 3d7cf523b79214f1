"""A transposed token array gets "looks transposed" before any projection warning (issue 43)."""

import warnings

import numpy as np
import pytest

import attnflow as af
from attnflow.core.errors import InputError
from attnflow.core.tokens import check_tokens


def _tokens(n=256, d=3):
    x = np.random.default_rng(0).normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_transposed_tokens_are_named_as_such_without_a_warning():
    x = _tokens()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no projection warning comes first
        with pytest.raises(InputError, match=r"looks transposed; pass its transpose \(shape \(256, 3\)\)"):
            check_tokens(x.T)
        with pytest.raises(InputError, match=r"x0: .*looks transposed"):
            af.simulate(x.T, np.eye(3)[None], t_end=0.1, dt=0.05)


def test_off_sphere_rows_are_still_projected():
    """Control: rows off the sphere whose columns are not unit vectors are projected with the old warning."""
    x = 2.0 * _tokens()
    with pytest.warns(UserWarning, match="projected onto the unit sphere"):
        out = check_tokens(x)
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0)
