"""Shared fixtures: the installed workspace, free ports, and the real pinned ComfyUI server.

Test tiers: every test is in exactly one, given by its marker.

- ``unit``: no server, no ComfyUI (in this process or a child), no network; fast (about 3 minutes in
  all on two cores). Not written on tests: :func:`pytest_collection_modifyitems` gives it to every test
  not marked with another tier, and refuses a test that asks for ``workspace`` (the installed ComfyUI)
  unmarked.
- ``integration``: needs the installed workspace: starts the real pinned ComfyUI server or a ComfyUI
  child process, imports ComfyUI, or builds from the package index.
- ``browser``: drives the graph editor of a real server in headless Chromium.
- ``gpu``: needs CUDA; skipped, with the reason, when ``torch.cuda.is_available()`` is false.

Run them with::

    .venv/bin/python -m pytest                  # everything (the README's command)
    .venv/bin/python -m pytest -m unit          # the fast tier
    .venv/bin/python -m pytest -m integration
    .venv/bin/python -m pytest -m browser
    .venv/bin/python -m pytest -m gpu

The suite runs in one process. Two pytest-xdist workers (``-n 2 --dist loadfile``) were measured on a
2-core machine: slower than one (1978 s against 1783 s), with two tests failing under the contention
(two session servers, two in-process ComfyUI imports, twice the peak disk).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runner.errors import WorkspaceError
from runner.fixtures import FixtureSet, write_fixtures
from runner.jobs.demo import DEMO_WORKFLOW, load_workflow
from runner.local.ports import pick_free_port
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import REPO_ROOT, WORKFLOWS_DIR, Workspace, find_workspace
from tests.scratch import scratch_dir

TIERS = ("unit", "integration", "browser", "gpu")
INSTALLED_COMFYUI = "workspace"  # the fixture every fixture of the installed ComfyUI depends on
NO_CUDA = "needs CUDA; torch.cuda.is_available() is False"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test without a tier `unit`; refuse one in two tiers, or unmarked but not a unit test."""
    for item in items:
        tiers = [tier for tier in TIERS if item.get_closest_marker(tier)]
        if len(tiers) > 1:
            raise pytest.UsageError(f"{item.nodeid} is in tiers {tiers}; a test is in exactly one of {TIERS}")
        if tiers:
            continue
        if INSTALLED_COMFYUI in item.fixturenames:
            raise pytest.UsageError(
                f"{item.nodeid} uses the installed ComfyUI (fixture {INSTALLED_COMFYUI!r}), so it is no unit"
                " test: mark it integration, browser or gpu"
            )
        item.add_marker(pytest.mark.unit)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a `gpu` test when there is no CUDA; torch is imported here only for such a test."""
    if item.get_closest_marker("gpu"):
        import torch

        if not torch.cuda.is_available():
            pytest.skip(NO_CUDA)


@pytest.fixture(scope="session")
def workspace() -> Workspace:
    """The installed workspace; CI must have one, elsewhere its absence skips with the reason."""
    try:
        return find_workspace()
    except WorkspaceError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no LeanVideo workspace installed ({exc})")


@pytest.fixture
def free_port() -> int:
    return pick_free_port()


@pytest.fixture
def server_config(workspace: Workspace, tmp_path: Path, free_port: int) -> ServerConfig:
    """A config for a throw-away server with its own state folder."""
    return ServerConfig(
        comfyui_dir=workspace.comfyui_dir,
        state_dir=tmp_path / "server",
        models_dir=workspace.models_dir,
        python=workspace.python,
        port=free_port,
        cpu=True,
    )


@pytest.fixture(scope="session")
def tiny_models(workspace: Workspace) -> FixtureSet:
    """The tiny random-weight models in the workspace's models folder (written once, then reused)."""
    return write_fixtures(workspace.models_dir, workspace.comfyui_dir, python=workspace.python)


@pytest.fixture
def placed(workspace: Workspace) -> Iterator[Callable[[str], Path]]:
    """``placed("diffusion_models/x.safetensors")``: a path in the workspace's models folder for a
    model file a test writes for the server to load, removed when the test ends (they were left there,
    and listed in an artist's model dropdowns)."""
    made: list[Path] = []

    def place(relative: str) -> Path:
        made.append(workspace.models_dir / relative)
        made[-1].unlink(missing_ok=True)
        return made[-1]

    yield place
    for path in made:
        path.unlink(missing_ok=True)


@pytest.fixture
def tiny_workflow() -> dict[str, Any]:
    """A fresh copy of the tiny LTXV text-to-video workflow (API format); edit it freely."""
    return load_workflow(DEMO_WORKFLOW)


@pytest.fixture(scope="session")
def comfy_server(
    workspace: Workspace, tiny_models: FixtureSet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ComfyServer]:
    """One real pinned ComfyUI shared by the integration tests of a session: our node pack, the
    fixture helper nodes and the tiny models are all loaded, and the shipped workflows' input images
    (``workflows/input/``) are in its input folder."""
    config = ServerConfig.in_workspace(workspace, tmp_path_factory.mktemp("comfy-server"), cpu=True)
    shutil.copytree(WORKFLOWS_DIR / "input", config.input_dir)
    with ComfyServer(config) as server:
        yield server


@pytest.fixture(scope="session")
def second_comfy_server(
    workspace: Workspace, tiny_models: FixtureSet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ComfyServer]:
    """A second server like ``comfy_server``, for the tests that spread jobs over two (batch)."""
    config = ServerConfig.in_workspace(workspace, tmp_path_factory.mktemp("comfy-server-2"), cpu=True)
    with ComfyServer(config) as server:
        yield server


@pytest.fixture(scope="session")
def comfy(workspace: Workspace, tiny_models: FixtureSet) -> SimpleNamespace:
    """The pinned ComfyUI's modules and our INT8 loading code, imported in this process (on the CPU
    when there is no CUDA), for tests that load models without a server."""
    if str(workspace.comfyui_dir) not in sys.path:
        sys.path.append(str(workspace.comfyui_dir))
    import comfy.cli_args
    import torch

    comfy.cli_args.args.cpu = comfy.cli_args.args.cpu or not torch.cuda.is_available()
    import comfy.lora
    import comfy.model_management
    import comfy.sd
    import comfy.utils
    from leanvideo import int8_loading, int8_ops

    return SimpleNamespace(
        mm=comfy.model_management,
        sd=comfy.sd,
        utils=comfy.utils,
        lora=comfy.lora,
        loading=int8_loading,
        ops=int8_ops,
    )


@pytest.fixture(scope="session")
def kernel_kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The kernel kit (comfy-kitchen for the GPU machine) built for this machine's Python with the CLI,
    as a user does (xz level 0, to be quick: 49 MiB in 13 s where level 1 gives 39 MiB in 21 s); needs the
    package index."""
    fast = ["--python", f"{sys.version_info.major}.{sys.version_info.minor}", "--preset", "0"]
    with scratch_dir(tmp_path_factory, "kernel-kit") as root:
        out = root / "device-kernels"
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.kernel_kit", "build", "--out", str(out), *fast],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "comfy_kitchen-" in done.stdout and "MiB of 60 MiB" in done.stdout
        yield out
