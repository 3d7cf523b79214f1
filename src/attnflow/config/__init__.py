"""The run config: schema and presets (:mod:`.schema`), weight files (:mod:`.validation`) and the
builders that turn a config into tokens, heads, a weight process and ``simulate``'s arguments
(:mod:`.build`). Running a config is :func:`attnflow.runs.run_config`.
"""

from __future__ import annotations

from attnflow.config.build import build, build_heads, build_process, build_tokens
from attnflow.config.errors import ConfigError
from attnflow.config.schema import (
    PRESETS,
    RunConfig,
    apply_overrides,
    format_validation_error,
    load_config,
    parse_config,
    preset_config,
)
from attnflow.config.validation import load_weight_file

__all__ = [
    "PRESETS",
    "ConfigError",
    "RunConfig",
    "apply_overrides",
    "build",
    "build_heads",
    "build_process",
    "build_tokens",
    "format_validation_error",
    "load_config",
    "load_weight_file",
    "parse_config",
    "preset_config",
]
