"""Documentation pages show example files inline, not as a snippet-include line (issue 31, item 12:
``docs/config.md`` showed a raw ``--8<--`` line on the repository's web view). Each inline copy is
marked ``<!-- snippet: PATH -->`` and must equal the file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"<!-- snippet: (\S+)[^>]*-->\n```\w*\n(.*?)```", re.S)


def stale_snippets(text: str) -> list[str]:
    """Paths whose inline copy differs from the file, and every raw include line."""
    bad = [m.group(1) for m in MARK.finditer(text) if (ROOT / m.group(1)).read_text() != m.group(2)]
    return bad + re.findall(r"^--8<--.*$", text, re.M)


def test_no_raw_include_lines_and_copies_match() -> None:
    pages = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    found = {str(p.relative_to(ROOT)): stale_snippets(p.read_text()) for p in pages}
    assert {k: v for k, v in found.items() if v} == {}
    assert MARK.search((ROOT / "docs" / "config.md").read_text())  # config.md shows examples/ou.yaml inline


def test_the_check_catches_an_include_line_and_a_stale_copy() -> None:
    assert stale_snippets('```yaml\n--8<-- "examples/ou.yaml"\n```\n')
    assert stale_snippets("<!-- snippet: examples/ou.yaml -->\n```yaml\nname: old\n```\n") == ["examples/ou.yaml"]
