"""The run config schema (pydantic), the embedded presets, parsing and ``--set`` overrides.

A config is the whole recipe of a run; ``attnflow run`` saves it verbatim beside the results.
Seeds: one ``seed`` is split with ``numpy.random.SeedSequence`` into independent streams for the
initial tokens, the head matrices and the weight noise.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args

import numpy as np
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from attnflow.config import defaults
from attnflow.config.errors import ConfigError
from attnflow.config.yamlsafe import YAMLLimitError, excerpt, load_yaml
from attnflow.core.files import read_regular
from attnflow.schemes.names import ADAPTIVE_NAMES, METHOD_NAMES

if TYPE_CHECKING:
    MethodName = str
else:  # the method names come from the stepper registry alone
    MethodName = Literal[METHOD_NAMES]


class _Strict(BaseModel):
    """Unknown fields, NaN and infinities are refused; so are ``true``/``false`` where a number belongs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                f = cls.model_fields.get(name) if isinstance(name, str) else None
                if isinstance(value, bool) and f is not None and f.annotation is not bool:
                    raise ValueError(f"'{name}' must be a number or a name, not the boolean {str(value).lower()}")
        return data


class TokensConfig(_Strict):
    n: PositiveInt = 256
    d: Annotated[int, Field(ge=2)] = 3
    init: Literal["uniform", "cap", "vmf", "equiangular", "file"] = "uniform"
    angle: Annotated[float, Field(gt=0, le=np.pi)] = np.pi / 2
    components: PositiveInt = 3
    kappa: PositiveFloat = 20.0
    inner_product: float | None = None
    path: str | None = None
    masses: list[float] | None = None

    @model_validator(mode="after")
    def _check(self) -> TokensConfig:
        if self.init == "file" and not self.path:
            raise ValueError("init 'file' needs tokens.path (a .npy or .csv file)")
        if self.masses is not None:
            if len(self.masses) != self.n:
                raise ValueError(f"tokens.masses has {len(self.masses)} entries but tokens.n = {self.n}")
            if any(m <= 0 for m in self.masses) or abs(sum(self.masses) - 1) > 1e-6:
                raise ValueError(
                    f"tokens.masses must be positive and sum to 1 (they sum to {sum(self.masses):.6g}, smallest "
                    f"{min(self.masses):.6g})"
                )
        return self


class HeadsConfig(_Strict):
    count: PositiveInt = 8
    preset: Literal["identity", "gaussian", "goe", "file"] = "identity"
    beta: float = 4.0
    path: str | None = None  # the weight file of preset 'file' (see attnflow.validation)
    value: Literal["A", "-A", "identity"] = "A"
    masses: list[float] | None = None

    @model_validator(mode="after")
    def _check(self) -> HeadsConfig:
        if self.masses is not None:
            if len(self.masses) != self.count:
                raise ValueError(f"heads.masses has {len(self.masses)} entries but heads.count = {self.count}")
            if any(m <= 0 for m in self.masses) or abs(sum(self.masses) - 1) > 1e-6:
                raise ValueError(
                    f"heads.masses must be positive and sum to 1 (they sum to {sum(self.masses):.6g}, smallest "
                    f"{min(self.masses):.6g})"
                )
        if self.preset == "file" and not self.path:
            raise ValueError("heads.preset 'file' needs heads.path (a .npy or .npz weight file)")
        return self


class ConstantWeights(_Strict):
    process: Literal["constant"] = "constant"


class OUWeights(_Strict):
    """OU around the preset heads ``Abar``; ``A0 = Abar + init_spread * GOE`` per head."""

    process: Literal["ou"] = "ou"
    rate: Annotated[float, Field(ge=0)] = 1.0
    sigma: Annotated[float, Field(ge=0)] = 1.0
    init_spread: Annotated[float, Field(ge=0)] = 2.0
    symmetric: bool = True


class OscillatingWeights(_Strict):
    """``A_h(t) = Abar_h + C_h sin(omega t + phi_h)`` with ``C_h = amplitude Abar_h`` (``shape: mean``;
    ``amplitude > 1`` makes the interaction repulsive at times) or ``C_h = amplitude beta G_h`` with
    ``G_h`` a seeded GOE matrix (``shape: goe``; the eigen-directions keep turning)."""

    process: Literal["oscillating"] = "oscillating"
    amplitude: float = 2.0
    omega: PositiveFloat = 1.0
    phase: Literal["random", "zero"] | float = "random"
    shape: Literal["mean", "goe"] = "mean"


class LayersWeights(_Strict):
    """``layers`` blocks over ``[0, t_end]``, each an independent draw of the head preset."""

    process: Literal["layers"] = "layers"
    layers: int = Field(6, ge=1, le=10_000)  # bounded: each layer is a draw of every head (i27)


WeightsConfig = Annotated[
    Union[ConstantWeights, OUWeights, OscillatingWeights, LayersWeights], Field(discriminator="process")
]


class IntegrationConfig(_Strict):
    """How the flow is integrated. Fixed steps (``euler``, ``heun``, ``rk4``, ``jko``): ``t_end`` a
    whole number of ``dt``. Adaptive steps (``bosh3``, ``dopri5``, ``dop853``): ``dt`` is the first step, the
    state is saved at ``k dt save_every`` and ``t_end``, ``rtol``/``atol`` bound the local error and
    ``dt_min``/``dt_max`` the step (``dt_max`` defaults to the save spacing, or to ``t_end - t0`` where
    ``dop853`` saves through its dense output)."""

    t_end: PositiveFloat = 10.0
    dt: PositiveFloat = 0.02
    method: MethodName = defaults.METHOD
    save_every: PositiveInt = 10
    rtol: Annotated[float, Field(gt=0, lt=1)] = defaults.RTOL
    atol: Annotated[float, Field(ge=0)] = defaults.ATOL
    dt_min: Annotated[float, Field(ge=0)] | None = None
    dt_max: PositiveFloat | None = None

    @property
    def adaptive(self) -> bool:
        return self.method in ADAPTIVE_NAMES

    @model_validator(mode="after")
    def _check(self) -> IntegrationConfig:
        if self.dt_min is not None and self.dt_max is not None and self.dt_min > self.dt_max:
            raise ValueError(f"dt_min = {self.dt_min} must not exceed dt_max = {self.dt_max}")
        if self.adaptive:
            return self
        n = round(self.t_end / self.dt)
        if n < 1 or abs(n * self.dt - self.t_end) > 1e-9 * self.t_end:
            raise ValueError(f"t_end = {self.t_end} must be a whole number of steps dt = {self.dt}")
        return self


class KernelConfig(_Strict):
    """Which attention kernel evaluates the field (:mod:`attnflow.backends`) and how exactly.

    ``backend``: ``auto`` (fused dense kernel, fast summation when ``d <= 4``, many tokens and it pays),
    ``flash``, ``stream`` or ``fast``. ``tolerance``: the fast summation's proved relative error
    (``null``: 1e-10 in float64, 1e-7 in float32).
    """

    backend: Literal["auto", "flash", "stream", "fast"] = "auto"
    tolerance: Annotated[float, Field(gt=0, lt=1)] | None = None


class DiagnosticsConfig(_Strict):
    cluster_eps: Annotated[float, Field(gt=0, lt=2)] = defaults.CLUSTER_EPS


class RunConfig(_Strict):
    """A whole run: model, tokens, heads, weight process, integration, diagnostics, seed."""

    name: str = "run"
    model: Literal["mha", "gf", "usa"] = defaults.MODEL
    seed: Annotated[int, Field(ge=0)] = 0
    dtype: Literal["float64", "float32"] = "float64"
    tokens: TokensConfig = TokensConfig()
    heads: HeadsConfig = HeadsConfig()
    weights: WeightsConfig = OUWeights()
    integration: IntegrationConfig = IntegrationConfig()
    kernel: KernelConfig = KernelConfig()
    diagnostics: DiagnosticsConfig = DiagnosticsConfig()

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.model == "gf":
            if self.heads.preset == "gaussian":
                raise ValueError(
                    "model 'gf' needs symmetric heads, but heads.preset 'gaussian' is not symmetric; "
                    "use 'identity' or 'goe', or model 'mha'"
                )
            if self.heads.value != "A":
                raise ValueError(
                    f"model 'gf' needs V = A, but heads.value is {self.heads.value!r}; use 'A' or model 'mha'"
                )
            if isinstance(self.weights, OUWeights) and not self.weights.symmetric:
                raise ValueError("model 'gf' needs symmetric OU noise (weights.symmetric: true)")
        if self.kernel.backend == "fast" and self.tokens.d > 4:
            raise ValueError(
                f"kernel.backend 'fast' (fast summation) covers d <= 4, but tokens.d = {self.tokens.d}; use 'auto'"
            )
        if (
            self.tokens.init == "equiangular"
            and self.tokens.inner_product is None
            and self.tokens.n > self.tokens.d + 1
        ):
            raise ValueError(
                f"a regular simplex of {self.tokens.n} tokens needs d >= {self.tokens.n - 1}; got d = {self.tokens.d}"
            )
        return self


PRESETS: dict[str, dict[str, Any]] = {
    "ou": {
        "name": "ou",
        "model": "gf",
        "heads": {"count": 8, "preset": "identity", "beta": 4.0},
        "weights": {"process": "ou", "rate": 1.0, "sigma": 1.0, "init_spread": 2.0},
        "integration": {"t_end": 10.0, "dt": 0.02, "method": "rk4", "save_every": 10},
    },
    "oscillating": {
        "name": "oscillating",
        "model": "gf",
        "heads": {"count": 8, "preset": "identity", "beta": 4.0},
        "weights": {"process": "oscillating", "amplitude": 2.0, "omega": 1.0, "phase": "random"},
        "integration": {"t_end": 10.0, "dt": 0.02, "method": "rk4", "save_every": 10},
    },
    "autonomous": {
        "name": "autonomous",
        "model": "gf",
        "heads": {"count": 8, "preset": "goe", "beta": 4.0},
        "weights": {"process": "constant"},
        "integration": {"t_end": 10.0, "dt": 0.02, "method": "rk4", "save_every": 10},
    },
}


#: Path entries pydantic adds for union branches (discriminator values, type names), not fields.
_BRANCH_TAGS = {"ou", "constant", "oscillating", "layers", "int", "str", "float", "bool", "constrained-int"}


def format_validation_error(err: ValidationError, source: str, *, kind: str = "config") -> str:
    """One paragraph naming every offending field and the value it had (``kind``: what was read)."""
    parts = []
    errors = err.errors()
    for e in errors[:8]:
        loc = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and (p in _BRANCH_TAGS or "[" in p)))
        where = f"field '{excerpt_text(loc, 100)}'" if loc else kind.split()[0]
        got = e.get("input")
        shown = "" if isinstance(got, dict) or e["type"] == "missing" else f" (got {excerpt(got)})"
        msg = excerpt_text(e["msg"].removeprefix("Value error, "), 300)
        hint = _did_you_mean(err.title, e["loc"]) if e["type"] == "extra_forbidden" else ""
        parts.append(f"{where}: {msg}{shown}{hint}")
    if len(errors) > 8:
        parts.append(f"and {len(errors) - 8} more")
    return f"invalid {kind} {source}: " + "; ".join(parts) + "."


def _model_fields(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold (each branch of a union, the inner type of ``Optional``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _model_fields(arg)]


def _did_you_mean(title: str, loc: tuple) -> str:
    """``", did you mean 'dt'?"`` for an unknown key ``loc[-1]`` close to a field of the section that holds it."""
    root = next((m for m in _all_models() if m.__name__ == title), None)
    if root is None or not loc or not isinstance(loc[-1], str):
        return ""
    models: list[type[BaseModel]] = [root]
    for part in loc[:-1]:
        if not isinstance(part, str):
            continue
        inner = [
            m
            for model in models
            if part in model.model_fields
            for m in _model_fields(model.model_fields[part].annotation)
        ]
        if inner:
            models = inner
        elif part not in _BRANCH_TAGS and "[" not in part:
            return ""
    names = sorted({name for m in models for name in m.model_fields})
    close = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
    return f", did you mean {close[0]!r}?" if close else ""


def _all_models() -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = list(_Strict.__subclasses__())
    while todo:
        m = todo.pop()
        found.append(m)
        todo.extend(m.__subclasses__())
    return found


def excerpt_text(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_yaml_file(p: Path, kind: str = "config file") -> Any:
    """The YAML document in file ``p``, bounded (:mod:`attnflow.config.yamlsafe`); every failure is a
    :class:`ConfigError` naming the file."""
    src = excerpt(str(p), 200)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise ConfigError(f"{kind} {src} cannot be read ({e.strerror or e}).") from None
    if size > 4 * 1_000_000:
        raise ConfigError(f"{kind} {src} is {size:,} bytes long; a {kind} is a few kB of YAML text.")
    try:
        text = read_regular(p, max_bytes=4 * 1_000_000).decode("utf-8")  # the file checked, not a pipe or link
    except UnicodeDecodeError:
        raise ConfigError(f"{kind} {src} is not a text (UTF-8) file; a {kind} is YAML text.") from None
    except OSError as e:
        raise ConfigError(f"{kind} {src} cannot be read ({e.strerror or e}).") from None
    try:
        return load_yaml(text)
    except YAMLLimitError as e:
        raise ConfigError(f"{kind} {src} is refused: {e}.") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        why = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{kind} {src} is not valid YAML: {excerpt_text(why, 200)}{at}.") from None


def parse_config(data: Any, source: str = "") -> RunConfig:
    """Validate a config mapping; raises :class:`ConfigError` with a readable message."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"invalid config {source}: the top level must be a mapping of fields, got {type(data).__name__}."
        )
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source)) from None


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a YAML config file."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {str(p)!r} does not exist.")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} is not a file (a folder or a device); give a YAML file.")
    data = read_yaml_file(p)
    return parse_config(data, f"in {str(p)!r}")


def preset_config(name: str) -> RunConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}.")
    return parse_config(copy.deepcopy(PRESETS[name]), f"preset {name!r}")


#: The weight-process classes by their ``process`` name (for switching process with ``--set``).
_PROCESSES: dict[str, type[BaseModel]] = {
    "constant": ConstantWeights,
    "ou": OUWeights,
    "oscillating": OscillatingWeights,
    "layers": LayersWeights,
}
#: Longest ``--set`` item (characters).
MAX_OVERRIDE_CHARS = 10_000


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply ``key.sub=value`` overrides (values parsed as bounded YAML) and re-validate.

    Setting ``weights.process`` to another process drops the fields the new process does not have
    (``--set weights.process=constant`` on the ``ou`` preset drops ``rate``, ``sigma``, ...).
    """
    data = cfg.model_dump(mode="json")
    for item in overrides:
        shown = excerpt(item)
        if len(item) > MAX_OVERRIDE_CHARS:
            raise ConfigError(
                f"override {shown} is {len(item):,} characters long; an override is a key and a value "
                f"(at most {MAX_OVERRIDE_CHARS:,} characters)."
            )
        if "=" not in item:
            raise ConfigError(f"override {shown} must look like key.subkey=value")
        key, raw = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                raise ConfigError(f"override {shown}: {excerpt(p)} is not a section of the config")
            node = node[p]
        try:
            value = load_yaml(raw)
        except YAMLLimitError as e:
            raise ConfigError(f"override {shown}: the value is refused: {e}.") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"override {shown}: the value is not valid YAML ({excerpt_text(e, 200)})") from None
        if parts == ["weights", "process"] and isinstance(value, str) and value != node.get("process"):
            keep = _PROCESSES.get(value)
            if keep is not None:
                for name in [n for n in node if n not in keep.model_fields]:
                    del node[name]
        node[parts[-1]] = value
    return parse_config(data, "after overrides")
