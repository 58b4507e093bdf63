"""The architecture holds: the import contracts of pyproject.toml ([tool.importlinter]) are kept, a
forbidden import breaks them, there is no import cycle inside ``runner``, and nothing outside the tests
edits ``sys.path``. docs/architecture.md draws the layers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from runner.local.workspace import REPO_ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else dict(os.environ)
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_the_import_contracts_are_kept() -> None:
    done = lint_imports(REPO_ROOT)
    assert done.returncode == 0, done.stdout[-3000:]
    assert re.search(r"Contracts: (\d+) kept, 0 broken", done.stdout)
    assert int(re.search(r"Contracts: (\d+) kept", done.stdout)[1]) >= 4  # type: ignore[index]


@pytest.mark.parametrize(
    ("where", "line", "contract"),
    [
        (
            "runner/transport/client.py",
            "import runner.jobs.run",
            "runner.transport is not allowed to import runner.jobs",
        ),
        (
            "runner/tracking/record.py",
            "import benchmarks.stats",
            "the runner library never imports the benchmarks",
        ),
        ("leanvideo/routes.py", "import runner.errors", "the node pack never imports the runner"),
        ("leanvideo/int8/spec.py", "import comfy.ops", "leanvideo.int8.spec -> comfy"),
    ],
)
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, where: str, line: str, contract: str) -> None:
    """A copy of the tree with one forbidden import added: lint-imports fails and names it."""
    for source, target in (
        ("runner", "runner"),
        ("benchmarks", "benchmarks"),
        ("custom_nodes/leanvideo", "leanvideo"),
    ):
        shutil.copytree(REPO_ROOT / source, tmp_path / target, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path)
    with (tmp_path / where).open("a", encoding="utf-8") as handle:
        handle.write(f"\n{line}  # the violation\n")
    done = lint_imports(tmp_path, pythonpath=str(tmp_path))
    assert done.returncode == 1, done.stdout[-3000:]
    assert contract in done.stdout
    assert (
        str(tmp_path)
        in subprocess.run(
            [sys.executable, "-c", "import runner; print(runner.__file__)"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )  # the copy was what lint-imports read


def test_no_import_cycle_inside_runner() -> None:
    graph = grimp.build_graph("runner")
    modules = sorted(graph.modules)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if state.get(imported) == 1:
                return [*path, module, imported]
            if imported not in state and (found := visit(imported, [*path, module])):
                return found
        state[module] = 2
        return None

    for module in modules:
        if module not in state:
            cycle = visit(module, [])
            assert cycle is None, " -> ".join(cycle or [])


def test_nothing_outside_the_tests_edits_sys_path() -> None:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True, text=True)
    offenders = [
        name
        for name in tracked.stdout.split()
        if not name.startswith("tests/")
        and re.search(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=", (REPO_ROOT / name).read_text())
    ]
    assert offenders == []
