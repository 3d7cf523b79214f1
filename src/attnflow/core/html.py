"""Small HTML tables for notebooks: the ``_repr_html_`` of attnflow's result objects.

Every cell is escaped (:func:`attnflow.core.text.html_text`, the one escaping helper of attnflow's
HTML): names and values may come from a run folder, which is untrusted data. Arrays are summarised (shape, first and last value), never printed whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from attnflow.core.text import html_text

__all__ = ["html_table", "summarise"]


def summarise(value: Any) -> str:
    """A short text for ``value``: arrays as shape and end values, floats to 4 significant digits."""
    if isinstance(value, np.ndarray):
        if value.ndim == 1 and value.size and np.issubdtype(value.dtype, np.number):
            return f"{value.size} values, {summarise(value[0].item())} .. {summarise(value[-1].item())}"
        return f"array {tuple(value.shape)} {value.dtype}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def html_table(title: str, rows: Iterable[tuple[str, Any]]) -> str:
    """A two-column table (``name``, ``value``) under a bold ``title``; everything escaped."""
    body = "".join(
        f"<tr><th style='text-align:left'>{html_text(k)}</th>"
        f"<td style='text-align:left'>{html_text(summarise(v))}</td></tr>"
        for k, v in rows
    )
    return f"<div><b>{html_text(title)}</b><table>{body}</table></div>"
