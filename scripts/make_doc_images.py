"""Regenerate the images under docs/img from the gallery runs (needs chromium + chromedriver).

    attnflow run examples/ou.yaml --out runs/gallery/ou
    attnflow run examples/layers_d16.yaml --out runs/gallery/layers_d16
    python scripts/make_doc_images.py runs/gallery

Writes report.png (a screenshot of the ou report in headless Chromium, slider moved to t = 0.16 T),
movie_still.png (the ou movie at t = 0.16 T), gallery_*.png (the runs' figures, the
energy-dissipation example's plot).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import imageio_ffmpeg
import numpy as np
from PIL import Image

import attnflow

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"


def report_screenshot(run: Path, out: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    page = attnflow.write_report(run, max_frames=60)
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for flag in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--enable-unsafe-swiftshader",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1080",
        f"--user-data-dir={tempfile.mkdtemp()}",
    ]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        driver.get(page.resolve().as_uri())
        time.sleep(3)
        driver.execute_script(
            "const gd = document.getElementById('attnflow-report');"
            "const s = gd.layout.sliders[0].steps; const name = s[Math.floor(s.length * 0.16)].args[0][0];"
            "Plotly.animate(gd, [name], {mode: 'immediate', frame: {duration: 0, redraw: true}, transition: {duration: 0}});"
        )
        time.sleep(3)
        driver.execute_script("window.scrollTo(0, 0)")
        png = driver.get_screenshot_as_png()
    finally:
        driver.quit()
    out.write_bytes(png)
    _shrink(out, 1000)


def movie_still(run: Path, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp4 = attnflow.render_movie(run, Path(tmp) / "m.mp4", trails=6, rotate=60, resolution=(960, 540))
        gen = imageio_ffmpeg.read_frames(str(mp4))
        meta = next(gen)
        frames = [np.frombuffer(f, np.uint8) for f in gen]
        w, h = meta["size"]
        Image.fromarray(frames[int(len(frames) * 0.16)].reshape(h, w, 3)).save(out)


def _shrink(path: Path, width: int) -> None:
    im = Image.open(path).convert("RGB")
    if im.width > width:
        im = im.resize((width, round(im.height * width / im.width)), Image.LANCZOS)
    im.save(path, optimize=True)


def main() -> None:
    runs = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/gallery")
    IMG.mkdir(parents=True, exist_ok=True)
    report_screenshot(runs / "ou", IMG / "report.png")
    movie_still(runs / "ou", IMG / "movie_still.png")
    for name, src in [
        ("gallery_ou_snapshots.png", runs / "ou" / "figures" / "snapshots.png"),
        ("gallery_ou_diagnostics.png", runs / "ou" / "figures" / "diagnostics.png"),
        ("gallery_layers_d16.png", runs / "layers_d16" / "figures" / "snapshots.png"),
    ]:
        shutil.copy(src, IMG / name)
        _shrink(IMG / name, 1000)
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "energy_dissipation.py"), str(IMG / "gallery_energy_dissipation.png")],
        check=True,
    )
    for p in sorted(IMG.glob("*.png")):
        print(f"{p.relative_to(ROOT)}  {p.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
