"""``make demo`` says what it installs before pip's quiet minutes (issue 43)."""

import re
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def _says_before_installing(recipe: str) -> list[str]:
    """The echo lines of ``recipe`` that come before its first ``pip install``."""
    said = []
    for line in recipe.splitlines():
        if "pip install" in line:
            break
        m = re.match(r"\t@echo \"(.*)\"$", line)
        if m:
            said.append(m.group(1))
    return said


def _recipe(target: str) -> str:
    text = MAKEFILE.read_text()
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n|\s*#.*\n)+)", text, re.M)
    assert m, target
    return m.group(1)


def test_setup_names_what_it_installs_before_installing():
    said = " ".join(_says_before_installing(_recipe("$(STAMP)")))
    assert "$(TORCH)" in said and "numba" in said and "transformers" in said and "GB" in said
    assert "runs/demo" in " ".join(_says_before_installing(_recipe("demo")))


def test_a_silent_recipe_is_seen():
    """Negative control: a recipe that installs first says nothing."""
    assert _says_before_installing('\t$(BIN)/pip install -q torch\n\t@echo "done"\n') == []
