"""The one exception type of configuration problems."""

from __future__ import annotations

from attnflow.core.errors import InputError


class ConfigError(InputError):
    """A user-facing configuration problem; its message names the field and the value."""
