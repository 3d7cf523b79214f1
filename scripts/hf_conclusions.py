"""Which `attnflow hf study` conclusions hold on both corpora.

Usage: python scripts/hf_conclusions.py SHIPPED HELDOUT [--bands] [--orders]

SHIPPED, HELDOUT: a run's comparisons.json, or the run folder itself. For a folder the comparisons
are recomputed from its study.zarr with this code (`attnflow.hf.study.comparisons`, the run's seed,
2000 resamples as `hf study` defaults to): rows the run's code did not write yet (the split-half
control) appear, and every row the run did write is checked against its comparisons.json (the largest
difference is printed; the script stops when they disagree beyond 1e-12).

For every comparison (group, a, b, measure, statistic) at band "all": a - b with its 95% CI
(hierarchical when the row has draws > 1) on each corpus, and the verdict

- "holds on both": the CI excludes 0 on both corpora, with the same sign;
- "shipped only" / "held-out only": the CI excludes 0 on that corpus only;
- "opposite signs": it excludes 0 on both, with opposite signs;
- "neither": it excludes 0 on neither.

Then, per length band (tokens, special tokens included), the verdict letter for that band:
B both, S shipped only, H held-out only, X opposite signs, - neither; s or h in lower case: the
band has prompts on that corpus only (and the comparison holds there). With --bands, every band's
a - b [CI] on both corpora is printed under its comparison.

With --orders (run folders only): the distribution of the order effect over the layer orders run,
per corpus and measure (`attnflow.hf.study.order_effect`: per order, the mean over prompts of
flow - shuffled_k): quantiles, how many orders the real order beats, and the Monte Carlo rank p-value
(1 + orders at least as good as the real one) / (1 + orders) of "the real order is one more random order".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BANDS = ("2-11", "12-17", "18-23", "24+")
TOL = 1e-9  # a CI within this of 0 (the identical-layers control: 1e-17) does not exclude it


def sign(row: dict | None) -> int:
    """+1 or -1 when the row's CI excludes 0, else 0 (and 0 for a missing row)."""
    if row is None:
        return 0
    if row["lo"] > TOL:
        return 1
    if row["hi"] < -TOL:
        return -1
    return 0


def verdict(s: dict | None, h: dict | None) -> str:
    a, b = sign(s), sign(h)
    if a and b:
        return "holds on both" if a == b else "opposite signs"
    if a:
        return "shipped only"
    if b:
        return "held-out only"
    return "neither"


LETTER = {
    "holds on both": "B",
    "shipped only": "S",
    "held-out only": "H",
    "opposite signs": "X",
    "neither": "-",
}


def key(r: dict) -> tuple:
    return (r["group"], r["a"], r["b"], r["measure"], r["statistic"])


def cell(r: dict | None) -> str:
    if r is None:
        return "(missing)"
    h = "h" if r.get("draws", 1) > 1 else " "
    return f"{r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]{h} n={r['n']}"


def rows_of(path: str) -> list[dict]:
    """The comparison rows of a comparisons.json, or recomputed from a run folder's study.zarr."""
    p = Path(path)
    if not p.is_dir():
        return json.loads(p.read_text())
    from attnflow.hf.study import comparisons, load_study

    ds = load_study(p)
    rows = [r.as_dict() for r in comparisons(ds, n_boot=2000, seed=int(ds.attrs.get("seed", 0)))]
    stored = {(*key(r), r["band"]): r for r in json.loads((p / "comparisons.json").read_text())}
    worst = 0.0
    for r in rows:
        old = stored.pop((*key(r), r["band"]), None)
        if old is not None:
            worst = max(worst, *(abs(r[f] - old[f]) for f in ("diff", "lo", "hi", "mean_a", "mean_b")))
    if stored or worst > 1e-12:
        sys.exit(
            f"{path}: recomputed comparisons differ from its comparisons.json ({worst:.1e}; {len(stored)} missing)"
        )
    new = sum(1 for r in rows if r["band"] == "all") - sum(
        1 for k in json.loads((p / "comparisons.json").read_text()) if k["band"] == "all"
    )
    print(f"{path}: comparisons recomputed from study.zarr; the stored rows agree to {worst:.1e}; {new} new row(s)")
    return rows


def orders(path: str, label: str) -> None:
    """The order effect's distribution over the run's layer orders (module docstring, --orders)."""
    import numpy as np

    from attnflow.hf.study import load_study, order_effect

    ds = load_study(path)
    for m, name in (("cos", "cos"), ("spearman", "rank corr")):
        e = order_effect(ds, m)
        q = np.quantile(e, [0.025, 0.25, 0.5, 0.75, 0.975])
        beaten = int((e > 0).sum())
        p = (1 + int((e <= 0).sum())) / (1 + len(e))
        print(
            f"{label:9s} flow - shuffled_k, {name:9s} over {len(e)} orders: median {q[2]:+.3f}, quartiles "
            f"[{q[1]:+.3f}, {q[3]:+.3f}], 95% of orders [{q[0]:+.3f}, {q[4]:+.3f}], range [{e.min():+.3f}, "
            f"{e.max():+.3f}]; the real order beats {beaten} of {len(e)} (rank p = {p:.3f})"
        )


def main(shipped: str, heldout: str, bands: bool = False, with_orders: bool = False) -> None:
    S = {(*key(r), r["band"]): r for r in rows_of(shipped)}
    H = {(*key(r), r["band"]): r for r in rows_of(heldout)}
    keys = list(dict.fromkeys(k[:-1] for k in list(S) + list(H) if k[-1] == "all"))
    print(f"{'comparison':58s} {'shipped':38s} {'held-out':38s} {'draws':5s} verdict   bands " + " ".join(BANDS))
    for k in keys:
        s, h = S.get((*k, "all")), H.get((*k, "all"))
        name = f"{k[0]}: {k[1]} - {k[2] or '(alone)'}, {k[3]} ({k[4]})"
        draws = (s or h or {}).get("draws", 1)
        letters = []
        for b in BANDS:
            sb, hb = S.get((*k, b)), H.get((*k, b))
            if sb is None and hb is None:
                letters.append(".")
            elif sb is None or hb is None:
                # one corpus has no prompts in this band: the letter says where it holds there
                letters.append(("s" if sign(sb) else "-") if hb is None else ("h" if sign(hb) else "-"))
            else:
                letters.append(LETTER[verdict(sb, hb)])
        v = verdict(s, h)
        print(f"{name:58s} {cell(s):38s} {cell(h):38s} {draws:<5d} {v:14s} " + "    ".join(letters))
        if bands:
            for b in BANDS:
                sb, hb = S.get((*k, b)), H.get((*k, b))
                if sb is not None or hb is not None:
                    print(f"{'    band ' + b:58s} {cell(sb):38s} {cell(hb):38s}")
    if with_orders:
        print()
        for path, label in ((shipped, "shipped"), (heldout, "held-out")):
            if not Path(path).is_dir():
                sys.exit("--orders reads the runs' study.zarr: pass the run folders")
            orders(path, label)
    print(
        "\nbands: B both, S shipped only, H held-out only, X opposite signs, - neither;"
        " lower case s/h: the band exists on that corpus only; h after a CI: hierarchical (draws > 1)"
    )


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--bands", "--orders")]
    if len(args) != 2:
        sys.exit(__doc__)
    main(args[0], args[1], bands="--bands" in sys.argv[1:], with_orders="--orders" in sys.argv[1:])
