"""The one exception type of configuration problems."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user-facing configuration problem; its message names the field and the value."""
