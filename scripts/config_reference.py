"""Generate ``docs/config-reference.md`` from the pydantic schema ``attnflow.config.RunConfig``.

Every field of the schema becomes one row (dotted key, type with its constraints, default,
description), walked recursively through the sections and every variant of ``weights``, so the page
cannot omit a field. A field's description is its ``Field(description=...)`` when the schema has
one, else the entry of :data:`DESCRIPTIONS` below; a field with neither is an error.

    python scripts/config_reference.py           # rewrite docs/config-reference.md
    python scripts/config_reference.py --check   # exit 1 if the committed page is stale

``tests/project/test_docs.py`` runs the check and asserts that the page lists every field.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Union

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "config-reference.md"

#: Descriptions of the fields that carry none in the schema (dotted key; ``weights.ou.rate`` for a
#: variant of the discriminated ``weights`` section).
DESCRIPTIONS: dict[str, str] = {
    "name": "Name of the run, recorded in the dataset and the provenance.",
    "model": "The dynamics: `mha` (softmax per head, any $V$), `gf` (gradient flow: symmetric $A_h$, "
    "$V_h = A_h$), `usa` (unnormalised attention, mobility 1). See [the model](model.md).",
    "seed": "One seed, split into independent streams for tokens, heads and weight noise.",
    "dtype": "Floating-point type of the simulation; float32 runs are checked against float64 (at the first save, then every 200 steps).",
    "tokens": "The initial token cloud on $S^{d-1}$.",
    "tokens.n": "Number of tokens $N$.",
    "tokens.d": "Ambient dimension $d$ (tokens live on $S^{d-1}$).",
    "tokens.init": "How the tokens are drawn: uniform on the sphere, a spherical cap, a von Mises-Fisher "
    "mixture, an equiangular set (exact Gram matrix), or read from `path`.",
    "tokens.angle": "Half-angle of the cap (`init: cap`); $\\pi/2$ is a hemisphere.",
    "tokens.components": "Number of von Mises-Fisher components (`init: vmf`).",
    "tokens.kappa": "Concentration of each von Mises-Fisher component (`init: vmf`).",
    "tokens.inner_product": "Common inner product of the equiangular set (`init: equiangular`); "
    "null: the regular simplex, $-1/(N-1)$.",
    "tokens.path": "Token file (`init: file`): `.npy` or `.csv`, shape $(N, d)$; rows off the sphere are "
    "projected with a warning, NaN or zero rows refused.",
    "tokens.masses": "Token masses $a_i$ (positive, summing to 1); null: $1/N$ each.",
    "heads": "The heads $A_h = Q_h^\\top K_h$ and $V_h$ (for time-dependent weights: their mean or draws).",
    "heads.count": "Number of heads $H$.",
    "heads.preset": "Head matrices: `identity` ($A_h = \\beta I$), `gaussian` (not symmetric), `goe` "
    "(symmetric), or `file` (read from `heads.path`).",
    "heads.beta": "Inverse temperature $\\beta$, a factor folded into $A_h$ when the preset builds them "
    "($\\beta I$, $\\beta G_h / \\sqrt{d}$, $\\beta$ times a GOE draw); not applied to `file` weights, "
    "which are used as read. `simulate_ensemble(betas=...)` multiplies a member's $A_h$, this $\\beta$ "
    "included, by a further factor.",
    "heads.path": "Weight file of `preset: file`: `.npy` holding $A$ of shape $(H, d, d)$, or `.npz` with "
    "`A` and an optional `V`; checked against `heads.count`, `tokens.d` and the model.",
    "heads.value": "Value matrices: $V_h = A_h$, $-A_h$ or $I$.",
    "heads.masses": "Head masses $w_h$ (positive, summing to 1); null: $1/H$ each.",
    "weights": "The weight process $\\Theta_t$, chosen by `process`.",
    "weights.constant.process": "Constant weights: the heads of the `heads` section at all times.",
    "weights.ou.process": "Ornstein-Uhlenbeck weights around the preset heads $\\bar A$, sampled with "
    "the exact Gaussian transition.",
    "weights.ou.rate": "Mean-reversion rate $\\lambda$.",
    "weights.ou.sigma": "Noise amplitude $\\sigma$.",
    "weights.ou.init_spread": "Initial heads $A_0 = \\bar A + \\text{init\\_spread} \\cdot \\mathrm{GOE}$ per head.",
    "weights.ou.symmetric": "Symmetric noise, so that $A_h$ stays symmetric (required by `gf`).",
    "weights.oscillating.process": "Oscillating weights $A_h(t) = \\bar A_h + C_h \\sin(\\omega t + \\varphi_h)$.",
    "weights.oscillating.amplitude": "Size of $C_h$: $C_h = \\text{amplitude}\\, \\bar A_h$ (`shape: mean`; "
    "above 1 the interaction is repulsive at times) or $\\text{amplitude}\\, \\beta\\, G_h$ (`shape: goe`).",
    "weights.oscillating.omega": "Angular frequency $\\omega$.",
    "weights.oscillating.phase": "Phases $\\varphi_h$: `random` (seeded, one per head), `zero`, or one number for all heads.",
    "weights.oscillating.shape": "`mean`: $C_h$ proportional to $\\bar A_h$; `goe`: a seeded GOE matrix "
    "(the eigen-directions keep turning).",
    "weights.layers.process": "Piecewise-constant weights: blocks over $[0, t_\\text{end}]$, as in a real network.",
    "weights.layers.layers": "Number of blocks $L$, each an independent draw of the head preset.",
    "integration": "Time stepping.",
    "integration.t_end": "Final time $T$ (depth); must be a whole number of steps `dt`.",
    "integration.dt": "Step size.",
    "integration.method": "Scheme: explicit `euler` (order 1), `heun` (2), `rk4` (4) with the retraction, "
    "or the implicit minimising movement `jko`.",
    "integration.save_every": "Save the state and the diagnostics every this many steps.",
    "integration.rtol": "Adaptive methods (`bosh3`, `dopri5`) only: relative tolerance of the local error.",
    "integration.atol": "Adaptive methods only: absolute tolerance of the local error.",
    "integration.dt_min": "Adaptive methods only: smallest step allowed (below it the run stops with the last good state).",
    "integration.dt_max": (
        "Adaptive methods only: largest step (default: the spacing of the save times; `t_end - t0` where "
        "`dop853` saves through its dense output)."
    ),
    "kernel": "How the attention sums are evaluated (see [Speed and scale](performance.md)).",
    "kernel.backend": "`auto` (fused dense kernel, fast summation when $d \\le 4$, many tokens and it pays), "
    "`flash`, `stream` or `fast`.",
    "kernel.tolerance": "Proved relative error of fast summation; null: $10^{-10}$ in float64, $10^{-7}$ in float32.",
    "diagnostics": "What is measured at every saved time.",
    "diagnostics.cluster_eps": "Two tokens are in one cluster when $1 - \\langle x_i, x_j\\rangle <$ `cluster_eps` "
    "(connected components).",
}


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _union_args(tp: Any) -> tuple[Any, ...] | None:
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        return typing.get_args(tp)
    return None


def _constraints(metadata: list[Any]) -> list[str]:
    out = []
    for m in metadata:
        for cls, attr, sym in ((at.Gt, "gt", ">"), (at.Ge, "ge", ">="), (at.Lt, "lt", "<"), (at.Le, "le", "<=")):
            if isinstance(m, cls):
                out.append(f"{sym} {_number(getattr(m, attr))}")
    return out


def _number(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _type(tp: Any) -> str:
    """A readable type: ``"a" | "b"`` for literals, ``float (> 0)`` with its constraints, ``list[float]``."""
    if typing.get_origin(tp) is typing.Annotated:
        base, *meta = typing.get_args(tp)
        cons = _constraints([m for x in meta for m in (x.metadata if isinstance(x, FieldInfo) else [x])])
        return _type(base) + (f" ({', '.join(cons)})" if cons else "")
    args = _union_args(tp)
    if args is not None:
        return " \\| ".join(_type(a) for a in args)
    if typing.get_origin(tp) is Literal:
        return " \\| ".join(f"`{a!r}`".replace("'", '"') for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) is list:
        return f"list[{_type(typing.get_args(tp)[0])}]"
    if _is_model(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


def _default(info: FieldInfo) -> str:
    if info.default is PydanticUndefined:
        return "required"
    v = info.default
    if isinstance(v, BaseModel):
        return f"`process: {v.process}`" if hasattr(v, "process") else "(section)"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    return f"`{_number(v)}`"


def rows(model: type[BaseModel], prefix: str = "", key_prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """``(dotted key, type, default, description)`` of every field of ``model``, sections first-class.

    ``key_prefix`` is the lookup prefix in :data:`DESCRIPTIONS` (it names the ``weights`` variant).
    """
    for name, info in model.model_fields.items():
        key, lookup = f"{prefix}{name}", f"{key_prefix}{name}"
        desc = info.description or DESCRIPTIONS.get(lookup)
        if desc is None:
            raise KeyError(f"config field {lookup!r} has no description (add Field(description=...) or DESCRIPTIONS)")
        ann = info.annotation
        cons = _constraints(info.metadata)
        variants = [a for a in (_union_args(ann) or ()) if _is_model(a)]
        if _is_model(ann):
            yield key, "section", "", desc
            yield from rows(ann, f"{key}.", f"{lookup}.")
        elif variants:
            yield (
                key,
                "one of: " + ", ".join(f"`process: {v.model_fields['process'].default}`" for v in variants),
                (_default(info)),
                desc,
            )
            for v in variants:
                proc = v.model_fields["process"].default
                yield from rows(v, f"{key}.", f"{lookup}.{proc}.")
        else:
            typ = _type(ann) + (f" ({', '.join(cons)})" if cons else "")
            yield key, typ, _default(info), desc


def all_keys(model: type[BaseModel]) -> set[str]:
    """Every dotted key of ``model`` (variants of a discriminated union merged), for the tests."""
    return {r[0] for r in rows(model)}


def render(model: type[BaseModel] | None = None) -> str:
    if model is None:
        from attnflow.config.schema import RunConfig

        model = RunConfig
    lines = [
        "# Configuration reference",
        "",
        "<!-- generated by scripts/config_reference.py from attnflow.config.schema.RunConfig; do not edit by hand -->",
        "",
        "Every field of a run config, generated from the pydantic schema (`attnflow.config.schema.RunConfig`),",
        "so no field can be missing. Unknown keys are errors. Keys are dotted as in `--set`",
        "(`attnflow run cfg.yaml --set heads.count=16`). The `weights` section is one of several",
        "processes, chosen by `weights.process`; the fields listed after each `process` row belong to",
        "that process. A guided tour with examples: [Configuration](config.md).",
        "",
        "| key | type | default | description |",
        "|---|---|---|---|",
    ]
    for key, typ, default, desc in rows(model):
        lines.append(f"| `{key}` | {typ} | {default} | {desc} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config-reference.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
