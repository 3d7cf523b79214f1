"""Text from outside shown safely: one helper per medium, used for every value that may come from a
folder, a config or a model (see docs/robustness.md).

- :func:`html_text`: for every value written into HTML (``report.html``, the hf views, the
  reproduce report): markup and quotes escaped, control characters dropped.
- :func:`terminal_text`: for every value printed on a terminal: control characters (ESC sequences
  that clear the screen, set the window title or colour a forged line; bells; backspaces; Unicode
  direction overrides) shown escaped as ``\\x1b``, ``\\u202e``, ... instead of acting.
- :func:`plain_label`: for user text in a matplotlib label: ``$`` escaped, so a model called
  ``a$b`` is drawn as written instead of starting mathtext (which fails on unbalanced dollars).
"""

from __future__ import annotations

import html
import re

__all__ = ["html_text", "plain_label", "terminal_text"]

#: C0 and C1 control characters other than tab and newline, and the Unicode bidirectional
#: overrides and isolates (which reorder what follows them on screen).
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def terminal_text(value: object) -> str:
    """``str(value)`` with every control character shown escaped (``\\x1b[2J`` prints as text)."""
    return CONTROL.sub(_visible, str(value))


def html_text(value: object) -> str:
    """``str(value)`` safe anywhere in HTML text or a quoted attribute: ``& < > " '`` escaped and
    control characters shown escaped. The one escaping helper of every HTML page attnflow writes."""
    return html.escape(terminal_text(value), quote=True)


def plain_label(value: object) -> str:
    """``str(value)`` for a matplotlib label: ``$`` escaped (no mathtext from user text) and control
    characters shown escaped."""
    return terminal_text(value).replace("$", r"\$")
