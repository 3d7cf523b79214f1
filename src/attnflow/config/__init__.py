"""The run config: schema and presets (:mod:`.schema`), weight files (:mod:`.validation`) and the
builders that turn a config into tokens, heads, a weight process and ``simulate``'s arguments
(:mod:`.build`). Running a config is :func:`attnflow.runs.run_config`.

Loaded on first use (PEP 562): reading and validating a config (:mod:`.schema`) imports no torch;
the builders load it when a run is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from attnflow.core.lazy import lazy_exports as _lazy_exports

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["build", "build_heads", "build_process", "build_tokens"], "attnflow.config.build"),
    "ConfigError": "attnflow.config.errors",
    **dict.fromkeys(
        [
            "PRESETS",
            "RunConfig",
            "apply_overrides",
            "format_validation_error",
            "load_config",
            "parse_config",
            "preset_config",
        ],
        "attnflow.config.schema",
    ),
    "load_weight_file": "attnflow.config.validation",
}

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


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, __all__)


if _TYPE_CHECKING:
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
