"""Config -> the objects of a run: initial tokens, head matrices, the weight process and the typed spec (:class:`RunInputs`).

Seeds: one ``seed`` is split with ``numpy.random.SeedSequence`` into independent streams for the
initial tokens, the head matrices and the weight noise.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow.config.errors import ConfigError
from attnflow.config.schema import ConstantWeights, OscillatingWeights, OUWeights, RunConfig
from attnflow.config.spec import RunSpec
from attnflow.config.validation import load_weight_file
from attnflow.core import heads as heads_mod
from attnflow.core import tokens as tokens_mod
from attnflow.weights.processes import Constant, Layers, OrnsteinUhlenbeck, Oscillating, WeightProcess


def _seeds(seed: int) -> tuple[int, int, int]:
    ss = np.random.SeedSequence(seed).spawn(3)
    return tuple(int(s.generate_state(1)[0]) for s in ss)  # type: ignore[return-value]


def build_tokens(cfg: RunConfig, seed: int) -> np.ndarray:
    t = cfg.tokens
    if t.init == "uniform":
        return tokens_mod.uniform(t.n, t.d, seed)
    if t.init == "cap":
        return tokens_mod.cap(t.n, t.d, t.angle, seed=seed)
    if t.init == "vmf":
        return tokens_mod.vmf_mixture(t.n, t.d, t.components, t.kappa, seed)
    if t.init == "equiangular":
        return tokens_mod.equiangular(t.n, t.d, t.inner_product, seed)
    x = tokens_mod.from_file(t.path)  # type: ignore[arg-type]
    if x.shape != (t.n, t.d):
        raise ConfigError(f"token file {t.path!r} has shape {x.shape} but the config says n={t.n}, d={t.d}")
    return x


def build_heads(cfg: RunConfig, seed: int) -> np.ndarray:
    h, d = cfg.heads, cfg.tokens.d
    if h.preset == "identity":
        return heads_mod.identity_heads(h.count, d, h.beta)
    if h.preset == "gaussian":
        return heads_mod.gaussian_heads(h.count, d, h.beta, seed)
    if h.preset == "file":
        return load_weight_file(h.path, d=d, count=h.count, model=cfg.model)[0]  # type: ignore[arg-type]
    return heads_mod.goe_heads(h.count, d, h.beta, seed)


def build_process(cfg: RunConfig, A: np.ndarray, seed: int) -> WeightProcess:
    w, value = cfg.weights, cfg.heads.value
    V = None if value == "A" else heads_mod.value_matrices(A, value)
    if cfg.heads.preset == "file":
        V_file = load_weight_file(cfg.heads.path)[1]  # type: ignore[arg-type]
        if V_file is not None and not isinstance(w, ConstantWeights):
            raise ConfigError(
                f"heads.path: the V in {cfg.heads.path!r} is only used with weights.process 'constant' (got "
                f"{w.process!r}); drop V from the file and choose heads.value instead."
            )
        V = V if V_file is None else V_file
    if isinstance(w, ConstantWeights):
        return Constant(A, V)
    if isinstance(w, OUWeights):
        A0 = A + heads_mod.goe_heads(A.shape[0], A.shape[1], w.init_spread, seed + 1)
        return OrnsteinUhlenbeck(A, w.rate, w.sigma, A0=A0, symmetric=w.symmetric, seed=seed, value=value)
    if isinstance(w, OscillatingWeights):
        H = A.shape[0]
        if w.phase == "random":
            phase = np.random.default_rng(seed).uniform(0, 2 * np.pi, H)
        else:
            phase = 0.0 if w.phase == "zero" else float(w.phase)
        if w.shape == "mean":
            C = w.amplitude * A
        else:
            C = heads_mod.goe_heads(H, A.shape[1], w.amplitude * cfg.heads.beta, seed + 1)
        return Oscillating(A, C, w.omega, phase, value=value)
    seeds = np.random.SeedSequence(seed).spawn(w.layers)
    As = [build_heads(cfg, int(s.generate_state(1)[0])) for s in seeds]
    Vs = None if value == "A" else [heads_mod.value_matrices(Al, value) for Al in As]
    return Layers(As, cfg.integration.t_end, V=Vs)


@dataclass(frozen=True)
class RunInputs:
    """What a config makes, typed: the initial tokens ``x0`` ``(N, d)``, the weight ``process``, the
    masses (``None``: uniform), the :class:`~attnflow.config.spec.RunSpec` of every parameter, and the
    config itself (JSON-ready, recorded with the run).

    It also unpacks as the triple ``x0, process, kwargs`` of earlier versions (``kwargs``: the keywords
    of :func:`attnflow.simulate`), so code written for them keeps working.
    """

    x0: np.ndarray
    process: WeightProcess
    spec: RunSpec
    token_weights: np.ndarray | None
    head_weights: np.ndarray | None
    config: dict[str, Any]

    def simulate_kwargs(self) -> dict[str, Any]:
        """Every keyword of :func:`attnflow.simulate` for this run except the tokens and the weights."""
        return {
            **self.spec.simulate_kwargs(),
            "token_weights": self.token_weights,
            "head_weights": self.head_weights,
            "config": self.config,
        }

    def __iter__(self) -> Iterator[Any]:
        return iter((self.x0, self.process, self.simulate_kwargs()))


def build(cfg: RunConfig) -> RunInputs:
    """Initial tokens, the weight process and the typed spec of the run (see :class:`RunInputs`)."""
    s_tok, s_heads, s_noise = _seeds(cfg.seed)
    x0 = build_tokens(cfg, s_tok)
    A = build_heads(cfg, s_heads)
    process = build_process(cfg, A, s_noise)
    integ = cfg.integration
    adaptive = integ.adaptive
    spec = RunSpec(
        model=cfg.model, method=integ.method, t0=0.0, t_end=integ.t_end, dt=integ.dt, save_every=integ.save_every,
        seed=s_noise, cluster_eps=cfg.diagnostics.cluster_eps, backend=cfg.kernel.backend,
        fast_tol=cfg.kernel.tolerance, dtype=cfg.dtype,
        rtol=integ.rtol if adaptive else None, atol=integ.atol if adaptive else None,
        dt_min=integ.dt_min if adaptive else None, dt_max=integ.dt_max if adaptive else None,
    )  # fmt: skip
    return RunInputs(
        x0=x0,
        process=process,
        spec=spec,
        token_weights=None if cfg.tokens.masses is None else np.asarray(cfg.tokens.masses),
        head_weights=None if cfg.heads.masses is None else np.asarray(cfg.heads.masses),
        config=cfg.model_dump(mode="json"),
    )
