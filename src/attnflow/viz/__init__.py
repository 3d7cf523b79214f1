"""Figures of a run: static figures (:mod:`.plotting`), the interactive report (:mod:`.report`), the
movie (:mod:`.movie`) and what they share (:mod:`.views`). Submodules load matplotlib, plotly or
ffmpeg only when imported."""
