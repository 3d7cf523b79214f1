"""The documentation builds without a single warning (``mkdocs build --strict``), works offline
(math typeset by the KaTeX copy the site serves itself, nothing loaded from a CDN), covers every
command and every public module, and stays inside the repository."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mkdocstrings", reason="the docs extra: pip install -e '.[docs]'")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module with ``mkdocs build --strict``."""
    out = tmp_path_factory.mktemp("site") / "site"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_mkdocs_build_strict(site):
    # the API reference is generated from the docstrings
    fields = (site / "api" / "dynamics" / "index.html").read_text()
    assert "metric_speed" in fields and "harmonic mean" in fields
    # Sphinx roles in docstrings become working links (scripts/griffe_roles.py), none is left raw
    api = {p.parent.name: p.read_text() for p in (site / "api").glob("*/index.html")}
    assert not [name for name, page in api.items() if re.search(r":(func|class|mod|data|meth):", page)]
    assert 'href="../solve/#attnflow.solve.simulation.simulate"' in api["io"]  # :func:`simulate` in io
    assert 'href="#attnflow.analysis.diagnostics"' in api["analysis"]  # :mod:`.diagnostics` in the package
    assert sum(page.count("autorefs-internal") for page in api.values()) > 150
    # a link title built from a value with quotes used to break the markup (autorefs link_titles: false)
    assert not [name for name, page in api.items() if re.search(r'module-attribute\s+\(attnflow[\w.]+\)" href=', page)]
    # the gallery embeds the example files themselves
    gallery = (site / "gallery" / "index.html").read_text()
    assert "OrnsteinUhlenbeck" in gallery and "amplitude" in gallery and "trapezoid" in gallery


def test_every_cli_command_and_example_is_documented():
    from attnflow.cli.main import app

    commands = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert {"run", "show", "plot", "report", "movie"} <= commands
    for name in commands:
        assert (ROOT / "docs" / "cli" / f"{name}.md").is_file(), f"no how-to page docs/cli/{name}.md"
    gallery = (ROOT / "docs" / "gallery.md").read_text()
    for example in sorted((ROOT / "examples").iterdir()):
        if example.suffix in (".py", ".yaml"):
            assert f"examples/{example.name}" in gallery, f"{example.name} is not in the gallery"


# --- offline math -----------------------------------------------------------------------------

_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)  # http://, https://, protocol-relative //
_TAG = re.compile(r"<(script|link)\b([^>]*)>", re.I)
_ATTR = re.compile(r"""\b(src|href)\s*=\s*["']([^"']*)["']""", re.I)
_REL = re.compile(r"""\brel\s*=\s*["']([^"']*)["']""", re.I)
_CSS_URL = re.compile(r"""url\(\s*["']?([^"')]+)["']?\s*\)|@import\s+["']([^"']+)["']""", re.I)


def external_assets(html: str) -> list[str]:
    """The scripts, stylesheets, fonts and preconnects of a page that come from another host."""
    found = []
    for tag, attrs in _TAG.findall(html):
        for name, url in _ATTR.findall(attrs):
            rel = (_REL.search(attrs) or [None, ""])[1].lower()
            is_asset = tag.lower() == "script" or any(
                r in rel for r in ("stylesheet", "preload", "preconnect", "dns-prefetch", "icon", "modulepreload")
            )
            if is_asset and _EXTERNAL.match(url.strip()):
                found.append(f"<{tag} {name}={url}>")
    return found


def external_css_urls(css: str) -> list[str]:
    return [u for pair in _CSS_URL.findall(css) for u in pair if u and _EXTERNAL.match(u.strip())]


def test_site_loads_nothing_from_another_host(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 40
    bad = {str(p.relative_to(site)): external_assets(p.read_text(errors="replace")) for p in pages}
    assert not {k: v for k, v in bad.items() if v}
    css = {str(p.relative_to(site)): external_css_urls(p.read_text(errors="replace")) for p in site.rglob("*.css")}
    assert not {k: v for k, v in css.items() if v}


def test_the_offline_check_flags_a_planted_cdn(site):
    page = (site / "model" / "index.html").read_text()
    assert external_assets(page) == []
    cdn = '<script src="https://cdn.jsdelivr.net/npm/katex@0.16.0/dist/katex.min.js"></script>'
    assert external_assets(page.replace("</head>", cdn + "</head>")) == [
        "<script src=https://cdn.jsdelivr.net/npm/katex@0.16.0/dist/katex.min.js>"
    ]
    font = '<link rel="stylesheet" href="//fonts.googleapis.com/css?family=Roboto">'
    assert len(external_assets(page.replace("</head>", font + "</head>"))) == 1
    assert external_css_urls("@font-face{src:url(https://x.org/a.woff2)}") == ["https://x.org/a.woff2"]
    assert external_css_urls("@font-face{src:url(fonts/KaTeX_Main-Regular.woff2)}") == []


def test_math_is_typeset_by_the_sites_own_katex(site):
    page = (site / "model" / "index.html").read_text()
    # arithmatex leaves the TeX for the renderer; the page loads KaTeX and its stylesheet from the site
    assert page.count('class="arithmatex"') > 50
    for asset in ("assets/katex/katex.min.js", "assets/katex/contrib/auto-render.min.js", "javascripts/katex-init.js"):
        assert f'src="../{asset}"' in page, asset
        assert (site / asset).stat().st_size > 0
    assert 'href="../assets/katex/katex.min.css"' in page
    css = (site / "assets" / "katex" / "katex.min.css").read_text()
    fonts = set(re.findall(r"url\((fonts/[^)]+\.woff2)\)", css))
    assert len(fonts) == 20
    missing = [f for f in fonts if not (site / "assets" / "katex" / f).is_file()]
    assert missing == []


# --- everything inside the repository -----------------------------------------------------------


def test_no_pointer_outside_the_repository():
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")]
    files += [f for d in ("src", "examples", "scripts", "benchmarks") for f in (ROOT / d).rglob("*.py")]
    needles = ("../shared", "shared/MODEL.md", "MODEL.md")
    offenders = [f"{f.relative_to(ROOT)}: {n}" for f in files for n in needles if n in f.read_text()]
    assert [n for n in needles if n in "the contract is ../shared/MODEL.md"]  # control: a planted pointer is seen
    # the one allowed mention: the changelog saying where the old contract went
    assert [o for o in offenders if not o.startswith("CHANGELOG.md")] == []


def test_model_page_cites_the_paper():
    model = (ROOT / "docs" / "model.md").read_text()
    assert "arXiv:2605.18870" in model and "Multi-Headed Transformer Architectures" in model
    cff = (ROOT / "CITATION.cff").read_text()
    assert "cff-version: 1.2.0" in cff and "preferred-citation:" in cff and "2605.18870" in cff


# --- API reference: every public module ---------------------------------------------------------


def public_modules() -> set[str]:
    src = ROOT / "src"
    mods = set()
    for f in (src / "attnflow").rglob("*.py"):
        parts = f.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(p.startswith("_") for p in parts) and len(parts) > 1:
            mods.add(".".join(parts))
    return mods


def undocumented(modules: set[str]) -> set[str]:
    pages = "\n".join(p.read_text() for p in (ROOT / "docs" / "api").glob("*.md"))
    documented = set(re.findall(r"^::: (attnflow[\w.]*)", pages, re.M))
    return modules - documented


def test_every_public_module_has_an_api_entry():
    mods = public_modules()
    assert {"attnflow.dynamics.fields", "attnflow.core", "attnflow.cli.app"} <= mods
    assert undocumented(mods) == set()
    assert undocumented(mods | {"attnflow.dynamics.newmodule"}) == {"attnflow.dynamics.newmodule"}  # control


# --- the config reference is generated from the schema ------------------------------------------


def _config_reference():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def schema_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Dotted keys of every field, walked here independently of the generator."""
    keys = set()
    for name, info in model.model_fields.items():
        key = prefix + name
        keys.add(key)
        ann = info.annotation
        subs = [ann] if isinstance(ann, type) and issubclass(ann, BaseModel) else []
        subs += [a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)]
        for sub in subs:
            keys |= schema_keys(sub, key + ".")
    return keys


def listed_keys(page: str) -> set[str]:
    return set(re.findall(r"^\| `([\w.]+)` \|", page, re.M))


def test_config_reference_matches_the_schema():
    from attnflow.config.schema import RunConfig

    gen = _config_reference()
    committed = (ROOT / "docs" / "config-reference.md").read_text()
    assert gen.render() == committed, "docs/config-reference.md is stale: run python scripts/config_reference.py"
    keys = schema_keys(RunConfig)
    assert {"heads.path", "weights.shape", "weights.rate", "kernel.tolerance", "diagnostics.cluster_eps"} <= keys
    assert keys - listed_keys(committed) == set()

    # negative control: a schema with one more field is not what the committed page describes
    class Extended(RunConfig):
        extra_knob: int = Field(3, description="a new field")

    assert schema_keys(Extended) - listed_keys(committed) == {"extra_knob"}
    assert gen.render(Extended) != committed and "`extra_knob`" in gen.render(Extended)

    class Undescribed(RunConfig):
        mystery: int = 1

    with pytest.raises(KeyError, match="mystery"):
        gen.render(Undescribed)


def _chromium() -> str:
    from helpers import require_binary  # tests/helpers.py: skip without Chromium, fail under CI

    return require_binary("chromium", "chromium-browser")


@pytest.mark.integration
def test_math_is_typeset_in_a_browser_with_the_network_off(site, tmp_path):
    """Headless Chromium with every network request sent to a dead proxy: each math element of the
    model page is typeset by KaTeX, none is an error. Control: without the site's KaTeX, nothing is."""
    _chromium()

    def typeset(page: Path) -> tuple[int, int, int]:
        res = subprocess.run(
            [
                _chromium(),
                *("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"),
                *("--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"),
                *("--proxy-server=http://127.0.0.1:9", "--virtual-time-budget=5000", "--dump-dom"),
                page.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        dom = res.stdout
        return dom.count('class="arithmatex"'), dom.count('class="katex"'), dom.count("katex-error")

    n_math, n_katex, n_error = typeset(site / "model" / "index.html")
    assert n_math > 50 and n_katex == n_math and n_error == 0

    broken = site / "model" / "no-katex.html"
    broken.write_text((site / "model" / "index.html").read_text().replace("assets/katex/katex.min.js", "missing.js"))
    n_math, n_katex, _ = typeset(broken)
    assert n_math > 50 and n_katex == 0
