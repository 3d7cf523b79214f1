"""One resolution for every figure attnflow writes (PNG files of runs, sweeps, experiments, hf, bench).

Figures of one folder at mixed resolutions (they were 130, 120, 100 and 90 dots per inch) look
mismatched side by side in a report or a paper; every ``savefig`` passes :data:`FIGURE_DPI`.
Movies set their own pixel size instead (``attnflow movie --resolution``).
"""

from __future__ import annotations

__all__ = ["FIGURE_DPI"]

#: Dots per inch of every saved figure.
FIGURE_DPI = 120
