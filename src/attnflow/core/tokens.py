"""Initial token clouds on the unit sphere ``S^{d-1}`` (numpy float64, shape ``(N, d)``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from scipy.stats import vonmises_fisher

from attnflow.core.caller import AttnflowWarning, caller_stacklevel
from attnflow.core.errors import InputError
from attnflow.core.files import MAX_ARRAY_BYTES, open_regular, read_npy


class TokenWarning(AttnflowWarning):
    """Tokens read from a file were changed (projected onto the unit sphere)."""


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _check(n: int, d: int) -> None:
    if n < 1 or d < 2:
        raise InputError(f"need n >= 1 tokens in dimension d >= 2; got n={n}, d={d}")


def uniform(n: int, d: int, seed: int | None = None) -> np.ndarray:
    """``n`` i.i.d. points, uniform on ``S^{d-1}`` (normalised Gaussians)."""
    _check(n, d)
    return _normalise(np.random.default_rng(seed).standard_normal((n, d)))


def cap(
    n: int, d: int, angle: float = np.pi / 2, center: np.ndarray | None = None, seed: int | None = None
) -> np.ndarray:
    """``n`` points uniform on the spherical cap ``{x : angle(x, center) <= angle}``; ``angle = pi/2``
    is a hemisphere. Sampled by rejection from the uniform law, with a fallback that draws the polar
    angle from its exact density for thin caps."""
    _check(n, d)
    if not 0 < angle <= np.pi:
        raise InputError(f"cap angle must lie in (0, pi]; got {angle}")
    rng = np.random.default_rng(seed)
    e = np.zeros(d)
    e[0] = 1.0
    c = e if center is None else _normalise(np.asarray(center, dtype=np.float64)[None])[0]
    # Polar angle density on S^{d-1} is proportional to sin^{d-2}(theta); sample by inverse CDF on a grid.
    grid = np.linspace(0.0, angle, 4097)
    dens = np.sin(grid) ** (d - 2)
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(grid))])
    theta = np.interp(rng.uniform(0, cdf[-1], n), cdf, grid)
    dirs = _normalise(rng.standard_normal((n, d - 1)))
    pts = np.concatenate([np.cos(theta)[:, None], np.sin(theta)[:, None] * dirs], axis=1)
    return pts @ _rotation_from_e1(c).T


def _rotation_from_e1(c: np.ndarray) -> np.ndarray:
    """An orthogonal matrix mapping ``e_1`` to ``c`` (Householder reflection)."""
    d = c.shape[0]
    e = np.zeros(d)
    e[0] = 1.0
    u = e - c
    nu = np.linalg.norm(u)
    if nu < 1e-14:
        return np.eye(d)
    u /= nu
    return np.eye(d) - 2.0 * np.outer(u, u)


def vmf_mixture(n: int, d: int, k: int = 3, kappa: float = 20.0, seed: int | None = None) -> np.ndarray:
    """``n`` points from an equal-weight mixture of ``k`` von Mises-Fisher laws with concentration
    ``kappa`` and uniformly random mean directions (``scipy.stats.vonmises_fisher``)."""
    _check(n, d)
    if k < 1 or kappa <= 0:
        raise InputError(f"need k >= 1 components and kappa > 0; got k={k}, kappa={kappa}")
    rng = np.random.default_rng(seed)
    means = uniform(k, d, seed=int(rng.integers(2**32)))
    labels = rng.integers(0, k, n)
    x = np.empty((n, d))
    for j in range(k):
        idx = np.flatnonzero(labels == j)
        if idx.size:
            x[idx] = vonmises_fisher(means[j], kappa).rvs(idx.size, random_state=rng).reshape(idx.size, d)
    return _normalise(x)


def equiangular(n: int, d: int, inner_product: float | None = None, seed: int | None = None) -> np.ndarray:
    """``n`` unit vectors with every pairwise inner product equal to ``rho = inner_product``.

    The Gram matrix ``(1 - rho) I + rho 11^T`` must be positive semidefinite with rank ``<= d``:
    ``rho = -1/(n-1)`` (the default) is the regular simplex (rank ``n - 1``), otherwise ``n <= d``.
    A random rotation (seeded) places the configuration; the inner products are exact.
    """
    _check(n, d)
    rho = -1.0 / (n - 1) if inner_product is None and n > 1 else (inner_product or 0.0)
    if n > 1 and not -1.0 / (n - 1) - 1e-12 <= rho <= 1.0:
        raise InputError(
            f"an equiangular set of {n} unit vectors needs inner product in [{-1 / (n - 1):.4g}, 1]; got {rho}"
        )
    G = (1 - rho) * np.eye(n) + rho * np.ones((n, n))
    vals, vecs = np.linalg.eigh(G)
    keep = vals > 1e-12
    if keep.sum() > d:
        raise InputError(
            f"{n} equiangular vectors with inner product {rho} need dimension {int(keep.sum())}; got d={d}"
        )
    coords = vecs[:, keep] * np.sqrt(vals[keep])
    x = np.zeros((n, d))
    x[:, : coords.shape[1]] = coords
    Qm, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    return _normalise(x @ Qm.T)


def from_file(path: str | Path, *, normalise: bool = True, tol: float = 1e-6) -> np.ndarray:
    """Tokens from a ``.npy`` or ``.csv`` file of shape ``(N, d)``.

    Rows that are not unit vectors are projected onto the sphere with a warning when
    ``normalise=True`` (refused otherwise); NaN, inf and zero rows are always refused.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"token file {str(p)!r} " + ("is not a regular file" if p.exists() else "does not exist"))
    try:
        if p.suffix == ".npy":
            x = read_npy(p)  # the header checked first: never a 2 TiB allocation, never pickles
        elif p.suffix == ".csv":
            with open_regular(p, max_bytes=MAX_ARRAY_BYTES) as fh:  # checked, then read: never a pipe or link
                x = np.loadtxt(fh, delimiter=",", ndmin=2)
        else:
            raise InputError(f"token file {str(p)!r} must end in .npy or .csv")
    except (OSError, ValueError, EOFError) as e:
        if "must end in" in str(e):
            raise
        why = " ".join(str(e).split())
        if "pickled data" in why:  # numpy's words for any .npy whose header it cannot parse
            why = "it is not a valid .npy array file"
        raise InputError(f"could not read token file {str(p)!r}: {why[:200]}") from None
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        kind = "complex numbers" if np.issubdtype(x.dtype, np.complexfloating) else f"dtype {x.dtype}"
        raise InputError(f"token file {str(p)!r} must hold real numbers; it holds {kind}")
    return check_tokens(np.asarray(x, dtype=np.float64), source=str(p), normalise=normalise, tol=tol)


def looks_transposed(x: np.ndarray, tol: float = 1e-6) -> bool:
    """Whether the columns of ``x`` (the last two axes read as ``(N, d)``) are all unit vectors: an
    array of tokens given as ``(d, N)``. Only meaningful where the rows are not unit vectors."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.all(np.abs(np.linalg.norm(np.asarray(x, dtype=np.float64), axis=-2) - 1) <= tol))


def transposed_message(source: str, shape: tuple[int, ...]) -> str:
    """The error for a transposed token array of ``shape`` (see :func:`looks_transposed`)."""
    flipped = (*shape[:-2], shape[-1], shape[-2])
    return (
        f"{source}: tokens have shape {shape}, but its columns, not its rows, are unit vectors: the array looks "
        f"transposed; pass its transpose (shape {flipped}), one token per row."
    )


def check_tokens(x: np.ndarray, *, source: str = "tokens", normalise: bool = True, tol: float = 1e-6) -> np.ndarray:
    """Validate an ``(N, d)`` token array: finite, non-zero rows, on the sphere (or normalised)."""
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 2:
        raise InputError(f"{source}: tokens must have shape (N, d) with N >= 1 and d >= 2; got {x.shape}")
    if not np.isfinite(x).all():
        bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise InputError(f"{source}: row {bad} contains NaN or inf")
    # Rows like (1e300, 1e300) overflow |x| and rows like (1e-200, 0) underflow it: measure
    # |x_i| = m_i |x_i / m_i| with m_i = max_k |x_ik|, so only a row of zeros has no direction.
    m = np.abs(x).max(axis=1)
    if (m == 0).any():
        raise InputError(f"{source}: row {int(np.flatnonzero(m == 0)[0])} is the zero vector, which has no direction")
    unit = x / m[:, None]
    scaled = np.linalg.norm(unit, axis=1)
    with np.errstate(over="ignore"):
        norms = m * scaled
    dev = float(np.abs(norms - 1).max())
    if dev > tol and looks_transposed(x, tol):  # (d, N) for (N, d): said before any projection (issue 43)
        raise InputError(transposed_message(source, x.shape))
    if dev > tol:
        if not normalise:
            raise InputError(f"{source}: tokens are not on the unit sphere (max | |x| - 1 | = {dev:.3g})")
        warnings.warn(
            f"{source}: tokens projected onto the unit sphere (max | |x| - 1 | was {dev:.3g})",
            TokenWarning,
            stacklevel=caller_stacklevel(),
        )
    plain = (m > 1e-150) & (m < 1e150)  # rows whose norm is computed directly, exactly as before
    out = unit / scaled[:, None]
    if plain.any():
        out[plain] = x[plain] / np.linalg.norm(x[plain], axis=1)[:, None]
    return out
