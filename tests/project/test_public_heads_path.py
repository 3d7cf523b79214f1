"""The README, the tutorial and the examples name the heads' constructors by one public path,
``from attnflow import heads`` (issue 31, item 9), which works without the old module aliases."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "tutorial.md", *sorted((ROOT / "examples").glob("*.py"))]


def internal_paths(text: str) -> list[str]:
    """Imports of the heads' constructors by a path other than the public ``attnflow.heads``."""
    return re.findall(r"^\s*(?:from attnflow\.core(?:\.heads)? import [^\n]*|import attnflow\.core\.heads)", text, re.M)


def test_documents_use_the_public_path() -> None:
    found = {p.name: internal_paths(p.read_text()) for p in DOCS}
    assert all(not v for v in found.values()), found
    # negative control: the quickstart's old line is flagged
    assert internal_paths("from attnflow.core.heads import identity_heads\n")


def test_attnflow_heads_is_an_attribute_of_the_package() -> None:
    import attnflow

    mod = importlib.import_module("attnflow.core.heads")
    assert attnflow._SUBMODULES["heads"] == "attnflow.core.heads"  # not only an alias of the old flat layout
    assert attnflow.heads is mod and callable(attnflow.heads.identity_heads)
    assert "heads" in attnflow.__all__ and "heads" in dir(attnflow)
