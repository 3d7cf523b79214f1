"""A PDE solution on disk: a self-describing xarray dataset (Zarr, CF attributes), config, provenance,
manifest and figures, written atomically into a folder of its own."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from attnflow._version import __version__
from attnflow.core.figures import FIGURE_DPI
from attnflow.pde.solver import PDESolution

#: name -> (long_name, units, description) of every variable and coordinate of a PDE dataset.
PDE_VARIABLES: dict[str, tuple[str, str, str]] = {
    "time": ("time t", "1", "time t of the flow (dimensionless model time; saved times)"),
    "mode": ("basis function index k", "1", "index k of the orthonormal basis function Y_k (Fourier / real SH)"),
    "mode_degree": ("degree l of Y_k", "1", "degree l of basis function k (the frequency on the circle)"),
    "degree": ("degree l", "1", "spherical-harmonic degree / Fourier frequency l"),
    "theta": ("angle theta", "radian", "angle of the grid point (cos theta, sin theta) on the circle"),
    "lat": ("latitude", "degrees_north", "latitude of the Gauss-Legendre grid point on S^2"),
    "lon": ("longitude", "degrees_east", "longitude of the grid point on S^2"),
    "step": ("step index k", "1", "Runge-Kutta step k = 0..n-1, from t_k to t_{k+1}"),
    "coefficients": ("coefficient c_k(t)", "1", "rho_t = sum_k c_k(t) Y_k, Y_k orthonormal on the sphere"),
    "density": ("token density rho(t, x)", "1", "density of the token measure w.r.t. the surface measure (mass 1)"),
    "degree_power": ("degree power P_l(t)", "1", "P_l = sum over the basis functions of degree l of c_k^2"),
    "energy": ("interaction energy F", "1", "F(rho) = -1/2 sum_h w_h int int exp(x^T A_h y) rho(x) rho(y)"),
    "slope": ("metric slope |dF|", "1", "|dF|(rho) = (int rho b |g|^2)^{1/2}"),
    "metric_speed": ("metric speed |mu'|", "1", "(int rho |v|^2 / b)^{1/2} of the model's field v"),
    "mass": ("total mass", "1", "int rho (1 at t = 0; conserved)"),
    "tail_fraction": ("spectral tail share", "1", "share of sum_k c_k^2 above degree 2 lmax / 3"),
    "min_density": ("smallest density", "1", "min of rho on the quadrature grid"),
    "step_time": ("time at the end of the step", "1", "t_{k+1}"),
    "step_energy_change": ("energy change over the step", "1", "F(rho_{k+1}, t_{k+1}) - F(rho_k, t_k)"),
    "step_weight_work": ("work of the weights", "1", "F(rho_{k+1}, t_{k+1}) - F(rho_{k+1}, t_k)"),
    "step_speed_action": ("speed action", "1", "trapezoid rule of |mu'|^2 over the step"),
    "step_slope_action": ("slope action", "1", "trapezoid rule of |dF|^2 over the step"),
    "edi_residual": (
        "cumulative EDI residual",
        "1",
        "F(t) - F(0) + 1/2 int |mu'|^2 + 1/2 int |dF|^2 - int dF/dr dr (0 for the exact flow; O(dt^2))",
    ),
}


def solution_to_dataset(sol: PDESolution, attrs: dict[str, Any] | None = None) -> Any:
    """The solution as an :class:`xarray.Dataset` whose every variable carries ``long_name``, ``units``, ``description``."""
    import xarray as xr

    from attnflow.io.metadata import describe, jsonable_attr

    b = sol.basis
    T = len(sol.t)
    dens = np.stack([sol.density(i) for i in range(T)])
    if b.d == 2:
        theta = np.arctan2(b.points[:, 1].numpy(), b.points[:, 0].numpy()) % (2 * math.pi)
        grid_coords: dict[str, Any] = {"theta": theta}
        density: tuple[tuple[str, ...], np.ndarray] = (("time", "theta"), dens)
    else:
        pts = b.points.numpy()
        nlon = int(np.sum(np.isclose(pts[:, 2], pts[0, 2])))
        nlat = pts.shape[0] // nlon
        lat = np.degrees(np.arcsin(pts[::nlon, 2]))
        lon = np.degrees(np.arctan2(pts[:nlon, 1], pts[:nlon, 0])) % 360
        grid_coords = {"lat": lat, "lon": lon}
        density = (("time", "lat", "lon"), dens.reshape(T, nlat, nlon))
    data: dict[str, Any] = {
        "coefficients": (("time", "mode"), sol.coef),
        "density": density,
        "degree_power": (("time", "degree"), sol.degree_power()),
        "energy": (("time",), sol.energy),
        "slope": (("time",), sol.slope),
        "metric_speed": (("time",), sol.speed),
        "mass": (("time",), sol.mass),
        "tail_fraction": (("time",), sol.tail),
        "min_density": (("time",), sol.min_density),
    }
    if sol.model == "gf" and len(sol.steps.get("t", [])):
        for k in ("energy_change", "weight_work", "speed_action", "slope_action"):
            data[f"step_{k}"] = (("step",), sol.steps[k])
        data["step_time"] = (("step",), sol.steps["t"])
        data["edi_residual"] = (("step",), sol.edi_residual())
    coords = {
        "time": sol.t,
        "mode": np.arange(b.n_coef),
        "mode_degree": ("mode", b.degree.numpy()),
        "degree": np.arange(b.lmax + 1),
        **grid_coords,
    }
    if "step_time" in data:
        coords["step"] = np.arange(len(sol.steps["t"]))
    ds = xr.Dataset(data, coords=coords)
    describe(ds, PDE_VARIABLES)
    ds.attrs.update(
        {
            "Conventions": "CF-1.10",
            "title": "Transformer PDE: token density on the sphere",
            "source": f"attnflow {__version__} (attnflow.solve_pde)",
            "history": f"{_dt.datetime.now(_dt.UTC).isoformat(timespec='seconds')} attnflow pde",
            "model": sol.model,
            "sphere_dimension": b.d - 1,
            "lmax": b.lmax,
            "dt": sol.dt,
            **{k: jsonable_attr(v) for k, v in (attrs or {}).items()},
        }
    )
    return ds


def plot_solution(sol: PDESolution, folder: Path) -> list[Path]:
    """Figures: the density over time, the energy (and EDI residual), the degree powers (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    b = sol.basis
    fig, ax = plt.subplots(figsize=(7, 4))
    if b.d == 2:
        theta = np.arctan2(b.points[:, 1].numpy(), b.points[:, 0].numpy()) % (2 * math.pi)
        order = np.argsort(theta)
        for i in np.unique(np.linspace(0, len(sol.t) - 1, 6).round().astype(int)):
            ax.plot(theta[order], sol.density(int(i))[order], label=f"t = {sol.t[i]:.3g}")
        ax.set_xlabel(r"$\theta$")
        ax.set_ylabel(r"$\rho(t, \theta)$")
        ax.legend(fontsize=8)
    else:
        pts = b.points.numpy()
        nlon = int(np.sum(np.isclose(pts[:, 2], pts[0, 2])))
        lat = np.degrees(np.arcsin(pts[::nlon, 2]))
        lon = np.degrees(np.arctan2(pts[:nlon, 1], pts[:nlon, 0])) % 360
        order = np.argsort(lon)
        grid = sol.density(-1).reshape(len(lat), nlon)[:, order]
        mesh = ax.pcolormesh(lon[order], lat, grid, shading="nearest", cmap="viridis")
        fig.colorbar(mesh, ax=ax, label=rf"$\rho(t, x)$ at t = {sol.t[-1]:.3g}")
        ax.set_xlabel("longitude (degrees)")
        ax.set_ylabel("latitude (degrees)")
    ax.set_title(f"token density ({sol.model}, lmax = {b.lmax})")
    fig.tight_layout()
    out.append(folder / "density.png")
    fig.savefig(out[-1], dpi=FIGURE_DPI)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    # The saved times are few (13 by default): they are drawn as points, never joined by straight
    # lines; a gf run's per-step energy changes give the dense curve between them.
    if sol.model == "gf" and len(sol.steps.get("t", [])):
        dense_t = np.concatenate([[sol.t[0]], np.asarray(sol.steps["t"], dtype=float)])
        dense_f = sol.energy[0] + np.concatenate([[0.0], np.cumsum(sol.steps["energy_change"])])
        axes[0].plot(dense_t, dense_f, color="C0", lw=1.0, label="every step")
    axes[0].plot(sol.t, sol.energy, "o", color="C0", ms=4, label="saved times")
    axes[0].legend(fontsize="small")
    axes[0].set_xlabel("t")
    axes[0].set_ylabel(r"$F(\rho_t)$")
    axes[0].set_title("energy")
    if sol.model == "gf" and len(sol.steps.get("t", [])):
        axes[1].plot(sol.steps["t"], sol.edi_residual())
        axes[1].set_ylabel("cumulative EDI residual")
        axes[1].set_title(f"energy-dissipation budget (dt = {sol.dt:.3g})")
    else:
        axes[1].semilogy(sol.t, np.maximum(sol.tail, 1e-300))
        axes[1].set_ylabel("spectral tail share")
        axes[1].set_title("resolution")
    axes[1].set_xlabel("t")
    fig.tight_layout()
    out.append(folder / "energy.png")
    fig.savefig(out[-1], dpi=FIGURE_DPI)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    P = sol.degree_power()
    rel = P / P[:, :1]
    # Degrees the initial density does not contain start at exactly 0 (or rounding): left out below
    # 1e-24 of the largest so that the axis shows the resolved powers, not the float floor.
    rel = np.where(rel > 1e-24 * np.nanmax(rel[:, 1:]), rel, np.nan)
    for l in range(1, min(b.lmax, 12) + 1):
        ax.semilogy(sol.t, rel[:, l], label=f"l = {l}")
    ax.set_xlabel("t")
    ax.set_ylabel(r"$P_l(t) / P_0$ (log scale)")
    ax.set_title("power of each degree")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    out.append(folder / "degree_power.png")
    fig.savefig(out[-1], dpi=FIGURE_DPI)
    plt.close(fig)
    return out


def write_pde_folder(
    sol: PDESolution, out: str | os.PathLike, *, config_text: str, config: dict[str, Any], overwrite: bool = False
) -> Path:
    """Write ``out``/dataset.zarr, config.yaml, figures/, provenance.json and (last) manifest.json, atomically:
    ``out`` is either absent, the old folder or the complete new one. Holds ``out``'s output lock."""
    from attnflow.io.lock import output_lock
    from attnflow.io.store import atomic_folder, clean_leftovers, git_commit, write_dataset, write_manifest

    final = Path(out)
    with output_lock(final, what="PDE output folder"):
        clean_leftovers(final)
        with atomic_folder(final, overwrite=overwrite) as tmp:
            ds = solution_to_dataset(sol, {"config": config})
            write_dataset(ds, tmp / "dataset.zarr")
            (tmp / "config.yaml").write_text(config_text, encoding="utf-8")
            plot_solution(sol, tmp / "figures")
            prov = {
                "kind": "pde",
                "attnflow_version": __version__,
                "git_commit": git_commit(),
                "python": platform.python_version(),
                "host": platform.node(),
                "finished": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "complete": True,
                "mass_error": sol.mass_error,
                "edi_residual": float(sol.edi_residual()[-1]) if sol.model == "gf" and len(sol.steps["t"]) else None,
                **sol.info,
            }
            (tmp / "provenance.json").write_text(json.dumps(prov, indent=1, default=str), encoding="utf-8")
            write_manifest(tmp)  # last: it records provenance.json's digest too
    return final
