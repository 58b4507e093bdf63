"""House style is enforced by the test suite: ruff lint + format, and mypy --strict on the runner and on
the node pack's INT8 core."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, check=False
    )


def test_ruff_lint_is_clean() -> None:
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = _run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_runner_passes_mypy_strict() -> None:
    result = _run("mypy", "--no-incremental")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_int8_core_passes_mypy_strict() -> None:
    """The node pack's pure INT8 core (``leanvideo.int8``, no ComfyUI import) is typed as the runner
    is; the pack's node files subclass ComfyUI's classes, which mypy cannot see here."""
    result = subprocess.run(
        [
            sys.executable, "-m", "mypy", "--no-incremental", "--config-file", str(REPO / "pyproject.toml"),
            "--follow-imports", "silent", "-p", "leanvideo.int8",
        ],
        cwd=REPO / "custom_nodes", capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
