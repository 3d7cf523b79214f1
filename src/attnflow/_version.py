"""The package version (one place, read by the CLI, run folders and provenance records)."""

__version__ = "0.1.0"
