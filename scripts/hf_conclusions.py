"""Which `attnflow hf study` conclusions hold on both corpora.

Usage: python scripts/hf_conclusions.py SHIPPED/comparisons.json HELDOUT/comparisons.json [--bands]

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
"""

from __future__ import annotations

import json
import sys

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


def main(shipped: str, heldout: str, bands: bool = False) -> None:
    S = {(*key(r), r["band"]): r for r in json.load(open(shipped))}
    H = {(*key(r), r["band"]): r for r in json.load(open(heldout))}
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
    print(
        "\nbands: B both, S shipped only, H held-out only, X opposite signs, - neither;"
        " lower case s/h: the band exists on that corpus only; h after a CI: hierarchical (draws > 1)"
    )


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--bands"]
    if len(args) != 2:
        sys.exit(__doc__)
    main(args[0], args[1], bands="--bands" in sys.argv[1:])
