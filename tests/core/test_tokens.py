"""Initial token clouds: on the sphere, with the promised geometry, and file loading with validation."""

import numpy as np
import pytest

from attnflow import tokens


def _on_sphere(x):
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-12)


def test_uniform_is_uniform():
    x = tokens.uniform(20000, 3, seed=0)
    _on_sphere(x)
    # Uniform on S^2: E x = 0, E x x^T = I/3.
    assert np.abs(x.mean(0)).max() < 5 / np.sqrt(20000)
    np.testing.assert_allclose(x.T @ x / len(x), np.eye(3) / 3, atol=0.02)
    np.testing.assert_array_equal(x, tokens.uniform(20000, 3, seed=0))


def test_cap_respects_angle_and_area():
    c = np.array([0.0, 0.0, 1.0])
    x = tokens.cap(20000, 3, angle=np.pi / 3, center=c, seed=1)
    _on_sphere(x)
    assert (x @ c).min() >= np.cos(np.pi / 3) - 1e-12
    # On S^2 the height x.c of a uniform point on a cap is uniform on [cos(angle), 1]: mean (1 + cos)/2.
    assert abs((x @ c).mean() - (1 + 0.5) / 2) < 0.01
    h = tokens.cap(5000, 5, angle=np.pi / 2, seed=2)
    assert (h[:, 0] >= -1e-12).all()


def test_equiangular_gram():
    x = tokens.equiangular(4, 3, seed=3)  # regular simplex: inner product -1/3
    G = x @ x.T
    np.testing.assert_allclose(G[~np.eye(4, dtype=bool)], -1 / 3, atol=1e-12)
    y = tokens.equiangular(5, 6, inner_product=0.3, seed=3)
    np.testing.assert_allclose((y @ y.T)[~np.eye(5, dtype=bool)], 0.3, atol=1e-12)
    with pytest.raises(ValueError, match="dimension"):
        tokens.equiangular(5, 3, inner_product=0.2)


def test_vmf_mixture_concentrated():
    x = tokens.vmf_mixture(3000, 3, k=1, kappa=200.0, seed=4)
    _on_sphere(x)
    # One vMF component with kappa = 200 on S^2: mean resultant length coth(k) - 1/k ~ 0.995.
    assert abs(np.linalg.norm(x.mean(0)) - (1 / np.tanh(200) - 1 / 200)) < 0.002


def test_from_file_npy_csv_and_validation(tmp_path):
    x = tokens.uniform(10, 4, seed=5)
    np.save(tmp_path / "t.npy", x)
    np.savetxt(tmp_path / "t.csv", 2 * x, delimiter=",")
    np.testing.assert_allclose(tokens.from_file(tmp_path / "t.npy"), x)
    with pytest.warns(UserWarning, match="projected"):
        np.testing.assert_allclose(tokens.from_file(tmp_path / "t.csv"), x, atol=1e-12)
    with pytest.raises(ValueError, match="not on the unit sphere"):
        tokens.from_file(tmp_path / "t.csv", normalise=False)
    bad = x.copy()
    bad[3] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    with pytest.raises(ValueError, match="row 3"):
        tokens.from_file(tmp_path / "nan.npy")
    bad[3] = 0.0
    np.save(tmp_path / "zero.npy", bad)
    with pytest.raises(ValueError, match="zero vector"):
        tokens.from_file(tmp_path / "zero.npy")
    with pytest.raises(ValueError, match="does not exist"):
        tokens.from_file(tmp_path / "missing.npy")
    (tmp_path / "t.txt").write_text("1,2")
    with pytest.raises(ValueError, match=".npy or .csv"):
        tokens.from_file(tmp_path / "t.txt")
