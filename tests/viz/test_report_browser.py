"""The report in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by selenium).

Fails when the page logs console errors, loads anything from outside the file, draws a blank
sphere, or does not change when the time slider moves. Skipped with the reason when Chromium is not
installed; CI installs it (``.ci/run``) and sets ATTNFLOW_REQUIRE_BROWSER=1, which makes its absence a failure.
"""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from PIL import Image

from attnflow.viz.report import write_report
from helpers import require_binary

selenium = pytest.importorskip("selenium", reason="selenium is part of the dev extra: pip install -e '.[dev]'")
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = pytest.mark.integration

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # WebGL on a machine without a GPU: Chromium's software renderer, opted into explicitly.
    "--enable-unsafe-swiftshader",
    "--window-size=1400,1300",
]


def _binary(*names: str) -> str:
    # skipped with the reason when Chromium is absent; a failure under CI (ATTNFLOW_REQUIRE_BROWSER=1)
    return require_binary(*names)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    opts = webdriver.ChromeOptions()
    opts.binary_location = _binary("chromium", "chromium-browser")
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: selenium never tries to download one.
    driver = webdriver.Chrome(service=Service(_binary("chromedriver")), options=opts)
    yield driver
    driver.quit()


def _wait(predicate, timeout: float = 20.0, every: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    return predicate()


def _scene_pixels(driver, element) -> np.ndarray:
    """RGB pixels of ``element``'s box in a screenshot of the window (what a user sees)."""
    img = np.asarray(Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB"))
    dpr, (left, top, right, bottom) = driver.execute_script(
        "const b = arguments[0].getBoundingClientRect(); return [window.devicePixelRatio, [b.left, b.top, b.right, b.bottom]]",
        element,
    )
    return img[int(top * dpr) : int(bottom * dpr), int(left * dpr) : int(right * dpr)]


def _chromatic(pixels: np.ndarray) -> np.ndarray:
    """Pixels that are clearly coloured (not white, grey or black): tokens, not the grid or the page."""
    p = pixels.reshape(-1, 3).astype(int)
    return p[(p.max(1) - p.min(1)) > 60]


def test_report_in_headless_chromium(browser, run_dir3, traj3):
    page = write_report(run_dir3, max_frames=20)
    browser.get(page.resolve().as_uri())
    # rendered: plotly has laid out the figure and the 3D scene has its WebGL canvas
    assert _wait(
        lambda: browser.execute_script(
            "const gd = document.getElementById('attnflow-report'); return !!(gd && gd._fullLayout && gd._fullLayout.scene)"
        )
    )
    canvas = _wait(lambda: browser.find_elements(By.CSS_SELECTOR, "#attnflow-report .gl-container canvas"))
    assert canvas, "no WebGL canvas for the sphere"
    scene = canvas[0]
    time.sleep(1.0)

    before = _scene_pixels(browser, scene)
    assert before.shape[0] > 300 and before.shape[1] > 300
    colours = np.unique(before.reshape(-1, 3), axis=0)
    tokens = _chromatic(before)
    assert len(colours) > 50, f"the sphere canvas looks blank: {len(colours)} colours"
    assert len(tokens) > 200 and len(np.unique(tokens, axis=0)) > 5, "no coloured tokens drawn"

    # drag the slider's grip to the far right: the last saved time
    grip = browser.find_element(By.CSS_SELECTOR, ".slider-grip-rect")
    rail = browser.find_element(By.CSS_SELECTOR, ".slider-rail-rect")
    ActionChains(browser).drag_and_drop_by_offset(grip, int(rail.size["width"]) + 20, 0).perform()
    active = lambda: browser.execute_script(
        "return document.getElementById('attnflow-report')._fullLayout.sliders[0].active"
    )
    n_steps = browser.execute_script("return document.getElementById('attnflow-report').layout.sliders[0].steps.length")
    assert _wait(lambda: active() == n_steps - 1), f"slider at step {active()}, expected {n_steps - 1}"
    time.sleep(1.0)
    after = _scene_pixels(browser, scene)
    changed = (np.abs(after.astype(int) - before.astype(int)).sum(-1) > 60).sum()
    assert changed > 500, f"moving the slider changed only {changed} pixels"
    title = browser.execute_script("return document.getElementById('attnflow-report')._fullLayout.title.text")
    assert f"t = {traj3.t[-1]:.4g}, clusters = {int(traj3.diagnostics['clusters'][-1])}" in title

    # Play runs the animation from the start
    browser.execute_script(
        "Plotly.animate('attnflow-report', ['0'], {mode: 'immediate', frame: {duration: 0, redraw: true}, transition: {duration: 0}})"
    )
    assert _wait(lambda: active() == 0)
    play = [b for b in browser.find_elements(By.CSS_SELECTOR, ".updatemenu-button") if "Play" in b.text][0]
    play.click()
    assert _wait(lambda: active() > 2), "the play button did not advance the slider"

    # nothing fetched from outside the file, and no errors on the console
    resources = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert resources == [], f"the page loaded external resources: {resources}"
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"console errors: {errors}"


_BOXES = """
const box = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
const all = sel => [...document.querySelectorAll('#attnflow-report ' + sel)].map(box);
return {title: all('.gtitle'), legend: all('.legend'), panels: all('.annotation-text')};
"""


def _overlap(a, b) -> float:
    """Area shared by two boxes ``[left, top, right, bottom]`` (pixels)."""
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


@pytest.mark.parametrize("width", [1400, 1000, 800])
def test_title_legend_and_panel_titles_do_not_overlap(browser, run_dir3, tmp_path, width):
    """The page's title (two lines), the legend and the panels' titles each in their own place (issue 43: the
    legend row used to run over the title's second line and the sphere's title). Seen to fail on the old
    layout: the legend shared 13,700-21,100 px^2 with a title at 1400, 1000 and 800 px."""
    page = write_report(run_dir3, tmp_path / "page.html", max_frames=5)
    browser.set_window_size(width, 1100)
    browser.get(page.resolve().as_uri())
    assert _wait(lambda: browser.execute_script("return !!document.querySelector('#attnflow-report .legend')"))
    time.sleep(0.5)
    b = browser.execute_script(_BOXES)
    assert b["title"] and b["legend"] and len(b["panels"]) >= 3, b
    for legend in b["legend"]:
        for other in b["title"] + b["panels"]:
            assert _overlap(legend, other) < 1.0, (legend, other)
    for title in b["title"]:
        for panel in b["panels"]:
            assert _overlap(title, panel) < 1.0, (title, panel)


def test_the_checks_catch_a_broken_page(browser, tmp_path):
    """The detectors above do fail: a script error is logged as SEVERE, a blank canvas has no tokens."""
    page = tmp_path / "broken.html"
    page.write_text(
        "<!DOCTYPE html><html><body><canvas id='c' width='400' height='400'></canvas>"
        "<script>undefinedFunction();</script></body></html>"
    )
    browser.get_log("browser")  # drop what earlier pages logged
    browser.get(page.as_uri())
    errors = _wait(lambda: [e for e in browser.get_log("browser") if e["level"] == "SEVERE"], timeout=5)
    assert errors and "undefinedFunction" in errors[0]["message"]
    blank = _scene_pixels(browser, browser.find_element(By.ID, "c"))
    assert len(_chromatic(blank)) == 0 and len(np.unique(blank.reshape(-1, 3), axis=0)) <= 2


PAYLOADS = (
    "<script>window.__attnflow_pwned = 1</script>",
    '<img src=x onerror="window.__attnflow_pwned = 2">',
    '<svg onload="window.__attnflow_pwned = 3"></svg>',
)


def test_no_script_planted_in_a_run_runs_in_the_browser(browser, traj3, tmp_path):
    """Issue 27: a run whose every string field carries script (the EDI paragraph printed the method
    raw) opens in Chromium without running any of it; the same payload unescaped does run."""
    import dataclasses

    payload = "".join(PAYLOADS)
    bad = dataclasses.replace(
        traj3,
        method=f"euler{payload}",
        config={**traj3.config, "name": payload, "notes": {payload: payload}},
        provenance={**traj3.provenance, "git_commit": payload, payload: payload},
        steps_info={**traj3.steps_info, "method": payload},
    )
    page = write_report(bad, tmp_path / "poisoned.html", max_frames=4)
    browser.get(page.resolve().as_uri())
    assert _wait(lambda: browser.execute_script("return !!document.getElementById('attnflow-report')._fullLayout"))
    time.sleep(1.0)
    assert browser.execute_script("return window.__attnflow_pwned === undefined")
    assert "window.__attnflow_pwned" in browser.find_element(By.TAG_NAME, "body").text  # shown as text
    # Negative control: the payload written raw into a page does run in this browser.
    raw = tmp_path / "raw.html"
    raw.write_text(f"<!DOCTYPE html><html><body><p>{PAYLOADS[1]}</p></body></html>")
    browser.get(raw.as_uri())
    assert _wait(lambda: browser.execute_script("return window.__attnflow_pwned === 2"), timeout=10)
