"""LeanVideo benchmark harness (``leanvideo bench MATRIX.toml``) and standalone benchmark scripts.

Modules by role, after pyperf: :mod:`benchmarks.matrix` reads the matrix file, :mod:`benchmarks.protocol`
runs one variant (warmups, repeats, cache defeat, memory check), :mod:`benchmarks.stats` summarises,
:mod:`benchmarks.store` writes the versioned result, :mod:`benchmarks.report` renders Markdown, CSV and
PNG, :mod:`benchmarks.harness` ties them together for the CLI (``runner/cli/bench.py``).
"""
