"""Build a tiny random Hugging Face model (and a word-level tokenizer) on disk, for `attnflow hf`.

    python examples/hf_tiny_model.py models/tiny-gpt2            # GPT-2, 4 layers, 4 heads, d = 64
    python examples/hf_tiny_model.py models/tiny-llama --family llama

Nothing is downloaded: the model is built from a config with seeded random weights
(see attnflow.hf.tiny). Then:

    attnflow hf verify models/tiny-gpt2
    attnflow hf run models/tiny-gpt2 --text "the cat sat on the mat and the dog ran under the tree" --out runs/tiny-gpt2
"""

from __future__ import annotations

import argparse

from attnflow.hf.tiny import FAMILIES, save_tiny


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="folder to save the model into")
    p.add_argument("--family", default="gpt2", choices=FAMILIES)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    folder = save_tiny(a.family, a.out, seed=a.seed, tokenizer=True, hidden=a.hidden, layers=a.layers, heads=a.heads)
    print(
        f"saved a tiny {a.family} (d={a.hidden}, L={a.layers}, H={a.heads}, seed {a.seed}) with its tokenizer to {folder}"
    )


if __name__ == "__main__":
    main()
