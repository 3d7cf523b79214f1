"""``attnflow bench``: kernel and simulation benchmarks against references measured in the same run."""

from attnflow.bench.harness import HEADER, BenchRow, markdown, run_benchmarks, table_rows

__all__ = ["HEADER", "BenchRow", "markdown", "run_benchmarks", "table_rows"]
