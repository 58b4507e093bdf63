"""Install the way artists do: ComfyUI-Manager and `comfy node install` clone the repository into
``ComfyUI/custom_nodes/`` and pip-install the ``requirements.txt`` at its root into ComfyUI's own
environment. Here: a copy of the pinned ComfyUI, this repository cloned into it, and a venv that sees
only ComfyUI's requirements (as installed here), none of LeanVideo's. Without the pack's requirements
the pack still loads and the metrics route says what to install; after the Manager's pip step it
serves the metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from benchmarks.device_image import closure, installed_distributions, make_view_venv
from runner.local.ports import pick_free_port
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import REPO_ROOT, Workspace
from tests.scratch import scratch_dir

pytestmark = pytest.mark.integration

NODES = (
    "LeanVideoDiffusionModelLoaderINT8",
    "LeanVideoCheckpointLoaderINT8",
    "LeanVideoTextEncoderLoaderINT8",
    "LeanVideoFreeVRAM",
    "LeanVideoPatchAttention",
    "LeanVideoSaveVideoLossless",
)


@pytest.fixture(scope="module")
def manager_layout(
    workspace: Workspace, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path, Path]]:
    """(ComfyUI copy, the clone in its custom_nodes, a ComfyUI-only venv's python)."""
    with scratch_dir(tmp_path_factory, "manager") as root:
        yield _manager_layout(workspace, root)


def _manager_layout(workspace: Workspace, root: Path) -> tuple[Path, Path, Path]:
    comfy = root / "ComfyUI"
    shutil.copytree(workspace.comfyui_dir, comfy, ignore=shutil.ignore_patterns("__pycache__"))
    clone = comfy / "custom_nodes" / "ComfyUI-LeanVideo"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True)
    # ComfyUI imports requests without listing it (app/frontend_management.py); users have it.
    roots = [*requirement_lines(comfy / "requirements.txt"), Requirement("requests")]
    names = closure(roots, installed_distributions())
    ours = {canonicalize_name(req.name) for req in requirement_lines(clone / "requirements.txt")}
    assert "prometheus-client" in ours and not {"prometheus-client", "leanvideo"} & names
    return comfy, clone, make_view_venv(root / "venv", names)


def requirement_lines(path: Path) -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [Requirement(line) for line in lines if line]


def serve(comfy: Path, python: Path, state: Path, before: tuple[Path, ...] = ()) -> Iterator[str]:
    """A server of ``comfy`` under ``python``, loading the node folders ``before`` first."""
    config = ServerConfig(
        comfyui_dir=comfy,
        state_dir=state,
        models_dir=state / "models",
        python=python,
        port=pick_free_port(),
        # ComfyUI's own custom_nodes/ (our servers get a --base-directory of their own, whose
        # custom_nodes/ would be searched instead): the pack is loaded from the Manager's clone there
        custom_node_dirs=(*before, comfy / "custom_nodes"),
        cpu=True,
    )
    with ComfyServer(config) as server:
        yield server.url


def check_pack_loaded(url: str) -> None:
    object_info = httpx.get(f"{url}/object_info", timeout=60).json()
    assert all(node in object_info for node in NODES), sorted(n for n in object_info if "LeanVideo" in n)
    telemetry = httpx.get(f"{url}/leanvideo/telemetry", timeout=30)
    assert telemetry.status_code == 200 and "process" in telemetry.json()


def test_the_cloned_pack_loads_without_its_requirements_and_says_what_to_install(
    manager_layout: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    comfy, _, python = manager_layout
    for url in serve(comfy, python, tmp_path / "server"):
        check_pack_loaded(url)
        metrics = httpx.get(f"{url}/leanvideo/metrics", timeout=30)
        assert metrics.status_code == 503 and "pip install prometheus-client" in metrics.text


def test_after_the_managers_pip_step_the_pack_serves_its_metrics(
    manager_layout: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    comfy, clone, python = manager_layout
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-r", str(clone / "requirements.txt")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for url in serve(comfy, python, tmp_path / "server"):
        check_pack_loaded(url)
        metrics = httpx.get(f"{url}/leanvideo/metrics", timeout=30)
        assert metrics.status_code == 200 and "leanvideo_" in metrics.text
        info = httpx.get(f"{url}/leanvideo/info", timeout=30).json()
        assert json.dumps(info) and Path(info["loaded_from"]).is_relative_to(clone)
        # the editor extension is served from the clone too (WEB_DIRECTORY of the repository's entry point)
        extensions = httpx.get(f"{url}/extensions", timeout=30).json()
        assert f"/extensions/{clone.name}/reports.js" in extensions, extensions
        # not installed as a package there: the version the clone's pyproject.toml states
        stated = tomllib.loads((clone / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
        assert info["version"] == f"{stated} (from {clone / 'pyproject.toml'})", info["version"]


def test_a_second_copy_of_the_pack_is_named_and_left_unloaded(
    manager_layout: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A Manager clone beside another copy (a second clone under another name): one copy is in use, nodes
    and routes alike, and the log names the other as not loaded."""
    comfy, clone, python = manager_layout
    second = comfy / "custom_nodes" / "leanvideo-copy"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(second)], check=True)
    try:
        for url in serve(comfy, python, tmp_path / "server"):
            check_pack_loaded(url)
            info = httpx.get(f"{url}/leanvideo/info", timeout=30).json()
        log = (tmp_path / "server" / "comfyui.log").read_text(encoding="utf-8", errors="replace")
    finally:
        shutil.rmtree(second)
    in_use = Path(info["loaded_from"])
    other = second if in_use.is_relative_to(clone) else clone
    assert in_use.is_relative_to(clone) or in_use.is_relative_to(second), in_use
    [warning] = [line for line in log.splitlines() if "a second copy of the node pack" in line]
    first = clone if in_use.is_relative_to(clone) else second
    # named as the entries of custom_nodes a user would remove, not the pack folders inside them
    assert f"a second copy of the node pack, {other}, is not loaded: {first} was loaded first" in warning


def test_a_link_to_the_pack_beside_its_clone_is_named_as_the_link(
    manager_layout: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A link in custom_nodes to the clone (as a hand install beside the Manager's): both lead to one
    folder, so the warning names the two entries themselves — the link is the one a user removes."""
    comfy, clone, python = manager_layout
    link = comfy / "custom_nodes" / "leanvideo-link"
    link.symlink_to(clone, target_is_directory=True)
    try:
        for url in serve(comfy, python, tmp_path / "server"):
            check_pack_loaded(url)
        log = (tmp_path / "server" / "comfyui.log").read_text(encoding="utf-8", errors="replace")
    finally:
        link.unlink()
    [warning] = [line for line in log.splitlines() if "a second copy of the node pack" in line]
    said = "a second copy of the node pack, {}, is not loaded: {} was loaded first"
    assert any(said.format(*pair) in warning for pair in ((link, clone), (clone, link))), warning


def test_the_runners_own_pack_before_a_managers_clone_says_where_each_comes_from(
    manager_layout: tuple[Path, Path, Path], workspace: Workspace, tmp_path: Path
) -> None:
    """`leanvideo serve` on a ComfyUI whose custom_nodes holds ComfyUI-Manager's clone loads the runner's
    pack first (``Workspace.node_dirs``): the log told the user to "remove one of the two from
    custom_nodes", where there was only one."""
    from runner.local.workspace import NODE_PACK_DIR

    comfy, clone, python = manager_layout
    mine = Workspace(root=workspace.root, comfyui_dir=comfy, python=python)
    assert mine.node_dirs() == (NODE_PACK_DIR, comfy / "custom_nodes")
    for url in serve(comfy, workspace.python, tmp_path / "server", before=(NODE_PACK_DIR,)):
        check_pack_loaded(url)
        info = httpx.get(f"{url}/leanvideo/info", timeout=30).json()
    assert Path(info["loaded_from"]).is_relative_to(NODE_PACK_DIR), info["loaded_from"]
    log = (tmp_path / "server" / "comfyui.log").read_text(encoding="utf-8", errors="replace")
    [warning] = [line for line in log.splitlines() if "a second copy of the node pack" in line]
    assert f"a second copy of the node pack, {clone}, is not loaded: {NODE_PACK_DIR / 'leanvideo'}" in warning
    assert "it comes from another custom nodes folder ComfyUI was given" in warning
    assert "remove one of the two" not in warning
