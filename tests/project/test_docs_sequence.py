"""The README, ``make demo`` and the tutorial, followed in order in one folder, without one error
(issue 31, item 4: the tutorial's step 2 and the README's run used to collide with ``make demo``).

Every command of the README's first sections and of the tutorial runs as written, in document
order, in a fresh folder holding a copy of ``examples/``; the only changes are smaller sizes
(``--set integration.t_end=0.1``, ``t_end=0.2`` in the Python snippets, two small movie frames).
Not run: the set-up itself (``make setup``/``test``, ``pip``, ``source``) and ``reproduce all``
(minutes; ``tests/experiments/test_reproduce.py`` covers it).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = ("make setup", "make test", "make docs", "source ", "pip install ", "attnflow reproduce")


def _blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(bash|python)\n(.*?)```", text, re.S)]


def _demo_recipe() -> list[str]:
    """The shell lines of the Makefile's ``demo`` target, as a user's shell would run them."""
    text = (ROOT / "Makefile").read_text()
    m = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, re.M)
    assert m, "the Makefile has no demo target"
    lines = [line.strip().replace("$(BIN)/", "") for line in m.group(1).splitlines()]
    return [line for line in lines if not line.startswith("@echo ")]  # what make says, not a step


def document_steps() -> list[tuple[str, str]]:
    """``(kind, text)`` in reading order: README (up to its Documentation section), then the tutorial."""
    readme = (ROOT / "README.md").read_text()
    readme = readme[: readme.index("\n## Documentation")]
    steps: list[tuple[str, str]] = []
    for text in (readme, (ROOT / "docs" / "tutorial.md").read_text()):
        for lang, code in _blocks(text):
            if lang == "python":
                steps.append(("python", code))
                continue
            for line in code.splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                for cmd in filter(None, (c.strip() for c in line.split("&&"))):
                    if cmd == "make demo":
                        steps += [("sh", c) for c in _demo_recipe()]
                    else:
                        steps.append(("sh", cmd))
    return steps


def _smaller(argv: list[str]) -> list[str]:
    if argv[:1] == ["run"]:
        return [*argv, "--set", "integration.t_end=0.1"]
    if argv[:1] == ["movie"]:
        return [*argv, "--frames", "2", "--resolution", "160x120", "--seconds", "0"]
    return argv


def run_steps(steps: list[tuple[str, str]], where: Path) -> list[str]:
    """Run ``steps`` in ``where``; raise AssertionError at the first that fails, naming it."""
    from attnflow.cli import app

    done = []
    runner = CliRunner()
    with contextlib.chdir(where):
        for kind, text in steps:
            if kind == "python":
                code = re.sub(r"t_end=[\d.]+", "t_end=0.2", text)
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(code, "document snippet", "exec"), {"__name__": "snippet"})
            elif text.startswith(SKIPPED):
                continue
            elif text.startswith("cp "):
                src, dst = shlex.split(text)[1:]
                shutil.copy(src, dst)
            else:
                argv = shlex.split(text)
                assert argv[0] == "attnflow", f"a command the test cannot run: {text!r}"
                res = runner.invoke(app, _smaller(argv[1:]))
                assert res.exit_code == 0, f"{text!r} exited {res.exit_code}: {res.output[-1500:]}"
            done.append(text.splitlines()[0])
    return done


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return tmp_path


def test_readme_demo_and_tutorial_in_order(workdir: Path) -> None:
    steps = document_steps()
    commands = [t for k, t in steps if k == "sh"]
    assert "attnflow run --preset ou --out runs/ou" in commands  # the README's command is among them
    assert any(c.startswith("attnflow run examples/ou.yaml") for c in commands)  # the tutorial's step 2
    done = run_steps(steps, workdir)
    assert len(done) >= 12, done
    for folder in ("runs/demo", "runs/ou", "runs/my-ou", "runs/first", "runs/quick", "runs/mine"):
        assert (workdir / folder / "provenance.json").is_file(), folder


def test_the_sequence_check_catches_a_collision(workdir: Path) -> None:
    # negative control: the old documents' order (make demo into runs/ou, then the README's run
    # into runs/ou without --force) exits 2, and the runner reports it
    old = [("sh", "attnflow run --preset ou --out runs/ou --force"), ("sh", "attnflow run --preset ou --out runs/ou")]
    with pytest.raises(AssertionError, match="exited 2"):
        run_steps(old, workdir)
