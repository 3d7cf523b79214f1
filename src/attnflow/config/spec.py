"""The typed record of a run: :class:`RunSpec`, every parameter a solve was made with.

:func:`attnflow.solve.solver.solve` stores it in the trajectory's provenance (``provenance["spec"]``),
the run folder keeps it in ``provenance.json``, and :attr:`attnflow.io.Trajectory.spec` gives it back
typed after :func:`attnflow.load`, so nothing reads a run's parameters back by string keys from an
untyped config, and a parameter given to :func:`attnflow.simulate` directly (``cluster_eps``, say)
is the one the folder reports.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from attnflow.core.errors import Hint, InputError

__all__ = ["RunSpec"]

_OPTIONAL_FLOATS = ("fast_tol", "rtol", "atol", "dt_min", "dt_max")
_STRINGS = ("model", "method", "backend", "dtype")


@dataclass(frozen=True)
class RunSpec:
    """Every parameter of a run (the arrays themselves, tokens and weights, are in the trajectory).

    ``rtol``, ``atol``, ``dt_min``, ``dt_max`` are those of adaptive runs (``None`` for fixed steps);
    ``threads``: the fixed thread count asked for (``None``: chosen from the problem size);
    ``record_steps``: whether the per-step EDI series were recorded (``None``: the default, on for ``gf``).
    """

    model: str
    method: str
    t0: float
    t_end: float
    dt: float
    save_every: int
    seed: int | None
    cluster_eps: float
    backend: str
    fast_tol: float | None
    dtype: str
    threads: int | None = None
    rtol: float | None = None
    atol: float | None = None
    dt_min: float | None = None
    dt_max: float | None = None
    record_steps: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)

    @property
    def adaptive(self) -> bool:
        """Whether the run steps with error control (its ``rtol`` is set)."""
        return self.rtol is not None

    def simulate_kwargs(self) -> dict[str, Any]:
        """The keywords of :func:`attnflow.simulate` that make this run (with the tokens and weights)."""
        out: dict[str, Any] = {
            "model": self.model, "t_end": self.t_end, "dt": self.dt, "method": self.method,
            "save_every": self.save_every, "seed": self.seed, "t0": self.t0, "cluster_eps": self.cluster_eps,
            "backend": self.backend, "fast_tol": self.fast_tol, "dtype": self.dtype, "threads": self.threads,
            "record_steps": self.record_steps,
        }  # fmt: skip
        if self.adaptive:
            out.update(rtol=self.rtol, atol=self.atol, dt_min=self.dt_min, dt_max=self.dt_max)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> RunSpec:
        """The spec a folder stored, checked field by field (a folder is data from outside): unknown
        keys are ignored, missing optional ones take their defaults, a wrong type is one sentence."""
        if not isinstance(data, dict):
            raise InputError("the run's spec is not a mapping of parameters", hint=Hint("spec"))
        out: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            v = data[f.name]
            ok: bool
            if f.name in _STRINGS:
                ok = isinstance(v, str) and len(v) <= 64 and v.isprintable()
            elif f.name in ("save_every",):
                ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
            elif f.name in ("seed", "threads"):
                ok = v is None or (isinstance(v, int) and not isinstance(v, bool))
            elif f.name == "record_steps":
                ok = v is None or isinstance(v, bool)
            elif f.name in _OPTIONAL_FLOATS:
                ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
            else:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok:
                raise InputError(f"the run's spec has an invalid {f.name}: {v!r:.80}", hint=Hint(f"spec.{f.name}"))
            out[f.name] = v
        try:
            return cls(**out)
        except TypeError:
            missing = [f.name for f in fields(cls) if f.name not in out and f.default is MISSING]
            raise InputError(f"the run's spec lacks {', '.join(missing)}", hint=Hint("spec")) from None
