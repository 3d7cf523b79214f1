"""A state whose Newton step is far outside the local regime is not called a saddle (issue 43)."""

import dataclasses

import numpy as np

from attnflow.analysis.stationary import LOCAL_NEWTON_RAD, classify_stationary, describe
from attnflow.core.heads import identity_heads


def _saddle():
    c = np.array([1.0, 0.0, 0.0])
    x = np.stack([c, c, -c, -c])  # two antipodal clusters of two tokens: a saddle of index d - 1 = 2
    return classify_stationary(x, identity_heads(1, 3, 1.0), model="gf")


def test_a_near_state_keeps_its_classification():
    p = _saddle()
    assert p.newton_distance < 1e-6 and describe(p).startswith("saddle of index 2 (2 clusters")
    near = dataclasses.replace(p, stationary=False, newton_distance=0.2)
    assert describe(near) == "saddle of index 2 (2 clusters), not yet stationary (Newton step 0.2 rad)"


def test_a_far_state_is_not_near_a_stationary_point():
    far = dataclasses.replace(_saddle(), stationary=False, newton_distance=3.0)
    text = describe(far)
    assert text.startswith("not near a stationary point (2 clusters") and "3 rad" in text and "saddle" not in text
    # control: just inside the local regime it is still the saddle
    edge = dataclasses.replace(far, newton_distance=LOCAL_NEWTON_RAD)
    assert describe(edge).startswith("saddle of index 2")
